"""Runs snippets in the python tool's sandbox as root and as an unprivileged user, for the sandbox's tests.

`run` is a module-scoped pytest fixture with two halves: as root (the tool as CI runs it, in this process) and as
an unprivileged user in a user namespace (a throwaway uid, through `setpriv`, driving the same
`sandbox.run_isolated` with the system interpreter, since the venv's interpreter may live where that uid cannot
read). The unprivileged half gets a cgroup delegated to it the way an administrator (or systemd's `Delegate=yes`)
would: a directory under this process's cgroup in each hierarchy, owned by that uid. A half that cannot run here
is skipped with its reason. `run(code, limits=LIMITS, accept_missing=())` returns
`{status, timed_out, oom_kills, stdout, stderr}`.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import textwrap
import uuid

import pytest

from agent_r1_jax.tools import sandbox, snippet_cgroup

THROWAWAY_UID = 61_234  # no passwd entry: a user that owns nothing on this host
SYSTEM_PYTHON = "/usr/bin/python3"
LIMITS = sandbox.Limits(memory_mb=256, cpu_s=10, file_size_bytes=1 << 20, open_files=64, processes=16, disk_mb=8)
TIMEOUT_S = 8.0
SECRET_ENV = "AGENT_R1_TRAINER_SECRET"
# One delegated cgroup per test process: two pytest workers (pytest-xdist) each make, use and remove their own.
DELEGATED = f"agent_r1_test_uid{THROWAWAY_UID}_pid{os.getpid()}"
_MODULES = ("sandbox.py", "seccomp_filter.py", "snippet_cgroup.py")

# Runs as the throwaway user: reads {code, limits, timeout_s, cgroup_parent, accept_missing} as JSON on stdin, runs
# the code in a sandbox with the system interpreter, prints {status, timed_out, oom_kills, stdout, stderr} (or
# {refused: message} when the sandbox refuses to start).
_DRIVER = """
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from agent_r1_jax.tools import sandbox
request = json.load(sys.stdin)
isolation = sandbox.Isolation.probe(request["cgroup_parent"])
try:
  isolation.require(tuple(request["accept_missing"]))
except sandbox.SandboxUnavailable as e:
  print(json.dumps({"refused": str(e)}))
  sys.exit(0)
with tempfile.TemporaryDirectory() as work, open(work + "/out", "w+b") as out, open(work + "/err", "w+b") as err:
  os.mkdir(work + "/stage")
  outcome = sandbox.run_isolated(request["code"], work + "/stage", sandbox.Limits(**request["limits"]),
                                 timeout_s=request["timeout_s"], stdout=out, stderr=err, python=sys.executable,
                                 isolation=isolation)
  out.seek(0); err.seek(0)
  print(json.dumps({"status": outcome.status, "timed_out": outcome.timed_out, "oom_kills": outcome.oom_kills,
                    "stdout": out.read().decode("utf-8", "replace"),
                    "stderr": err.read().decode("utf-8", "replace")}))
