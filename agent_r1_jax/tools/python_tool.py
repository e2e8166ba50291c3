"""`PythonTool`: runs a model-written Python snippet in a sandbox and returns what it printed.

`isolation="namespaces"` (the default) runs each snippet in fresh Linux namespaces (`tools/sandbox.py`): no
network, no host file but the Python runtime (read-only), an empty size-limited tmpfs as its only writable
place, its own PID namespace (nothing it starts outlives the call, `setsid()` or not), no capabilities, a
seccomp filter (no nested namespaces, no mounts), its own cgroup (one memory, process and CPU budget for all its
processes), and rlimits per process; its environment holds PATH, LANG and HOME only. The tool refuses to start
where the host cannot build the namespaces, or lacks a guarantee the config does not accept (`SandboxUnavailable`,
saying which and how to fix it). `isolation="none"` runs snippets as plain child processes of the trainer (same rlimits, minimal
environment, a temp dir, the process group killed at the end): they can read the trainer user's files and reach
the network, so it is logged loudly and meant for hosts without namespaces that run trusted policies only.

Every outcome is an observation: the program's stdout (and stderr when it failed), each capped at
`max_output_chars`, plus one line for a timeout, the CPU limit, cut output, a non-zero exit, a MemoryError or
processes the OOM killer stopped at the snippet's memory budget.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any, Sequence

from agent_r1_jax.tools import sandbox
from agent_r1_jax.tools.base import BaseTool, ToolResult

ISOLATION_MODES = ("namespaces", "none")


class PythonTool(BaseTool):
  """Executes Python code and returns what it printed.

  Args:
    time_limit_s: wall-clock seconds before the snippet is killed (CPU limit = this + 1 s).
    memory_limit_mb: address-space limit of the process.
    max_output_chars: stdout/stderr beyond this is cut (file-size limit in bytes = 4x this, for UTF-8).
    max_workers: concurrent snippets in `batch_execute`.
    python_executable: interpreter to run (default: the current one).
    isolation: "namespaces" (a sandbox per snippet, see the module docstring) or "none" (unsafe).
    disk_limit_mb: size of the sandbox's writable tmpfs.
    max_processes: processes (and threads) the snippet may have at once, all of them together.
    cpus: CPU cores of bandwidth for the whole snippet (its cgroup's CFS quota).
    cgroup_parent: where snippet cgroups are made, relative to each cgroup hierarchy's root (default: under the
      trainer's own cgroup); an unprivileged user names a cgroup delegated to it here.
    accept_missing: guarantees (`sandbox.GUARANTEES`: "cgroup", "seccomp") the tool may run without where the host
      cannot give them; any other missing guarantee makes the tool refuse to start, saying which and why.
  """

  name = "python"
  description = ("Run a Python 3 program and return what it prints to stdout. Use print() to show results. "
                 "No input, no network, limited time, memory and disk.")
  parameters = {
      "type": "object",
      "properties": {"code": {"type": "string", "description": "The complete Python program to run."}},
      "required": ["code"],
  }

  def __init__(self, *, time_limit_s: float = 5.0, memory_limit_mb: int = 512, max_output_chars: int = 4096,
               max_workers: int = 4, python_executable: str | None = None, isolation: str = "namespaces",
               disk_limit_mb: int = 16, max_processes: int = 32, cpus: float = 1.0, cgroup_parent: str = "",
               accept_missing: Sequence[str] | str = (), **kwargs: Any):
    kwargs.setdefault("max_argument_chars", 20000)
    # The thread-level timeout is a backstop only; the subprocess enforces `time_limit_s` itself.
    kwargs.setdefault("timeout_s", None)
    super().__init__(**kwargs)
    if min(time_limit_s, memory_limit_mb, max_output_chars, max_workers, disk_limit_mb, max_processes, cpus) <= 0:
      raise ValueError("python tool: time_limit_s, memory_limit_mb, max_output_chars, max_workers, disk_limit_mb, "
                       "max_processes and cpus must be positive")
    if isolation not in ISOLATION_MODES:
      raise ValueError(f"python tool: isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
    self.time_limit_s = float(time_limit_s)
    self.memory_limit_mb = int(memory_limit_mb)
    self.max_output_chars = int(max_output_chars)
    self.max_workers = int(max_workers)
    self.python_executable = python_executable or sys.executable
    self.isolation = isolation
    self.limits = sandbox.Limits(memory_mb=self.memory_limit_mb, cpu_s=int(self.time_limit_s) + 1,
                                 file_size_bytes=4 * self.max_output_chars + 1024, disk_mb=int(disk_limit_mb),
                                 processes=int(max_processes), cpus=float(cpus))
    if isinstance(accept_missing, str):
      accept_missing = [name.strip() for name in accept_missing.split(",") if name.strip()]
    self.sandbox_isolation = None
    if isolation == "namespaces":
      self.sandbox_isolation = sandbox.check_available(self.python_executable, cgroup_parent or None,
                                                       tuple(sorted(accept_missing)))
      for name, why in self.sandbox_isolation.missing.items():
        logging.warning("python tool: running without a guarantee (tool.python.accept_missing): %s",
                        sandbox.describe_missing(name, why))
    else:
      logging.warning("UNSAFE: the python tool runs model-written code WITHOUT isolation (tool.python.isolation="
                      "'none'): snippets can read this user's files, write outside their temp dir, reach the "
                      "network and leave processes behind")

  def _read(self, path: str) -> tuple[str, bool]:
    """Returns (text, was_cut) for an output file, capped at max_output_chars."""
    with open(path, "rb") as f:
      data = f.read(4 * self.max_output_chars + 2048)
    text = data.decode("utf-8", errors="replace")
    cut = len(text) > self.max_output_chars or len(data) >= 4 * self.max_output_chars + 1024
    return text[:self.max_output_chars], cut

  def _run(self, code: str, workdir: str, out, err) -> sandbox.Outcome:
    """Runs `code`; nothing it started is left running."""
    if self.isolation == "namespaces":
      stage = os.path.join(workdir, "stage")
      os.mkdir(stage)
      return sandbox.run_isolated(code, stage, self.limits, timeout_s=self.time_limit_s, stdout=out, stderr=err,
                                  python=self.python_executable, isolation=self.sandbox_isolation)
    script = os.path.join(workdir, "snippet.py")
    with open(script, "w", encoding="utf-8") as f:
      f.write(code)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.Popen([self.python_executable, "-I", "-u", "-c", sandbox.bootstrap(self.limits), script],
                            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            start_new_session=True, close_fds=True)
    return sandbox.Outcome(*sandbox.wait_and_kill(proc, self.time_limit_s))

  def execute(self, args: dict[str, Any]) -> ToolResult:
    with tempfile.TemporaryDirectory(prefix="agent_r1_python_") as workdir:
      out_path, err_path = os.path.join(workdir, ".stdout"), os.path.join(workdir, ".stderr")
      with open(out_path, "wb") as out, open(err_path, "wb") as err:
        code, timed_out, oom_kills, _ = self._run(args["code"], workdir, out, err)
      stdout, out_cut = self._read(out_path)
      stderr, err_cut = self._read(err_path)
    notes = []
    out_of_memory = oom_kills > 0 or ("MemoryError" in stderr and not timed_out)
    if timed_out:
      notes.append(f"Error: the program was stopped after the {self.time_limit_s:g} s time limit.")
    elif oom_kills:
      notes.append(f"Error: {oom_kills} of the program's processes were stopped: together they exceeded its memory "
                   f"limit ({self.memory_limit_mb} MB + {self.limits.disk_mb} MB of files).")
    elif code in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
      notes.append("Error: the program was stopped for exceeding its CPU-time limit.")
    elif code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ) or out_cut or err_cut:
      notes.append(f"Error: the output exceeded {self.max_output_chars} characters and was cut.")
    if not timed_out and code != 0 and not notes:
      notes.append(f"Error: the program exited with status {code}.")
    if out_of_memory and not oom_kills:
      notes.append(f"Error: the program ran out of memory (limit {self.memory_limit_mb} MB).")
    success = code == 0 and not timed_out and not out_cut and not err_cut and not oom_kills
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

