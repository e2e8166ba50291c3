"""One untrusted Python program in fresh Linux namespaces, its own cgroup and a seccomp filter, built with
util-linux's `unshare` and `setpriv`.

What the program sees and may do:

  /                 a small read-only tmpfs holding only what Python needs: read-only binds of `/usr`, the
                    merged-usr links (`/bin`, `/lib`, ...), `/etc/ld.so.cache` and the interpreter's install
                    (`sys.base_prefix`, `sys.prefix`); no other host file exists there
  /sandbox          its working directory and HOME: an empty tmpfs of `disk_mb` (the only writable place; the
                    host's disk is never written), holding `snippet.py`
  /dev/null, zero, random, urandom; /dev/shm, a tmpfs of `disk_mb` (POSIX semaphores and shared memory:
                    `multiprocessing` works); /proc of its own PID namespace
  network           a new namespace whose only interface, loopback, is down: no address (127.0.0.1 of the host
                    included) is reachable and no name resolves
  processes         a new PID namespace: when its first process ends or is killed, the kernel kills every
                    other (a child that called `setsid()` included), so nothing outlives the call
  privileges        as root, the program runs as `nobody` (uid 65534); otherwise in a user namespace as its uid
                    0, mapped to the caller's user. The capability bounding set is emptied and `no_new_privs`
                    set before the interpreter starts
  system calls      a seccomp filter (`seccomp_filter`) denies new namespaces (so no nested user namespace gives
                    the capabilities back), mounts, keyrings, bpf, ptrace, io_uring and the like
  budget            its own cgroup (`snippet_cgroup`): `memory_mb + disk_mb` for all its processes and files
                    together (beyond it the OOM killer stops one of *its* processes), `processes` alive at once
                    counted for it alone, `cpus` cores of CPU bandwidth
  limits            setrlimit per process: address space, CPU seconds, file size, open files
  environment       PATH, LANG, HOME and PYTHONIOENCODING only; stdin empty

The mount namespace is private, so nothing mounted inside is visible to the host. One interpreter runs per
snippet: it sets the limits, installs the filter, then runs the snippet as `python -I -u snippet.py` would.

What the host must give: namespaces need root or unprivileged user namespaces (`check_available` says how to
enable them); the cgroup needs root or a cgroup delegated to the user (`tool.python.cgroup_parent`); the filter
needs seccomp on x86_64 or aarch64. A guarantee the host cannot give (`GUARANTEES`) makes `check_available` refuse,
naming it, unless the config accepts running without it (`tool.python.accept_missing`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import sys
from typing import IO, NamedTuple

from agent_r1_jax.tools import seccomp_filter, snippet_cgroup

NOBODY = 65534
SANDBOX_DIR = "/sandbox"
SNIPPET = f"{SANDBOX_DIR}/snippet.py"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Builds the root in the stage directory (a tmpfs mounted there, private to this mount namespace), reads the
# program from stdin into /sandbox, pivots into the root, detaches the host's tree and execs the command that
# follows "--" with stdin empty. Arguments: STAGE DISK_MB SPEC... -- COMMAND...; a SPEC is `join:PATH` (write 0 to
# a `cgroup.procs`, moving this shell and so everything it starts into the snippet's cgroup; these come first),
# `dir:PATH`, `file:PATH` (read-only binds), `dev:PATH` (a device bind) or `link:PATH:TARGET` (a symlink).
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
    join) echo 0 > "$path" ;;
  esac
  shift
done
shift
mount -t tmpfs -o "mode=1777,size=${disk_mb}m,nosuid,nodev" sandbox-work "$stage/sandbox"
mkdir -p "$stage/dev/shm"
mount -t tmpfs -o "mode=1777,size=${disk_mb}m,nosuid,nodev,noexec" sandbox-shm "$stage/dev/shm"
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
  """One snippet's limits. Per process (rlimits): address space `memory_mb`, CPU seconds, bytes per written file,
  open files. Per snippet (its cgroup, see `snippet_cgroup`): `memory_mb + disk_mb` of memory for all its processes
  and its tmpfs together, `processes` alive at once, `cpus` cores of CPU bandwidth. `disk_mb`: its tmpfs's size."""
  memory_mb: int = 512
  cpu_s: int = 6
  file_size_bytes: int = 1 << 20
  open_files: int = 64
  processes: int = 32
  disk_mb: int = 16
  cpus: float = 1.0

  def budget(self) -> snippet_cgroup.Budget:
    # The root tmpfs (4 MB, mostly empty) is charged to the snippet too.
    return snippet_cgroup.Budget(memory_bytes=(self.memory_mb + self.disk_mb + 4) << 20, pids=self.processes,
                                 cpus=self.cpus)


