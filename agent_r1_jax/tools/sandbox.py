"""One untrusted Python program in fresh Linux namespaces, built with util-linux's `unshare` and `setpriv`.

What the program sees and may do:

  /                 a small read-only tmpfs holding only what Python needs: read-only binds of `/usr`, the
                    merged-usr links (`/bin`, `/lib`, ...), `/etc/ld.so.cache` and the interpreter's install
                    (`sys.base_prefix`, `sys.prefix`); no other host file exists there
  /sandbox          its working directory and HOME: an empty tmpfs of `disk_mb` (the only writable place; the
                    host's disk is never written), holding `snippet.py`
  /dev/null, zero, random, urandom; /proc of its own PID namespace
  network           a new namespace whose only interface, loopback, is down: no address (127.0.0.1 of the host
                    included) is reachable and no name resolves
  processes         a new PID namespace: when its first process ends or is killed, the kernel kills every
                    other (a child that called `setsid()` included), so nothing outlives the call
  privileges        as root, the program runs as `nobody` (uid 65534); otherwise in a user namespace as its uid
                    0, mapped to the caller's user. The capability bounding set is emptied and `no_new_privs`
                    set before the interpreter starts, so it can neither mount, nor leave its root, nor regain
                    a capability
  limits            setrlimit in the program's process: address space, CPU seconds, file size, open files,
                    processes (counted per user, within its user namespace when it has one)
  environment       PATH, LANG, HOME and PYTHONIOENCODING only; stdin empty

The mount namespace is private, so nothing mounted inside is visible to the host. A host without
unprivileged user namespaces (and not running as root) cannot build this; `check_available` says so and how to
enable them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
from typing import IO

NOBODY = 65534
SANDBOX_DIR = "/sandbox"
SNIPPET = f"{SANDBOX_DIR}/snippet.py"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Builds the root in the stage directory (a tmpfs mounted there, private to this mount namespace), reads the
# program from stdin into /sandbox, pivots into the root, detaches the host's tree and execs the command that
# follows "--" with stdin empty. Arguments: STAGE DISK_MB SPEC... -- COMMAND...; a SPEC is `dir:PATH`,
# `file:PATH` (read-only binds), `dev:PATH` (a device bind) or `link:PATH:TARGET` (a symlink).
_SETUP = r"""
set -eu
stage=$1; disk_mb=$2; shift 2
mount -t tmpfs -o mode=0755,size=4m sandbox-root "$stage"
mkdir -p "$stage/sandbox" "$stage/proc" "$stage/dev" "$stage/tmp" "$stage/.old"
while [ "$1" != "--" ]; do
  kind=${1%%:*}; path=${1#*:}
  case $kind in
    dir)  mkdir -p "$stage$path"; mount --bind "$path" "$stage$path"; mount -o remount,ro,bind "$stage$path" ;;
    file) mkdir -p "$stage${path%/*}"; : > "$stage$path"; mount --bind "$path" "$stage$path"
          mount -o remount,ro,bind "$stage$path" ;;
    dev)  : > "$stage$path"; mount --bind "$path" "$stage$path" ;;
    link) target=${path#*:}; path=${path%%:*}; mkdir -p "$stage${path%/*}"; ln -s "$target" "$stage$path" ;;
  esac
  shift
done
shift
mount -t tmpfs -o "mode=1777,size=${disk_mb}m,nosuid,nodev" sandbox-work "$stage/sandbox"
cat > "$stage/sandbox/snippet.py"
chmod 0644 "$stage/sandbox/snippet.py"
mount -t proc -o nosuid,nodev,noexec proc "$stage/proc"
cd "$stage"
pivot_root . .old
umount -l /.old
rmdir /.old
mount -o remount,ro,bind /
cd /sandbox
exec "$@" < /dev/null
"""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-program limits: address space (MB), CPU seconds, bytes per written file, open files, processes and the
  size of its writable tmpfs (MB)."""
  memory_mb: int = 512
  cpu_s: int = 6
  file_size_bytes: int = 1 << 20
  open_files: int = 64
  processes: int = 32
  disk_mb: int = 16


class SandboxUnavailable(RuntimeError):
  """This host cannot build the namespaces (see the message for how to enable them)."""


def _root_spec() -> list[str]:
  """What the program's root holds: `/usr`, the merged-usr links, the loader cache, the Python install."""
  spec = []
  for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(top):
      spec.append(f"link:{top}:{os.readlink(top)}")
    elif os.path.isdir(top):
      spec.append(f"dir:{top}")
  spec.append("dir:/usr")
  if os.path.isfile("/etc/ld.so.cache"):
    spec.append("file:/etc/ld.so.cache")
  prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)}
  spec += [f"dir:{p}" for p in sorted(prefixes) if not (p + "/").startswith("/usr/")]
  spec += [f"dev:/dev/{name}" for name in ("null", "zero", "random", "urandom")]
  return spec


def _canonical_interpreter() -> str:
  """`sys.executable` under the canonical prefix the sandbox mounts (`realpath(sys.prefix)`): a venv reached
  through a symlink or `..` runs as `<real prefix>/bin/python`, which exists in the sandbox and still finds the
  venv's pyvenv.cfg beside it (resolving the executable itself would leave the venv for the base interpreter)."""
  executable, prefix = os.path.abspath(sys.executable), os.path.abspath(sys.prefix)
  if os.path.commonpath([executable, prefix]) == prefix:
    return os.path.join(os.path.realpath(prefix), os.path.relpath(executable, prefix))
  return os.path.realpath(executable)


