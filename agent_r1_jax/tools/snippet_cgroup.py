"""A control group per snippet: one memory, process and CPU budget for everything a snippet starts.

rlimits bound one process; a snippet that forks gets a fresh address-space allowance per child, and as root every
snippet runs as the same `nobody`, so `RLIMIT_NPROC` is one budget shared by all concurrent snippets. A cgroup
bounds the *group*: each snippet gets its own, created before it starts and removed after it ends,

    memory   memory_mb + disk_mb     its processes and its tmpfs pages together (tmpfs pages are charged to the
                                     cgroup that wrote them); swap is not granted. Beyond it the kernel's OOM
                                     killer stops a process of this snippet, never of another
    pids     processes               processes and threads alive at once, this snippet's only
    cpu      cpus x one core         CFS bandwidth (quota per 100 ms period), so its CPU seconds <= cpus x wall time

Both layouts are supported: cgroup v1 (a hierarchy per controller; snippets are created under the trainer's own
cgroup in each, so limits on the trainer still hold) and cgroup v2 (one hierarchy; under the trainer's cgroup, or
the configured parent, whose `cgroup.subtree_control` must enable memory, pids and cpu). The snippet's first
process joins by writing 0 to each `cgroup.procs` before anything untrusted runs (`join_files`).

`CgroupHost.detect` finds where snippet cgroups can be created, or raises `CgroupUnavailable` saying why (e.g. an
unprivileged user without a delegated cgroup).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import pathlib
import signal
import time
import uuid

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
DEFAULT_CHILD = "agent_r1_jax_snippets"


class CgroupUnavailable(RuntimeError):
  """Snippet cgroups cannot be created here; the message says why and what to change."""


@dataclasses.dataclass(frozen=True)
class Budget:
  """One snippet's limits: bytes of memory (processes + tmpfs), processes alive at once, CPU cores of bandwidth."""
  memory_bytes: int
  pids: int
  cpus: float


def _mounts(mountinfo: str) -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
  """`({v1 controller: (mount point, mount root)}, (cgroup2 mount point, root) or None)` from /proc/self/mountinfo."""
  v1, v2 = {}, None
  for line in mountinfo.splitlines():
    left, _, right = line.partition(" - ")
    fields, tail = left.split(), right.split()
    if len(fields) < 5 or len(tail) < 3:
      continue
    root, point, fstype = fields[3], fields[4], tail[0]
    if fstype == "cgroup2" and v2 is None:
      v2 = (point, root)
    elif fstype == "cgroup":
      for option in tail[2].split(","):
        if option in CONTROLLERS:
          v1[option] = (point, root)
  return v1, v2


def _own_paths(proc_cgroup: str) -> tuple[dict[str, str], str | None]:
  """`({v1 controller: path}, v2 path or None)` of this process, from /proc/self/cgroup."""
  v1, v2 = {}, None
  for line in proc_cgroup.splitlines():
    hierarchy, controllers, path = line.split(":", 2)
    if hierarchy == "0" and controllers == "":
      v2 = path
    for controller in controllers.split(","):
      if controller in CONTROLLERS:
        v1[controller] = path
  return v1, v2


def _under(mount: tuple[str, str], path: str, parent: str | None) -> pathlib.Path:
  """The directory for snippet cgroups in a hierarchy mounted at `mount = (point, root)`, given this process's
  cgroup `path` there: `parent` if it is absolute (from the hierarchy's root), else `path/parent`, and
  `path/agent_r1_jax_snippets` without one. A cgroup namespace or a bind mount shows the hierarchy from `root`, so
  `path` is made relative to it."""
  point, root = mount
  if parent and parent.startswith("/"):
    return pathlib.Path(point) / parent.strip("/")
  relative = path[len(root):] if root != "/" and path.startswith(root) else path
  return pathlib.Path(point) / relative.strip("/") / (parent.strip("/") if parent else DEFAULT_CHILD)


def _write(path: pathlib.Path, value: str) -> None:
  with open(path, "w", encoding="ascii") as f:
    f.write(value)