class SandboxUnavailable(RuntimeError):
  """This host cannot build the sandbox, or lacks a guarantee the config did not accept (the message says which
  and how to fix it)."""


# The guarantees beyond the namespaces, what each needs from the host, and what a snippet can do without it.
GUARANTEES = {
    "cgroup": ("one memory, process and CPU budget per snippet (its own cgroup)",
               "root, or a cgroup delegated to this user named in tool.python.cgroup_parent",
               "each process gets the memory limit anew, so a forking snippet can hold a multiple of it; processes "
               "are counted per user, so concurrent snippets share one process budget"),
    "seccomp": ("a seccomp filter that denies new namespaces, mounts and other calls a snippet never needs",
                "a Linux kernel with seccomp filters on x86_64 or aarch64",
                "a snippet can create a user namespace, regain capabilities there and mount a tmpfs of any size"),
}


@dataclasses.dataclass(frozen=True)
class Isolation:
  """What this host adds to the namespaces: a place for snippet cgroups, the seccomp program; `missing` maps each
  guarantee it cannot give to why."""
  cgroups: snippet_cgroup.CgroupHost | None
  seccomp: bytes | None
  missing: dict[str, str]

  @classmethod
  def probe(cls, cgroup_parent: str | None = None) -> "Isolation":
    missing = {}
    try:
      cgroups = snippet_cgroup.CgroupHost.detect(cgroup_parent or None)
    except (snippet_cgroup.CgroupUnavailable, OSError) as e:
      cgroups, missing["cgroup"] = None, str(e)
    try:
      program = seccomp_filter.filter_bytes()
    except seccomp_filter.SeccompUnsupported as e:
      program, missing["seccomp"] = None, str(e)
    return cls(cgroups, program, missing)

  def require(self, accept_missing: tuple[str, ...] = ()) -> None:
    """Raises SandboxUnavailable naming each missing guarantee that `accept_missing` does not accept."""
    unknown = sorted(set(accept_missing) - set(GUARANTEES))
    if unknown:
      raise ValueError(f"tool.python.accept_missing: unknown guarantee(s) {unknown}; known: {sorted(GUARANTEES)}")
    refused = [name for name in self.missing if name not in accept_missing]
    if refused:
      raise SandboxUnavailable("; ".join(describe_missing(name, self.missing[name]) for name in refused)
                               + f". To run without it anyway set tool.python.accept_missing={tuple(refused)!r}")

  def without(self, guarantee: str) -> "Isolation":
    """This isolation with `guarantee` turned off (as on a host that lacks it)."""
    missing = {**self.missing, guarantee: "turned off"}
    return dataclasses.replace(self, missing=missing, cgroups=None if guarantee == "cgroup" else self.cgroups,
                               seccomp=None if guarantee == "seccomp" else self.seccomp)


def describe_missing(name: str, why: str) -> str:
  what, needs, risk = GUARANTEES[name]
  return f"the python tool's sandbox cannot give {what}: {why}. It needs {needs}; without it {risk}"


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


