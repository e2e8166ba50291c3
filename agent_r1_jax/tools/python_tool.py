"""`PythonTool`: runs a model-written Python snippet in a separate, resource-limited process.

What the sandbox does:
  * runs `python -I -u snippet.py` (isolated mode: no user site-packages, PYTHON* variables ignored) in a
    fresh temporary working directory that is deleted afterwards;
  * passes a minimal environment (PATH, LANG, HOME=the temp dir), so no secrets or tokens from the
    trainer's environment are inherited; stdin is empty;
  * enforces a wall-clock timeout (the whole process group is killed), an RLIMIT_CPU CPU-time limit, an
    RLIMIT_AS address-space limit (so big allocations fail with MemoryError), RLIMIT_FSIZE (stdout/stderr
    go to files, so a flood stops at the cap and can never fill the host's memory), no core dumps, and a
    limit on open files;
  * reports stdout (and stderr when the snippet failed), each capped at `max_output_chars`.

What it does NOT protect against (it is not a security boundary): the snippet runs as the same OS user,
can read every file that user can read and write outside its temp dir, can open network connections,
can spawn processes (each gets the same rlimits, but the number of processes is not limited, and a child
that calls setsid() leaves the process group and survives the kill), and can
use every CPU core within its CPU-time budget. For untrusted code at scale run the trainer's tools inside
a container / gVisor / nsjail with no network and a read-only filesystem.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Sequence

from agent_r1_jax.tools.base import BaseTool, ToolResult


class PythonTool(BaseTool):
  """Executes Python code and returns what it printed.

  Args:
    time_limit_s: wall-clock seconds before the process group is killed (CPU limit = this + 1 s).
    memory_limit_mb: address-space limit of the process.
    max_output_chars: stdout/stderr beyond this is cut (file-size limit in bytes = 4x this, for UTF-8).
    max_workers: concurrent snippets in `batch_execute`.
    python_executable: interpreter to run (default: the current one).
  """

  name = "python"
  description = ("Run a Python 3 program and return what it prints to stdout. Use print() to show results. "
                 "No input, no network guarantees, limited time and memory.")
  parameters = {
      "type": "object",
      "properties": {"code": {"type": "string", "description": "The complete Python program to run."}},
      "required": ["code"],
  }

  def __init__(self, *, time_limit_s: float = 5.0, memory_limit_mb: int = 512, max_output_chars: int = 4096,
               max_workers: int = 4, python_executable: str | None = None, **kwargs: Any):
    kwargs.setdefault("max_argument_chars", 20000)
    # The thread-level timeout is a backstop only; the subprocess enforces `time_limit_s` itself.
    kwargs.setdefault("timeout_s", None)
    super().__init__(**kwargs)
    if time_limit_s <= 0 or memory_limit_mb <= 0 or max_output_chars <= 0 or max_workers <= 0:
      raise ValueError("python tool: time_limit_s, memory_limit_mb, max_output_chars, max_workers must be positive")
    self.time_limit_s = float(time_limit_s)
    self.memory_limit_mb = int(memory_limit_mb)
    self.max_output_chars = int(max_output_chars)
    self.max_workers = int(max_workers)
    self.python_executable = python_executable or sys.executable

  def _bootstrap(self) -> str:
    """Source of the launcher: set the rlimits, then exec the interpreter on the snippet.

    The limits are applied by the child itself (they survive `execv`) instead of a `preexec_fn`, which is
    unsafe to run between fork and exec in a multi-threaded trainer.
    """
    mem = self.memory_limit_mb * 1024 * 1024
    cpu = int(self.time_limit_s) + 1
    fsize = 4 * self.max_output_chars + 1024
    return ("import os, resource, sys\n"
            f"for lim, val in ((resource.RLIMIT_AS, {mem}), (resource.RLIMIT_CPU, {cpu}), "
            f"(resource.RLIMIT_FSIZE, {fsize}), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, 64)):\n"
            "  resource.setrlimit(lim, (val, val))\n"
            "os.execv(sys.executable, [sys.executable, '-I', '-u', sys.argv[1]])\n")

  def _read(self, path: str) -> tuple[str, bool]:
    """Returns (text, was_cut) for an output file, capped at max_output_chars."""
    with open(path, "rb") as f:
      data = f.read(4 * self.max_output_chars + 2048)
    text = data.decode("utf-8", errors="replace")
    cut = len(text) > self.max_output_chars or len(data) >= 4 * self.max_output_chars + 1024
    return text[:self.max_output_chars], cut

  def execute(self, args: dict[str, Any]) -> ToolResult:
    with tempfile.TemporaryDirectory(prefix="agent_r1_python_") as workdir:
      script = os.path.join(workdir, "snippet.py")
      with open(script, "w", encoding="utf-8") as f:
        f.write(args["code"])
      out_path, err_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
      env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "PYTHONIOENCODING": "utf-8"}
      with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [self.python_executable, "-I", "-c", self._bootstrap(), script], cwd=workdir, env=env,
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True, close_fds=True)
        timed_out = False
        try:
          proc.wait(timeout=self.time_limit_s)
        except subprocess.TimeoutExpired:
          timed_out = True
          os.killpg(proc.pid, signal.SIGKILL)
          proc.wait()
        else:
          # The snippet may have left children in its process group; they die with it.
          try:
            os.killpg(proc.pid, signal.SIGKILL)
          except ProcessLookupError:
            pass
      stdout, out_cut = self._read(out_path)
      stderr, err_cut = self._read(err_path)
    code = proc.returncode
    notes = []
    if timed_out:
      notes.append(f"Error: the program was stopped after the {self.time_limit_s:g} s time limit.")
    elif code == -signal.SIGXCPU or code == -signal.SIGKILL:
      notes.append("Error: the program was stopped for exceeding its CPU-time limit.")
    elif code == -signal.SIGXFSZ or out_cut or err_cut:
      notes.append(f"Error: the output exceeded {self.max_output_chars} characters and was cut.")
    if not timed_out and code != 0 and not notes:
      notes.append(f"Error: the program exited with status {code}.")
    if "MemoryError" in stderr and not timed_out:
      notes.append(f"Error: the program ran out of memory (limit {self.memory_limit_mb} MB).")
    success = code == 0 and not timed_out and not out_cut and not err_cut
    parts = [stdout] if stdout else []
    if stderr and not success:
      parts.append("stderr:\n" + stderr)
    parts.extend(notes)
    return ToolResult("\n".join(parts) if parts else "(no output)", success)

  def batch_execute(self, args_list: Sequence[dict[str, Any]]) -> list[ToolResult]:
    if len(args_list) <= 1:
      return [self.execute(a) for a in args_list]
    with concurrent.futures.ThreadPoolExecutor(min(self.max_workers, len(args_list))) as pool:
      return list(pool.map(self.execute, args_list))