"""


def run_here(code: str, limits: sandbox.Limits = LIMITS, accept_missing: tuple[str, ...] = (),
             isolation: sandbox.Isolation | None = None) -> dict:
  """Runs `code` in a sandbox from this process (root, or this unprivileged user)."""
  if isolation is None:
    isolation = sandbox.default_isolation()
    try:
      isolation.require(accept_missing)
    except sandbox.SandboxUnavailable as e:
      return {"refused": str(e)}
  with tempfile.TemporaryDirectory() as work, open(f"{work}/out", "w+b") as out, open(f"{work}/err", "w+b") as err:
    os.mkdir(f"{work}/stage")
    outcome = sandbox.run_isolated(code, f"{work}/stage", limits, timeout_s=TIMEOUT_S, stdout=out, stderr=err,
                                   isolation=isolation)
    out.seek(0)
    err.seek(0)
    return {"status": outcome.status, "timed_out": outcome.timed_out, "oom_kills": outcome.oom_kills,
            "stdout": out.read().decode(), "stderr": err.read().decode()}


def user_runner(driver_dir: pathlib.Path, cgroup_parent: str | None):
  """`run` for the throwaway user; `cgroup_parent` is the cgroup delegated to it (None: none)."""
  def run(code: str, limits: sandbox.Limits = LIMITS, accept_missing: tuple[str, ...] = (),
          cgroup_parent: str | None = cgroup_parent) -> dict:
    request = json.dumps({"code": code, "limits": limits.__dict__, "timeout_s": TIMEOUT_S,
                          "cgroup_parent": cgroup_parent, "accept_missing": list(accept_missing)})
    cmd = ["setpriv", f"--reuid={THROWAWAY_UID}", f"--regid={THROWAWAY_UID}", "--clear-groups", SYSTEM_PYTHON,
           str(driver_dir / "driver.py"), str(driver_dir)]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", SECRET_ENV: os.environ[SECRET_ENV]}
    done = subprocess.run(cmd, input=request, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
  return run


def _delegate_cgroups() -> list[pathlib.Path]:
  """Makes `DELEGATED` under this process's cgroup in each hierarchy, owned by the throwaway user (an
  administrator's delegation); [] where this host has no snippet cgroups for root either."""
  try:
    host = snippet_cgroup.CgroupHost.detect(DELEGATED)
  except snippet_cgroup.CgroupUnavailable:
    return []
  dirs = list(host.parents.values())
  for directory in dirs:
    for path in (directory, *directory.iterdir()):
      if path.is_file() or path == directory:
        os.chown(path, THROWAWAY_UID, THROWAWAY_UID)
  return dirs


def _remove_delegated(dirs: list[pathlib.Path]) -> None:
  for directory in dirs:
    for child in directory.iterdir():
      if child.is_dir():  # a snippet cgroup left by a crashed driver
        child.rmdir()
    directory.rmdir()


def build_driver() -> pathlib.Path:
  """A folder the throwaway user can read holding the sandbox's modules as `agent_r1_jax.tools` and the driver."""
  driver_dir = pathlib.Path(tempfile.mkdtemp(prefix="agent_r1_driver_"))  # pytest's tmp is root-only
  package = driver_dir / "agent_r1_jax" / "tools"
  package.mkdir(parents=True)
  for init in (driver_dir / "agent_r1_jax" / "__init__.py", package / "__init__.py"):
    init.write_text("")
  for name in _MODULES:
    shutil.copy(pathlib.Path(sandbox.__file__).parent / name, package / name)
  (driver_dir / "driver.py").write_text(textwrap.dedent(_DRIVER))
  for path in (driver_dir, *driver_dir.rglob("*")):
    path.chmod(0o755)
  return driver_dir


@pytest.fixture(scope="module", params=["root", "unprivileged"])
def run(request):
  """`code -> {status, timed_out, oom_kills, stdout, stderr}` in a sandbox, as root or as an unprivileged user."""
  os.environ.setdefault(SECRET_ENV, "s3cr3t-" + uuid.uuid4().hex)
  root = os.geteuid() == 0
  if request.param == "root":
    if not root:
      pytest.skip("not running as root: the root half needs root")
    sandbox.check_available()
    yield run_here
    return
  if not root:  # this process is the unprivileged user
    try:
      sandbox.check_available()
    except sandbox.SandboxUnavailable as e:
      pytest.skip(f"the sandbox is unavailable to this user: {e}")
    yield run_here
    return
  if not os.path.exists(SYSTEM_PYTHON):
    pytest.skip(f"{SYSTEM_PYTHON} (an interpreter the throwaway user can run) is not installed")
  driver_dir = build_driver()
  delegated = _delegate_cgroups()
  runner = user_runner(driver_dir, DELEGATED if delegated else None)
  try:
    probe = runner("print('sandbox ok')")
    if probe.get("stdout", "").strip() != "sandbox ok":
      pytest.skip(f"an unprivileged user cannot build the sandbox here (user namespaces off?): {probe}")
    yield runner
  finally:
    shutil.rmtree(driver_dir)
    _remove_delegated(delegated)


@pytest.fixture(scope="module")
def undelegated_user():
  """`run` for the throwaway user without a delegated cgroup (skipped where it cannot run at all)."""
  os.environ.setdefault(SECRET_ENV, "s3cr3t-" + uuid.uuid4().hex)
  if os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON):
    pytest.skip("needs root (to become a throwaway user) and the system python")
  driver_dir = build_driver()
  try:
    yield user_runner(driver_dir, None)
  finally:
    shutil.rmtree(driver_dir)
