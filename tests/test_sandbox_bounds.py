"""Attacks on the sandbox's snippet-wide bounds (issue #33, defects 1-3): a snippet's processes share one memory,
process and CPU budget of their own (its cgroup), and its seccomp filter keeps it from making new namespaces.

The attacks run as root and as an unprivileged user with a delegated cgroup (`sandbox_harness.run`). Where a test
can show the attack succeeding with the guarantee turned off, it does, so the test is known to catch the defect.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import textwrap
import threading
import time

import pytest

from agent_r1_jax.tools import PythonTool, sandbox, seccomp_filter, snippet_cgroup
from sandbox_harness import LIMITS, run, run_here, undelegated_user  # noqa: F401 (fixtures)

# Tries every way a snippet could get a user namespace (and with it every capability back), and a mount.
_NESTED_NAMESPACE = textwrap.dedent("""
    import ctypes, errno, os, subprocess
    libc = ctypes.CDLL(None, use_errno=True)
    def attempt(name, result):
      print(name, 'SUCCEEDED' if result == 0 else 'refused ' + errno.errorcode.get(ctypes.get_errno(), '?'))
    pid = os.fork()
    if pid == 0:  # unshare(CLONE_NEWUSER), then try to use what it gives
      if libc.unshare(0x10000000) != 0:
        attempt('unshare', -1)
        os._exit(0)
      attempt('unshare', 0)
      caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')][0].split()[1]
      print('capabilities', caps, flush=True)
      os._exit(0)
    os.waitpid(pid, 0)
    child = libc.syscall({clone}, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
    if child == 0:
      os._exit(0)
    attempt('clone', 0 if child > 0 else -1)
    if child > 0:
      os.waitpid(child, 0)
    attempt('mount', libc.mount(b'none', b'/sandbox', b'tmpfs', 0, None))
    done = subprocess.run(['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c',
                           'mount -t tmpfs none /sandbox && echo MOUNTED'], capture_output=True, text=True)
    print('unshare-binary', 'SUCCEEDED' if 'MOUNTED' in done.stdout else 'refused')
""").format(clone=seccomp_filter.SYSCALLS.get(os.uname().machine, {}).get("clone", 56))


def test_a_nested_user_namespace_and_mounts_are_refused(run):
  """Defect 2: `unshare(CLONE_NEWUSER)` regained every capability (CapEff 0x1ffffffffff) and mounted a tmpfs of
  any size. The filter refuses each route: unshare, clone with the flag, mount, and util-linux's unshare."""
  out = run(_NESTED_NAMESPACE)
  assert out["status"] == 0, out["stderr"]
  lines = dict(line.split(" ", 1) for line in out["stdout"].splitlines())
  assert lines == {"unshare": "refused EPERM", "clone": "refused EPERM", "mount": "refused EPERM",
                   "unshare-binary": "refused"}, out["stdout"]


def test_without_the_filter_a_snippet_does_make_a_user_namespace():
  """The attack above is real on this kernel: with the seccomp guarantee turned off (as on a host without it) the
  same snippet creates a user namespace holding capabilities, so the test above would catch a missing filter."""
  if os.geteuid() != 0:
    pytest.skip("the control runs as root")
  isolation = sandbox.check_available().without("seccomp")
  out = run_here(_NESTED_NAMESPACE, isolation=isolation)
  if "unshare SUCCEEDED" not in out["stdout"]:
    pytest.skip(f"this kernel refuses user namespaces to the sandbox's user anyway: {out['stdout']}")
  caps = int(out["stdout"].split("capabilities")[1].split()[0], 16)
  assert caps & (1 << 21)  # CAP_SYS_ADMIN inside the nested namespace


_HOLD_CHILDREN = textwrap.dedent("""
    import os, sys, time
    held = 0
    for _ in range({n}):
      try:
        if os.fork() == 0:
          time.sleep({hold_s})
          os._exit(0)
        held += 1
      except OSError:
        break
    print('held', held, flush=True)
    time.sleep({hold_s})
""")

_FORK_LATER = textwrap.dedent("""
    import os, time
    time.sleep({delay_s})
    started, refused = [], 0
    for _ in range({n}):
      try:
        pid = os.fork()
        if pid == 0:
          os._exit(0)
        started.append(pid)
      except OSError:
        refused += 1
    for pid in started:
      os.waitpid(pid, 0)
    print('started', len(started), 'refused', refused)
""")


def _concurrently(*calls):
  results = [None] * len(calls)

  def call(i):
    results[i] = calls[i]()

  threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return results


def test_concurrent_snippets_do_not_share_a_process_budget(run):
  """Defect 3: as root every snippet is `nobody`, so RLIMIT_NPROC was one budget for all of them; a snippet holding
  its limit's worth of children made every fork of a concurrent snippet fail. With a pids cgroup per snippet the
  second snippet's forks all succeed while the first still holds its processes."""
  hog = _HOLD_CHILDREN.format(n=LIMITS.processes - 1, hold_s=4)
  other = _FORK_LATER.format(delay_s=1.5, n=6)
  held, forked = _concurrently(lambda: run(hog), lambda: run(other))
  assert held["stdout"].startswith(f"held {LIMITS.processes - 1}"), held
  assert forked["stdout"].strip() == "started 6 refused 0", forked


def test_without_cgroups_concurrent_snippets_do_share_a_process_budget():
  """The defect is real: with the cgroup guarantee turned off (per-process rlimits only, as before), as root the
  same pair of snippets fails the second one's forks, so the test above would catch it."""
  if os.geteuid() != 0:
    pytest.skip("the shared budget is a root-only defect (every snippet is nobody)")
  isolation = sandbox.check_available().without("cgroup")
  hog = _HOLD_CHILDREN.format(n=LIMITS.processes - 1, hold_s=4)
  other = _FORK_LATER.format(delay_s=1.5, n=6)
  held, forked = _concurrently(lambda: run_here(hog, isolation=isolation),
                               lambda: run_here(other, isolation=isolation))
  assert held["stdout"].startswith("held"), held
  assert "refused 0" not in forked["stdout"], forked


def test_the_process_limit_still_bounds_each_snippet(run):
  """The pids cgroup bounds the snippet itself: with `processes` = 16, the snippet and at most 15 children."""
  out = run(_HOLD_CHILDREN.format(n=40, hold_s=0.2))
  assert out["stdout"].strip() == f"held {LIMITS.processes - 1}", out


_FORKING_HOG = textwrap.dedent("""
    import os, time
    total = sum(range({work}))
    kids = []
    for i in range({children}):
      pid = os.fork()
      if pid == 0:
        block = bytearray({child_mb} << 20)
        for j in range(0, len(block), 4096):
          block[j] = 1
        time.sleep(1.0)
        os._exit(0)
      kids.append(pid)
    statuses = sorted(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in kids)
    print('sum', total, 'children', statuses)
""")


def test_forked_children_share_the_snippets_memory_limit(run):
  """Defect 1: RLIMIT_AS bounds a process, so three forked children held 1,092 MB with memory_mb=512. Here three
  children each try to hold 100 MB (each under the 160 MB per-process limit) against a snippet budget of
  160 + 8 MB: the kernel stops at least one (SIGKILL), and the parent lives to report it."""
  limits = sandbox.Limits(memory_mb=160, cpu_s=10, processes=16, disk_mb=8)
  out = run(_FORKING_HOG.format(work=1000, children=3, child_mb=100), limits=limits)
  assert out["status"] == 0, out
  assert out["oom_kills"] >= 1 and "-9" in out["stdout"].split("children")[1], out


def test_without_cgroups_forked_children_hold_a_multiple_of_the_limit():
  """The defect is real: with the cgroup guarantee turned off, all three 100 MB children of the test above live
  (300 MB against memory_mb=160), so that test would catch it."""
  if os.geteuid() != 0:
    pytest.skip("the control runs as root")
  limits = sandbox.Limits(memory_mb=160, cpu_s=10, processes=16, disk_mb=8)
  out = run_here(_FORKING_HOG.format(work=1000, children=3, child_mb=100), limits=limits,
                 isolation=sandbox.check_available().without("cgroup"))
  assert out["stdout"].strip() == f"sum {sum(range(1000))} children [0, 0, 0]", out


def _mem_available_bytes() -> int:
  for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
    if line.startswith("MemAvailable:"):
      return int(line.split()[1]) << 10
  raise AssertionError("no MemAvailable in /proc/meminfo")


def test_batch_execute_stops_each_snippet_at_its_own_memory_limit():
  """Issue #33, done-means 2: four snippets at once (`batch_execute`), each forking three children that together
  try to hold 3 x 120 MB against a budget of 160 + 8 MB. Every snippet loses a child to the OOM killer and says so,
  each parent's own result (a sum) is still right, and the host's available memory never drops by more than the
  four budgets (+ 200 MB for the four interpreters and the machine's other activity). Without per-snippet
  cgroups the children would hold about 4 x 360 MB."""
  if os.geteuid() != 0:
    pytest.skip("runs the tool in this process, which needs root (or a delegated cgroup) for its cgroups")
  tool = PythonTool(memory_limit_mb=160, disk_limit_mb=8, time_limit_s=20, max_workers=4)
  budget = tool.limits.budget().memory_bytes
  work = [10_000 * (i + 1) for i in range(4)]
  batch = [{"code": _FORKING_HOG.format(work=w, children=3, child_mb=120)} for w in work]
  samples, stop = [], threading.Event()

  def sample():
    while not stop.is_set():
      samples.append(_mem_available_bytes())
      time.sleep(0.005)

  baseline = min(_mem_available_bytes() for _ in range(20))
  sampler = threading.Thread(target=sample)
  sampler.start()
  try:
    results = tool.batch_execute(batch)
  finally:
    stop.set()
    sampler.join()
  for w, result in zip(work, results):
    assert f"sum {sum(range(w))} children" in result.content, result.content
    assert re.search(r"[\[ ]-9[\],]", result.content.split("children")[1]), result.content
    assert "exceeded its memory limit (160 MB + 8 MB of files)" in result.content and not result.success
  drop = baseline - min(samples)
  assert drop <= 4 * budget + (200 << 20), f"host memory dropped {drop >> 20} MB (budget 4 x {budget >> 20} MB)"


_SPIN = textwrap.dedent("""
    import os, time
    def spin(seconds):
      end = time.monotonic() + seconds
      while time.monotonic() < end:
        pass
    start, before = time.monotonic(), os.times()  # the interpreter's start-up CPU is not the spin's
    kids = []
    for _ in range(3):
      pid = os.fork()
      if pid == 0:
        spin(1.5)
        os._exit(0)
      kids.append(pid)
    spin(1.5)
    for pid in kids:
      os.waitpid(pid, 0)
    wall = time.monotonic() - start
    t = os.times()
    print('cpu per wall', (t.user + t.system + t.children_user + t.children_system - before.user - before.system) / wall)
""")


def _cpu_per_wall(run, cpus: float) -> float:
  out = run(_SPIN, limits=dataclasses.replace(LIMITS, cpus=cpus))
  return float(out["stdout"].split("cpu per wall")[1])


def test_a_snippets_processes_share_its_cpu_quota(run):
  """Four busy processes of one snippet get `cpus` = a tenth of a core between them (CFS quota), not a share each:
  their CPU seconds over the wall time stay near 0.1. The control lifts the quota (64 cores) and the same
  processes use more than twice the bound: on two cores they get far more than that even beside other busy
  tests (four of eight runnable threads would still get one core), so the bound is the quota's doing."""
  assert _cpu_per_wall(run, 0.1) <= 0.2  # CFS overshoots small quotas a little (0.12 measured)
  assert _cpu_per_wall(run, 64.0) > 0.4


def test_a_missing_guarantee_refuses_to_start_unless_accepted(undelegated_user):
  """An unprivileged user without a delegated cgroup: the sandbox names the missing guarantee, why, and what it
  needs, and refuses; accepting it (`accept_missing=("cgroup",)`) runs the snippet with per-process limits."""
  refused = undelegated_user("print('ran')")
  if "refused" not in refused:
    pytest.skip(f"this user can make cgroups without delegation here: {refused}")
  message = refused["refused"]
  assert "one memory, process and CPU budget per snippet" in message and "cgroup_parent" in message
  assert "accept_missing=('cgroup',)" in message
  accepted = undelegated_user("print('ran')", accept_missing=("cgroup",))
  assert accepted.get("stdout") == "ran\n", accepted


def test_the_tool_reports_a_missing_guarantee_at_start(monkeypatch, caplog):
  """In the trainer: a host without snippet cgroups makes `PythonTool()` raise, naming the guarantee; with the
  config accepting it the tool starts, warns which guarantee it runs without, and still runs snippets."""
  def unavailable(*args, **kwargs):
    raise snippet_cgroup.CgroupUnavailable("cannot create /sys/fs/cgroup/x (Permission denied)")

  monkeypatch.setattr(snippet_cgroup.CgroupHost, "detect", unavailable)
  sandbox.check_available.cache_clear()
  try:
    with pytest.raises(sandbox.SandboxUnavailable, match=r"memory, process and CPU budget.*Permission denied"):
      PythonTool()
    tool = PythonTool(accept_missing="cgroup")
    assert "running without a guarantee" in caplog.text and "Permission denied" in caplog.text
    assert tool.call({"code": "print(6 * 7)"}).content == "42\n"
    with pytest.raises(ValueError, match="unknown guarantee"):
      PythonTool(accept_missing=("cgroups",))
  finally:
    sandbox.check_available.cache_clear()


def test_the_config_names_the_guarantees_it_accepts():
  from agent_r1_jax.trainer import config as config_lib  # pylint: disable=import-outside-toplevel
  c = config_lib.base_config("grpo", "tiny")
  c.tool.python.accept_missing = "cgroup, seccomp"
  config_lib.validate(c)
  c.tool.python.accept_missing = "cgroups"
  with pytest.raises(ValueError, match=r"tool.python.accept_missing.*'cgroup', 'seccomp'.*'cgroups'"):
    config_lib.validate(c)
