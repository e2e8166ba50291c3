"""Attacks on the python tool's sandbox (`tools/sandbox.py`): each must fail and leave the host unchanged.

Every attack runs twice: as root (the tool as CI runs it) and as an unprivileged user in a user namespace (see
`sandbox_harness`). A half that cannot run here is skipped with its reason. The attacks on the snippet-wide
bounds (memory, processes, nested namespaces) are in test_sandbox_bounds.py.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import pytest

from agent_r1_jax.tools import PythonTool, sandbox
from sandbox_harness import LIMITS, SECRET_ENV, TIMEOUT_S, run  # noqa: F401 (run: a fixture)

@pytest.fixture
def host_file():
  """A world-readable file outside any sandbox, in a world-traversable directory."""
  folder = pathlib.Path(tempfile.mkdtemp(prefix="agent_r1_host_"))
  folder.chmod(0o755)
  path = folder / "secret.txt"
  path.write_text("host secret " + uuid.uuid4().hex)
  path.chmod(0o644)
  yield path
  shutil.rmtree(folder)


def _processes_with(marker: str) -> list[int]:
  """Host PIDs whose command line contains `marker`."""
  found = []
  for entry in pathlib.Path("/proc").iterdir():
    if entry.name.isdigit():
      try:
        if marker.encode() in (entry / "cmdline").read_bytes():
          found.append(int(entry.name))
      except OSError:
        pass
  return found


def test_reading_a_host_file_fails(run, host_file):
  before = host_file.read_text()
  out = run(f"try:\n  print(open({str(host_file)!r}).read())\n"
            f"except OSError as e:\n  print('refused', type(e).__name__)")
  assert before not in out["stdout"] and "refused FileNotFoundError" in out["stdout"]
  # The host's own files are absent, not only unreadable: / holds the runtime's folders, /etc the loader cache.
  out = run("import os, sys\nprint(sorted(os.listdir('/')))\nprint(os.listdir('/etc'), sorted(os.listdir('/tmp')))\n"
            "print(os.path.exists('/etc/passwd'), os.path.exists('/etc/shadow'), os.path.exists('/home'))\n"
            "print(os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix))")
  top, etc_tmp, exists, prefixes = out["stdout"].splitlines()
  # The sandbox binds the runtime of the interpreter that started it (this one as root; the system Python for
  # the throwaway user), at the same paths, so the snippet's own prefixes name it.
  runtime_paths = [pathlib.PurePosixPath(p) for p in prefixes.split()]
  runtime = {p.parts[1] for p in runtime_paths}
  assert set(eval(top)) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sandbox", "sbin",
                            "tmp", "usr"} | runtime  # noqa: S307 (a list of names the test printed)
  # The sandbox's /tmp is its own: empty but for the mount points of a runtime that lives under the host's /tmp
  # (a venv made there), whatever else the host's /tmp holds.
  in_tmp = sorted({p.parts[2] for p in runtime_paths if p.parts[1] == "tmp" and len(p.parts) > 2})
  assert etc_tmp == f"['ld.so.cache'] {in_tmp}" and exists == "False False False"
  assert host_file.read_text() == before


def test_writing_outside_the_sandbox_fails(run, host_file):
  target = host_file.parent / "written_by_snippet.txt"
  code = textwrap.dedent(f"""
      import sys
      for path in ({str(target)!r}, '/usr/agent_r1_pwned', sys.prefix + '/agent_r1_pwned', '/agent_r1_pwned'):
        try:
          open(path, 'w').write('pwned')
          print('WROTE', path)
        except OSError as e:
          print('refused', path, type(e).__name__)
      open('inside.txt', 'w').write('fine')
      print('inside ok')
  """)
  out = run(code)
  assert "WROTE" not in out["stdout"] and out["stdout"].count("refused") == 4 and "inside ok" in out["stdout"]
  assert not target.exists() and not pathlib.Path("/usr/agent_r1_pwned").exists()
  assert not pathlib.Path(sys.prefix, "agent_r1_pwned").exists()


def test_connecting_to_a_host_tcp_server_fails(run):
  server = socket.create_server(("127.0.0.1", 0))
  server.settimeout(0.5)
  port = server.getsockname()[1]
  accepted = []

  def accept_for(seconds: float):
    deadline = time.time() + seconds
    while time.time() < deadline:
      try:
        accepted.append(server.accept()[0])
      except OSError:
        pass

  thread = threading.Thread(target=accept_for, args=(TIMEOUT_S + 2,))
  thread.start()
  code = (f"import socket\ntry:\n  socket.create_connection(('127.0.0.1', {port}), timeout=3)\n  print('CONNECTED')\n"
          f"except OSError as e:\n  print('refused', e.errno)")
  out = run(code)
  thread.join()
  server.close()
  assert "CONNECTED" not in out["stdout"] and "refused" in out["stdout"] and not accepted


def test_resolving_a_host_name_fails(run):
  code = textwrap.dedent("""
      import socket
      for name in ('localhost', 'pypi.org'):
        try:
          print('RESOLVED', name, socket.getaddrinfo(name, 80)[0][4])
        except OSError as e:
          print('refused', name, type(e).__name__)
  """)
  out = run(code)
  assert "RESOLVED" not in out["stdout"] and out["stdout"].count("refused") == 2


def test_a_fork_bomb_is_bounded_and_leaves_nothing(run):
  marker = "agent_r1_bomb_" + uuid.uuid4().hex
  code = textwrap.dedent(f"""
      import os, sys, time
      refused = 0
      for _ in range(200):
        try:
          if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])
        except OSError:
          refused += 1
      print('refused forks', refused, flush=True)
      time.sleep(60)
  """)
  out = run(code)
  assert out["timed_out"]
  refused = int(out["stdout"].split("refused forks")[1].split()[0])
  assert refused >= 200 - LIMITS.processes  # at most `processes` ever ran at once
  time.sleep(0.5)
  assert _processes_with(marker) == []


def test_a_setsid_child_does_not_outlive_the_call(run):
  marker = "agent_r1_escape_" + uuid.uuid4().hex
  code = textwrap.dedent(f"""
      import os, sys
      if os.fork() == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])
      print('parent exits at once')
  """)
  out = run(code)
  assert "parent exits at once" in out["stdout"] and not out["timed_out"]
  time.sleep(0.5)
  assert _processes_with(marker) == []
  # The same child when the parent itself runs past the time limit.
  out = run(code.replace("print('parent exits at once')", "import time; time.sleep(60)"))
  assert out["timed_out"]
  time.sleep(0.5)
  assert _processes_with(marker) == []


def test_allocating_beyond_the_memory_limit_fails(run):
  out = run("x = bytearray(1024 * 1024 * 1024)\nprint('ALLOCATED')")
  assert "ALLOCATED" not in out["stdout"] and "MemoryError" in out["stderr"]


def test_filling_the_disk_stops_at_the_limits_and_the_host_disk_is_untouched(run):
  code = textwrap.dedent("""
      import errno, os
      chunk = b'x' * (1 << 20)
      try:
        with open('big.bin', 'wb') as f:
          for _ in range(64):
            f.write(chunk)
      except OSError as e:
        print('one file stopped:', errno.errorcode[e.errno])
      os.remove('big.bin')
      written = 0
      try:
        for i in range(64):
          with open(f'part{i}.bin', 'wb') as f:
            f.write(b'x' * (512 << 10))
          written += 1
      except OSError as e:
        print('many files stopped:', errno.errorcode[e.errno], 'after', written)
      fs = os.statvfs('.')
      print('working directory bytes', fs.f_blocks * fs.f_frsize)
  """)
  out = run(code)
  assert "one file stopped: EFBIG" in out["stdout"]  # RLIMIT_FSIZE: 1 MB per file
  assert "many files stopped: ENOSPC" in out["stdout"]  # the 8 MB tmpfs
  assert int(out["stdout"].split("after")[1].split()[0]) < 16
  # The writes went to a filesystem of the sandbox's 8 MB, not the host's disk. (Comparing the host's disk usage
  # before and after was flaky on a shared machine, #33.)
  assert int(out["stdout"].split("working directory bytes")[1]) <= 8 << 20


def test_the_trainer_environment_is_invisible(run):
  secret = os.environ[SECRET_ENV]
  code = textwrap.dedent("""
      import os
      print(sorted(os.environ))
      for pid in os.listdir('/proc'):
        if pid.isdigit():
          try:
            print(pid, open(f'/proc/{pid}/environ', 'rb').read())
          except OSError as e:
            print(pid, type(e).__name__)
      print('ppid', os.getppid())
  """)
  out = run(code)
  assert secret not in out["stdout"] and SECRET_ENV not in out["stdout"]
  assert out["stdout"].splitlines()[0] == "['HOME', 'LANG', 'PATH', 'PYTHONIOENCODING']"


def test_the_tool_refuses_to_start_without_namespaces_unless_told_to_run_unsafe(monkeypatch, caplog):
  sandbox.check_available.cache_clear()
  monkeypatch.setattr(sandbox, "_PATH", "/nonexistent")  # no unshare / setpriv / pivot_root to be found
  try:
    with pytest.raises(sandbox.SandboxUnavailable, match=r"needs util-linux's unshare.*isolation='none'"):
      PythonTool()
    tool = PythonTool(isolation="none")
    assert "UNSAFE" in caplog.text and tool.call({"code": "print(6 * 7)"}).content == "42\n"
  finally:
    sandbox.check_available.cache_clear()


def test_the_config_section_reaches_the_tool():
  from agent_r1_jax.tools import build_tools  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer import config as config_lib, task as task_lib  # pylint: disable=import-outside-toplevel
  c = config_lib.base_config("grpo", "tiny")
  c.tool.python.update(dict(isolation="none", time_limit_s=2.0, disk_limit_mb=4))
  (tool,) = build_tools(["python"], task_lib.tool_options(c))
  assert (tool.isolation, tool.time_limit_s, tool.limits.disk_mb) == ("none", 2.0, 4)


def test_a_venv_reached_through_a_symlink_still_runs_snippets(tmp_path):
  """#33, defect 4: the sandbox mounts the canonical `realpath(sys.prefix)` but ran the unresolved
  `sys.executable`, so an interpreter started through a symlinked venv path found no interpreter in the sandbox
  and every snippet failed. Here a trainer process runs from `<tmp>/venv-link/bin/python` (sys.prefix is then the
  link) and its snippet runs, inside the venv."""
  link = tmp_path / "venv-link"
  link.symlink_to(os.path.realpath(sys.prefix), target_is_directory=True)
  script = textwrap.dedent("""
      import os, sys, tempfile
      from agent_r1_jax.tools import sandbox
      assert sys.prefix.endswith('venv-link'), sys.prefix
      with tempfile.TemporaryDirectory() as work, open(work + '/out', 'w+b') as out, \\
           open(work + '/err', 'w+b') as err:
        os.mkdir(work + '/stage')
        status, *_ = sandbox.run_isolated("import sys; print('prefix', sys.prefix)", work + '/stage',
                                         sandbox.Limits(), timeout_s=20, stdout=out, stderr=err)
        out.seek(0); err.seek(0)
        print(status, out.read().decode(), err.read().decode()[-500:])
  """)
  done = subprocess.run([str(link / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=120,
                        check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.startswith("0 prefix "), done.stdout
  assert done.stdout.split()[2] == os.path.realpath(sys.prefix), done.stdout


def test_a_snippet_can_use_multiprocessing_and_its_shared_memory_is_bounded(run):
  """`multiprocessing` needs POSIX semaphores in /dev/shm: the sandbox gives a tmpfs there of the disk limit, and
  the functions of the snippet's `__main__` pickle to the pool's workers (the snippet runs in the real `__main__`)."""
  code = textwrap.dedent("""
      import multiprocessing, os
      def square(x):
        return x * x
      if __name__ == '__main__':
        with multiprocessing.Pool(2) as pool:
          print(pool.map(square, range(6)))
        fs = os.statvfs('/dev/shm')
        print('shm bytes', fs.f_blocks * fs.f_frsize)
  """)
  out = run(code)
  assert out["stdout"].splitlines()[0] == "[0, 1, 4, 9, 16, 25]", out
  assert int(out["stdout"].split("shm bytes")[1]) <= LIMITS.disk_mb << 20