@dataclasses.dataclass(frozen=True)
class CgroupHost:
  """Where snippet cgroups are made: `version` 1 with a parent directory per controller, or 2 with one."""
  version: int
  parents: dict[str, pathlib.Path]

  @classmethod
  def detect(cls, parent: str | None = None, *, mountinfo: str | None = None,
             proc_cgroup: str | None = None) -> "CgroupHost":
    """Finds the hierarchies (v1 memory+pids+cpu controllers first, else cgroup v2), makes the parent directory for
    snippet cgroups and checks that a child can be made and limited there. `parent`: see `_under`."""
    mountinfo = pathlib.Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo
    proc_cgroup = pathlib.Path("/proc/self/cgroup").read_text() if proc_cgroup is None else proc_cgroup
    v1_mounts, v2_mount = _mounts(mountinfo)
    v1_paths, v2_path = _own_paths(proc_cgroup)
    if all(c in v1_mounts and c in v1_paths for c in CONTROLLERS):
      host = cls(1, {c: _under(v1_mounts[c], v1_paths[c], parent) for c in CONTROLLERS})
    elif v2_mount is not None and v2_path is not None:
      host = cls(2, {"unified": _under(v2_mount, v2_path, parent)})
    else:
      missing = [c for c in CONTROLLERS if c not in v1_mounts]
      raise CgroupUnavailable(f"no cgroup hierarchy with the {', '.join(missing)} controller(s) is mounted")
    host._prepare()
    host.create(Budget(64 << 20, 8, 1.0)).remove()  # a probe: creating and limiting a snippet cgroup works
    return host

  def _prepare(self) -> None:
    for directory in self.parents.values():
      try:
        directory.mkdir(parents=True, exist_ok=True)
      except OSError as e:
        raise CgroupUnavailable(f"cannot create {directory} ({e.strerror}): snippet cgroups need root or a cgroup "
                                f"delegated to this user") from e
    if self.version == 2:
      self._enable_v2_controllers(self.parents["unified"])
    self._remove_stale()

  def _remove_stale(self) -> None:
    """Removes the empty snippet cgroups a trainer that died mid-snippet left behind (`snippet-<its pid>-...`)."""
    for directory in self.parents.values():
      for child in directory.glob("snippet-*-*"):
        pid = child.name.split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
          try:
            child.rmdir()
          except OSError:  # still holds a process, or another trainer removed it first
            pass

  @staticmethod
  def _enable_v2_controllers(directory: pathlib.Path) -> None:
    """Enables memory, pids and cpu in `directory`'s `cgroup.subtree_control` (so its children get them), first in
    each ancestor's, top down, from the nearest one that has them available (a cgroup can pass on only what its
    parent passed to it)."""
    nodes = [directory]
    while not set(CONTROLLERS) <= set((nodes[-1] / "cgroup.controllers").read_text().split()):
      parent = nodes[-1].parent
      if parent == nodes[-1] or not (parent / "cgroup.controllers").exists():
        raise CgroupUnavailable(f"cgroup v2: the {', '.join(CONTROLLERS)} controllers are not available to "
                                f"{nodes[-1]}")
      nodes.append(parent)
    for node in reversed(nodes):
      if set(CONTROLLERS) <= set((node / "cgroup.subtree_control").read_text().split()):
        continue
      try:
        _write(node / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
      except OSError as e:
        hint = (" (it holds processes: a cgroup v2 node with processes cannot pass controllers to children; start "
                "the trainer in a delegated cgroup, e.g. `systemd-run --scope -p Delegate=yes ...`, or set "
                "tool.python.cgroup_parent to one)" if e.errno == errno.EBUSY else "")
        raise CgroupUnavailable(f"cgroup v2: cannot enable {', '.join(CONTROLLERS)} in {node}/cgroup.subtree_control"
                                f" ({e.strerror}){hint}") from e

  def create(self, budget: Budget) -> "SnippetCgroup":
    """Makes a fresh cgroup for one snippet with `budget` applied; the caller removes it (`SnippetCgroup.remove`)."""
    name = f"snippet-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    dirs = {key: parent / name for key, parent in self.parents.items()}
    group = SnippetCgroup(self.version, dirs)
    try:
      for directory in dirs.values():
        directory.mkdir()
      group.apply(budget)
    except OSError as e:
      group.remove()
      raise CgroupUnavailable(f"cannot create or limit a snippet cgroup under {sorted(map(str, self.parents.values()))}"
                              f": {e}") from e
    return group


@dataclasses.dataclass(frozen=True)
class SnippetCgroup:
  """One snippet's cgroup: a directory per v1 controller, or one v2 directory."""
  version: int
  dirs: dict[str, pathlib.Path]

  def apply(self, budget: Budget) -> None:
    quota = max(1000, int(budget.cpus * CPU_PERIOD_US))
    if self.version == 1:
      memory = self.dirs["memory"]
      _write(memory / "memory.limit_in_bytes", str(budget.memory_bytes))
      if (memory / "memory.memsw.limit_in_bytes").exists():  # swap accounting on: no swap beyond the limit either
        _write(memory / "memory.memsw.limit_in_bytes", str(budget.memory_bytes))
      _write(self.dirs["pids"] / "pids.max", str(budget.pids))
      _write(self.dirs["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_US))
      _write(self.dirs["cpu"] / "cpu.cfs_quota_us", str(quota))
    else:
      unified = self.dirs["unified"]
      _write(unified / "memory.max", str(budget.memory_bytes))
      if (unified / "memory.swap.max").exists():
        _write(unified / "memory.swap.max", "0")
      _write(unified / "pids.max", str(budget.pids))
      _write(unified / "cpu.max", f"{quota} {CPU_PERIOD_US}")

  @property
  def join_files(self) -> list[str]:
    """The `cgroup.procs` files a process writes 0 to in order to move itself (and its future children) in."""
    return [str(d / "cgroup.procs") for d in self.dirs.values()]

  def _memory_dir(self) -> pathlib.Path:
    return self.dirs["memory" if self.version == 1 else "unified"]

  def oom_kills(self) -> int:
    """How many of the snippet's processes the kernel's OOM killer stopped at this cgroup's memory limit."""
    name = "memory.oom_control" if self.version == 1 else "memory.events"
    try:
      text = (self._memory_dir() / name).read_text()
    except OSError:
      return 0
    for line in text.splitlines():
      key, _, value = line.partition(" ")
      if key == "oom_kill":
        return int(value)
    return 0

  def peak_memory_bytes(self) -> int:
    """The most memory the snippet's processes and files held at once (0 where the kernel does not report it)."""
    name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
    try:
      return int((self._memory_dir() / name).read_text())
    except (OSError, ValueError):
      return 0

  def _pids(self) -> list[int]:
    pids = set()
    for directory in self.dirs.values():
      try:
        pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
      except OSError:
        pass
    return sorted(pids)

  def remove(self, timeout_s: float = 5.0) -> None:
    """Kills whatever still runs in the cgroup and removes its directories (retrying while the kernel reaps)."""
    deadline = time.monotonic() + timeout_s
    pending = [d for d in self.dirs.values() if d.exists()]
    while pending:
      for pid in self._pids():
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      still = []
      for directory in pending:
        try:
          directory.rmdir()
        except FileNotFoundError:
          pass
        except OSError as e:
          if e.errno != errno.EBUSY or time.monotonic() > deadline:
            raise
          still.append(directory)
      pending = still
      if pending:
        time.sleep(0.01)
