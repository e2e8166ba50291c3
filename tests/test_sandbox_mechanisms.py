"""The sandbox's mechanisms checked without running a snippet: the seccomp program against the kernel headers and a
classic-BPF interpreter written here, and the cgroup discovery on hand-written /proc files and a fake cgroup tree."""

from __future__ import annotations

import errno
import pathlib
import re
import struct

import pytest

from agent_r1_jax.tools import seccomp_filter, snippet_cgroup

_HEADERS = {"x86_64": "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "aarch64": "/usr/include/asm-generic/unistd.h"}


@pytest.mark.parametrize("machine", sorted(seccomp_filter.SYSCALLS))
def test_syscall_numbers_match_the_kernel_headers(machine):
  path = pathlib.Path(_HEADERS[machine])
  if not path.exists():
    pytest.skip(f"{path} (linux-libc-dev) is not installed")
  defined = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", path.read_text())}
  table = seccomp_filter.SYSCALLS[machine]
  assert set(table) == set(seccomp_filter.DENIED) | {"clone", "clone3"}
  present = {name: number for name, number in table.items() if name in defined}
  assert len(present) >= len(table) - 2, sorted(set(table) - set(defined))  # headers may drop a retired call
  assert present == {name: defined[name] for name in present}


def _run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = (0,) * 6) -> int:
  """A classic-BPF interpreter for the four instructions the filter uses, over a `struct seccomp_data`."""
  data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
  insns = [struct.unpack("<HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
  pc, acc = 0, 0
  while True:
    code, jt, jf, k = insns[pc]
    if code == 0x20:  # ld [k]
      acc = struct.unpack_from("<I", data, k)[0]
      pc += 1
    elif code in (0x15, 0x35, 0x45):  # jeq / jge / jset
      taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
      pc += 1 + (jt if taken else jf)
    elif code == 0x06:  # ret k
      return k
    else:
      raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("machine", sorted(seccomp_filter.SYSCALLS))
def test_the_filter_denies_what_it_names_and_allows_the_rest(machine):
  program = seccomp_filter.filter_bytes(machine)
  numbers, arch = seccomp_filter.SYSCALLS[machine], seccomp_filter.AUDIT_ARCH[machine]
  eperm = seccomp_filter.RET_ERRNO | errno.EPERM
  for name in seccomp_filter.DENIED:
    assert _run_bpf(program, numbers[name], arch) == eperm, name
  assert _run_bpf(program, numbers["clone3"], arch) == seccomp_filter.RET_ERRNO | errno.ENOSYS
  clone = numbers["clone"]
  fork_flags = 0x01200000 | 17  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD: what glibc's fork passes
  thread_flags = 0x003D0F00  # CLONE_VM | FS | FILES | SIGHAND | THREAD | SYSVSEM | SETTLS | PARENT/CHILD_SETTID
  assert _run_bpf(program, clone, arch, (fork_flags,) + (0,) * 5) == seccomp_filter.RET_ALLOW
  assert _run_bpf(program, clone, arch, (thread_flags,) + (0,) * 5) == seccomp_filter.RET_ALLOW
  for flag in seccomp_filter.CLONE_NEW_FLAGS.values():
    assert _run_bpf(program, clone, arch, (fork_flags | flag,) + (0,) * 5) == eperm
  denied = set(numbers.values())
  for nr in range(0, 460):  # every other call of the table's range is allowed
    if nr not in denied:
      assert _run_bpf(program, nr, arch) == seccomp_filter.RET_ALLOW, nr
  assert _run_bpf(program, 0, 0x40000003) == seccomp_filter.RET_KILL_PROCESS  # another ABI (i386)
  if machine == "x86_64":
    assert _run_bpf(program, seccomp_filter.X32_SYSCALL_BIT | 0, arch) == eperm  # x32 read


def test_an_unknown_architecture_is_reported():
  with pytest.raises(seccomp_filter.SeccompUnsupported, match="riscv64"):
    seccomp_filter.filter_bytes("riscv64")


_V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
_V1_SELF = "8:pids:/jobs/7\n4:memory:/docker/abc/trainer\n1:cpu,cpuacct:/\n0::/\n"


def test_v1_discovery_places_snippets_under_the_trainers_own_cgroups():
  mounts, v2 = snippet_cgroup._mounts(_V1_MOUNTINFO)
  own, own_v2 = snippet_cgroup._own_paths(_V1_SELF)
  assert mounts == {"cpu": ("/sys/fs/cgroup/cpu,cpuacct", "/"), "memory": ("/sys/fs/cgroup/memory", "/docker/abc"),
                    "pids": ("/sys/fs/cgroup/pids", "/")}
  assert v2 == ("/sys/fs/cgroup/unified", "/") and own_v2 == "/"
  assert own == {"pids": "/jobs/7", "memory": "/docker/abc/trainer", "cpu": "/"}
  under = {c: str(snippet_cgroup._under(mounts[c], own[c], None)) for c in mounts}
  assert under == {"cpu": "/sys/fs/cgroup/cpu,cpuacct/agent_r1_jax_snippets",
                   "memory": "/sys/fs/cgroup/memory/trainer/agent_r1_jax_snippets",  # the mount shows /docker/abc
                   "pids": "/sys/fs/cgroup/pids/jobs/7/agent_r1_jax_snippets"}
  assert str(snippet_cgroup._under(mounts["pids"], own["pids"], "mine")) == "/sys/fs/cgroup/pids/jobs/7/mine"
  assert str(snippet_cgroup._under(mounts["pids"], own["pids"], "/abs/x")) == "/sys/fs/cgroup/pids/abs/x"


def _cgroup_dir(path: pathlib.Path, available: str, enabled: str = "") -> pathlib.Path:
  path.mkdir(parents=True)
  (path / "cgroup.controllers").write_text(available + "\n")
  (path / "cgroup.subtree_control").write_text(enabled + "\n")
  return path


def test_v2_enables_the_controllers_top_down_from_the_nearest_ancestor_that_has_them(tmp_path):
  root = _cgroup_dir(tmp_path / "cgroup", "cpuset cpu io memory pids", "cpu memory pids")
  user = _cgroup_dir(root / "user.slice", "cpu memory pids")
  trainer = _cgroup_dir(user / "trainer.scope", "")
  snippets = _cgroup_dir(trainer / "snippets", "")
  snippet_cgroup.CgroupHost._enable_v2_controllers(snippets)
  assert (root / "cgroup.subtree_control").read_text() == "cpu memory pids\n"  # already on: left alone
  for node in (user, trainer, snippets):
    assert (node / "cgroup.subtree_control").read_text() == "+memory +pids +cpu", node


def test_v2_without_the_controllers_anywhere_is_unavailable(tmp_path):
  root = _cgroup_dir(tmp_path / "cgroup", "cpu io")
  with pytest.raises(snippet_cgroup.CgroupUnavailable, match="not available"):
    snippet_cgroup.CgroupHost._enable_v2_controllers(_cgroup_dir(root / "a", ""))


def test_no_cgroup_hierarchy_is_unavailable():
  with pytest.raises(snippet_cgroup.CgroupUnavailable, match="memory, pids, cpu"):
    snippet_cgroup.CgroupHost.detect(mountinfo="1 0 0:1 / / rw - ext4 /dev/sda rw\n", proc_cgroup="0::/\n")


def test_snippet_cgroups_of_a_dead_trainer_are_removed(tmp_path):
  """A trainer killed mid-snippet leaves `snippet-<pid>-<id>` behind; the next one removes it, not a live one's."""
  import os  # pylint: disable=import-outside-toplevel
  parent = tmp_path / "snippets"
  parent.mkdir()
  dead_pid = 4_000_000  # above the kernel's pid_max limit, so never a live process
  stale, live = parent / f"snippet-{dead_pid}-abc", parent / f"snippet-{os.getpid()}-def"
  stale.mkdir()
  live.mkdir()
  snippet_cgroup.CgroupHost(1, {"memory": parent})._remove_stale()
  assert not stale.exists() and live.exists()