# Runs the snippet in the bootstrap's own interpreter (one interpreter start per snippet) as `python -I -u
# snippet.py` would: in `__main__`, `sys.argv == [path]`, a traceback without the bootstrap's frame, exit status 1.
_RUN_SNIPPET = """
import sys as _sys
_sys.argv = _sys.argv[1:]
__file__ = _sys.argv[0]
with open(__file__, 'rb') as _f:
  _code = _f.read()
try:
  _code = compile(_code, __file__, 'exec', dont_inherit=True)
except SyntaxError as _e:
  _sys.excepthook(type(_e), _e.with_traceback(None), None)
  raise SystemExit(1)
del _f, _sys
try:
  exec(_code)
except SystemExit:
  raise
except BaseException as _e:
  _e = _e.with_traceback(_e.__traceback__.tb_next)
  __import__('sys').excepthook(type(_e), _e, _e.__traceback__)
  raise SystemExit(1)
"""


def bootstrap(limits: Limits, *, seccomp: bytes | None = None, limit_processes: bool = True) -> str:
  """Source of the snippet's interpreter: set the rlimits, install the seccomp filter `seccomp` (if given), then run
  the snippet named by argv[1] in the same interpreter. `limit_processes=False` leaves RLIMIT_NPROC to the snippet's
  pids cgroup (as root every snippet is `nobody`, and an RLIMIT_NPROC would be one budget for all of them)."""
  values = [("RLIMIT_AS", limits.memory_mb << 20), ("RLIMIT_CPU", limits.cpu_s),
            ("RLIMIT_FSIZE", limits.file_size_bytes), ("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", limits.open_files)]
  if limit_processes:
    values.append(("RLIMIT_NPROC", limits.processes))
  pairs = ", ".join(f"(_resource.{name}, {value})" for name, value in values)
  return ("import resource as _resource\n"
          f"for _lim, _val in ({pairs},):\n"
          "  _resource.setrlimit(_lim, (_val, _val))\n"
          "del _resource, _lim, _val\n"
          + (seccomp_filter.install_source(seccomp) if seccomp is not None else "")
          + _RUN_SNIPPET)