def bootstrap(limits: Limits) -> str:
  """Source of the program's first interpreter: set the limits, then exec the interpreter on the snippet (limits
  survive `execv`)."""
  values = ((("RLIMIT_AS", limits.memory_mb << 20), ("RLIMIT_CPU", limits.cpu_s),
             ("RLIMIT_FSIZE", limits.file_size_bytes), ("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", limits.open_files),
             ("RLIMIT_NPROC", limits.processes)))
  pairs = ", ".join(f"(resource.{name}, {value})" for name, value in values)
  return ("import os, resource, sys\n"
          f"for lim, val in ({pairs},):\n"
          "  resource.setrlimit(lim, (val, val))\n"
          "os.execv(sys.executable, [sys.executable, '-I', '-u', sys.argv[1]])\n")


def isolated_command(stage: str, limits: Limits, python: str | None = None) -> list[str]:
  """The argv that runs the snippet read from stdin in the sandbox, `stage` an empty directory to build its root
  in (its tmpfs is private to the sandbox's mount namespace; the directory itself stays empty)."""
  python = python or _canonical_interpreter()
  root = os.geteuid() == 0
  unshare = ["unshare", "--mount", "--propagation=private", "--net", "--pid", "--fork", "--ipc", "--uts",
             "--kill-child"]
  if not root:
    unshare += ["--user", "--map-root-user"]
  drop = ["setpriv"] + ([f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if root else [])
  drop += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--pdeathsig=SIGKILL", "--"]
  env = ["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8", f"HOME={SANDBOX_DIR}", "PYTHONIOENCODING=utf-8"]
  program = [python, "-I", "-c", bootstrap(limits), SNIPPET]
  return (unshare + ["--", "/bin/sh", "-c", _SETUP, "sandbox-setup", stage, str(limits.disk_mb)] + _root_spec()
          + ["--"] + drop + env + program)


def host_environment() -> dict[str, str]:
  """The environment `unshare` and the setup script run with (the program gets its own, see module docs)."""
  return {"PATH": _PATH, "LANG": "C.UTF-8"}


def run_isolated(code: str, stage: str, limits: Limits, *, timeout_s: float, stdout: IO[bytes], stderr: IO[bytes],
                 python: str | None = None) -> tuple[int, bool]:
  """Runs `code` in a sandbox built in the empty directory `stage`, its output going to the given files.

  Returns:
    `(exit status, timed out)`: the status of the program (negative: the signal that ended it); after
    `timeout_s` seconds of wall-clock time the whole sandbox is killed. Nothing it started is left running.
  """
  proc = subprocess.Popen(isolated_command(stage, limits, python), env=host_environment(), stdin=subprocess.PIPE,
                          stdout=stdout, stderr=stderr, start_new_session=True, close_fds=True)
  try:
    proc.stdin.write(code.encode("utf-8"))
    proc.stdin.close()
  except BrokenPipeError:  # the setup failed before reading the program; its status and stderr say why
    pass
  return wait_and_kill(proc, timeout_s)


def wait_and_kill(proc: subprocess.Popen, timeout_s: float) -> tuple[int, bool]:
  """Waits up to `timeout_s` for `proc`, then kills what is left of it (see `kill_tree`); `(status, timed out)`."""
  try:
    proc.wait(timeout=timeout_s)
    timed_out = False
  except subprocess.TimeoutExpired:
    timed_out = True
  kill_tree(proc.pid)  # after a normal exit too: an unisolated program's children share its process group
  proc.wait()
  return proc.returncode, timed_out


def kill_tree(pid: int) -> None:
  """SIGKILLs `pid`'s process group and its direct children. In a sandbox `pid` is `unshare` and its child the PID
  namespace's first process, whose death makes the kernel kill every process in the namespace (one that left
  the process group with `setsid()` included)."""
  try:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
      children = [int(c) for c in f.read().split()]
  except OSError:
    children = []
  for child in children:
    try:
      os.kill(child, signal.SIGKILL)
    except ProcessLookupError:
      pass
  try:
    os.killpg(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


@functools.lru_cache(maxsize=None)
def check_available(python: str | None = None) -> None:
  """Builds one sandbox that prints a word; raises SandboxUnavailable, saying how to fix it, if that fails."""
  import tempfile  # pylint: disable=import-outside-toplevel
  missing = [tool for tool in ("unshare", "setpriv", "pivot_root") if shutil.which(tool, path=_PATH) is None]
  if missing:
    raise SandboxUnavailable(f"the python tool's sandbox needs util-linux's {', '.join(missing)} (Debian/Ubuntu: "
                             f"apt-get install util-linux); or set tool.python.isolation='none' to run snippets "
                             f"without isolation (unsafe)")
  with tempfile.TemporaryDirectory(prefix="agent_r1_sandbox_") as stage:
    proc = subprocess.run(isolated_command(stage, Limits(), python), input=b"print('sandbox ok')",
                          capture_output=True, env=host_environment(), timeout=60, check=False)
  if proc.returncode != 0 or proc.stdout.strip() != b"sandbox ok":
    detail = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()[-400:]
    raise SandboxUnavailable(
        f"the python tool cannot build its sandbox (Linux namespaces) on this host: {detail or proc.returncode}. "
        f"Run as root, or enable unprivileged user namespaces (sysctl user.max_user_namespaces=15000; Debian "
        f"kernels before 6.x: kernel.unprivileged_userns_clone=1; Ubuntu 24.04: "
        f"kernel.apparmor_restrict_unprivileged_userns=0; in a container: allow unshare/mount, e.g. Docker "
        f"--security-opt seccomp=unconfined), or set tool.python.isolation='none' to run snippets without "
        f"isolation (unsafe: they can read your files and reach the network)")