def isolated_command(stage: str, limits: Limits, python: str | None = None, *, isolation: Isolation,
                     join_files: tuple[str, ...] = ()) -> list[str]:
  """The argv that runs the snippet read from stdin in the sandbox, `stage` an empty directory to build its root
  in (its tmpfs is private to the sandbox's mount namespace; the directory itself stays empty); its first process
  joins the cgroups whose `cgroup.procs` are `join_files` before anything else."""
  python = python or _canonical_interpreter()
  root = os.geteuid() == 0
  unshare = ["unshare", "--mount", "--propagation=private", "--net", "--pid", "--fork", "--ipc", "--uts",
             "--kill-child"]
  if not root:
    unshare += ["--user", "--map-root-user"]
  drop = ["setpriv"] + ([f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if root else [])
  drop += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--pdeathsig=SIGKILL", "--"]
  env = ["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8", f"HOME={SANDBOX_DIR}", "PYTHONIOENCODING=utf-8"]
  source = bootstrap(limits, seccomp=isolation.seccomp, limit_processes=isolation.cgroups is None)
  program = [python, "-I", "-u", "-c", source, SNIPPET]
  specs = [f"join:{path}" for path in join_files] + _root_spec()
  return (unshare + ["--", "/bin/sh", "-c", _SETUP, "sandbox-setup", stage, str(limits.disk_mb)] + specs
          + ["--"] + drop + env + program)


def host_environment() -> dict[str, str]:
  """The environment `unshare` and the setup script run with (the program gets its own, see module docs)."""
  return {"PATH": _PATH, "LANG": "C.UTF-8"}


class Outcome(NamedTuple):
  """How a snippet ended: its exit status (negative: the signal that ended it), whether the wall-clock limit
  stopped it, how many of its processes the OOM killer stopped at its cgroup's memory limit, and the most memory
  its processes and files held at once (0 without a cgroup)."""
  status: int
  timed_out: bool
  oom_kills: int = 0
  peak_memory_bytes: int = 0


def run_isolated(code: str, stage: str, limits: Limits, *, timeout_s: float, stdout: IO[bytes], stderr: IO[bytes],
                 python: str | None = None, isolation: Isolation | None = None) -> Outcome:
  """Runs `code` in a sandbox built in the empty directory `stage`, its output going to the given files, under
  `isolation` (default: this host's, every guarantee required). After `timeout_s` seconds of wall-clock time the
  whole sandbox is killed; nothing it started is left running, and its cgroup is removed."""
  if isolation is None:
    isolation = default_isolation()
    isolation.require()
  group = isolation.cgroups.create(limits.budget()) if isolation.cgroups is not None else None
  try:
    command = isolated_command(stage, limits, python, isolation=isolation,
                               join_files=tuple(group.join_files) if group else ())
    proc = subprocess.Popen(command, env=host_environment(), stdin=subprocess.PIPE, stdout=stdout, stderr=stderr,
                            start_new_session=True, close_fds=True)
    try:
      proc.stdin.write(code.encode("utf-8"))
      proc.stdin.close()
    except BrokenPipeError:  # the setup failed before reading the program; its status and stderr say why
      pass
    status, timed_out = wait_and_kill(proc, timeout_s)
    if group is None:
      return Outcome(status, timed_out)
    return Outcome(status, timed_out, group.oom_kills(), group.peak_memory_bytes())
  finally:
    if group is not None:
      group.remove()


@functools.lru_cache(maxsize=None)
def default_isolation(cgroup_parent: str | None = None) -> Isolation:
  """This host's isolation (probed once per `cgroup_parent`)."""
  return Isolation.probe(cgroup_parent)


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


def _build_once(python: str | None, isolation: Isolation) -> subprocess.CompletedProcess:
  """Runs `print('sandbox ok')` in a sandbox under `isolation`."""
  import tempfile  # pylint: disable=import-outside-toplevel
  group = isolation.cgroups.create(Limits().budget()) if isolation.cgroups is not None else None
  try:
    with tempfile.TemporaryDirectory(prefix="agent_r1_sandbox_") as stage:
      command = isolated_command(stage, Limits(), python, isolation=isolation,
                                 join_files=tuple(group.join_files) if group else ())
      return subprocess.run(command, input=b"print('sandbox ok')", capture_output=True, env=host_environment(),
                            timeout=60, check=False)
  finally:
    if group is not None:
      group.remove()


@functools.lru_cache(maxsize=None)
def check_available(python: str | None = None, cgroup_parent: str | None = None,
                    accept_missing: tuple[str, ...] = ()) -> Isolation:
  """Builds one sandbox that prints a word, with every guarantee this host can give, and returns that isolation.

  Raises:
    SandboxUnavailable: the namespaces cannot be built (saying how to enable them), or a guarantee is missing that
      `accept_missing` does not name (saying which, why, and what it needs).
  """
  missing = [tool for tool in ("unshare", "setpriv", "pivot_root") if shutil.which(tool, path=_PATH) is None]
  if missing:
    raise SandboxUnavailable(f"the python tool's sandbox needs util-linux's {', '.join(missing)} (Debian/Ubuntu: "
                             f"apt-get install util-linux); or set tool.python.isolation='none' to run snippets "
                             f"without isolation (unsafe)")
  isolation = Isolation.probe(cgroup_parent)
  proc = _build_once(python, isolation)
  if b"could not install its seccomp filter" in proc.stderr:  # a kernel without seccomp filters
    why = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1]
    isolation = dataclasses.replace(isolation.without("seccomp"), missing={**isolation.missing, "seccomp": why})
    proc = _build_once(python, isolation)
  if proc.returncode != 0 or proc.stdout.strip() != b"sandbox ok":
    detail = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip()[-400:]
    raise SandboxUnavailable(
        f"the python tool cannot build its sandbox (Linux namespaces) on this host: {detail or proc.returncode}. "
        f"Run as root, or enable unprivileged user namespaces (sysctl user.max_user_namespaces=15000; Debian "
        f"kernels before 6.x: kernel.unprivileged_userns_clone=1; Ubuntu 24.04: "
        f"kernel.apparmor_restrict_unprivileged_userns=0; in a container: allow unshare/mount, e.g. Docker "
        f"--security-opt seccomp=unconfined), or set tool.python.isolation='none' to run snippets without "
        f"isolation (unsafe: they can read your files and reach the network)")
  isolation.require(accept_missing)
  return isolation
