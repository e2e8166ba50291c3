"""The sandbox's seccomp filter: the system calls a snippet never needs, denied in the kernel.

The sandbox's namespaces and its emptied capability bounding set do not stop a snippet from creating a *new* user
namespace (`unshare(CLONE_NEWUSER)` or `clone` with that flag needs no privilege), inside which it holds every
capability again and can mount a tmpfs of any size. This filter closes that door and the neighbouring ones. It is a
classic BPF program over `struct seccomp_data` (`nr` at byte 0, `arch` at 4, argument i's low 32 bits at 16 + 8i on
a little-endian machine):

    arch != this machine's audit arch               -> kill the process (no other ABI, e.g. int 0x80 on x86_64)
    nr >= 0x40000000 (x86_64 only: the x32 ABI)     -> EPERM
    nr in DENIED (namespaces, mounts, keys, bpf,    -> EPERM
        perf, ptrace, modules, kexec, io_uring, ...)
    nr == clone3                                    -> ENOSYS (its flags live in memory the filter cannot read;
                                                       glibc then falls back to clone)
    nr == clone and flags & CLONE_NEW*              -> EPERM
    otherwise                                       -> allow

`filter_bytes()` assembles it for the running machine (x86_64 or aarch64); the sandbox's first interpreter installs
it with `prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ...)` after `no_new_privs` is set and before the snippet runs
(`install_source`). A filter survives `execve` and is inherited by every child, and cannot be removed.
"""

from __future__ import annotations

import errno
import platform
import struct

# Classic BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
X32_SYSCALL_BIT = 0x40000000

# The namespace flags of clone(2). CLONE_NEWTIME (0x80) is absent: in clone()'s flags that bit is part of the exit
# signal, and a time namespace is reachable only through unshare/clone3, both denied.
CLONE_NEW_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                   "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000}

# What a snippet never needs: entering or making namespaces, mounting (old and new mount API), changing root,
# kernel keyrings, eBPF, perf events, tracing or reading other processes, modules, kexec, io_uring (its operations
# bypass this filter), file handles (open_by_handle_at escapes a bind mount), userfaultfd, clocks, swap, reboot.
DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
          "fsconfig", "fsmount", "fspick", "mount_setattr", "add_key", "request_key", "keyctl", "bpf",
          "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "init_module",
          "finit_module", "delete_module", "kexec_load", "kexec_file_load", "io_uring_setup", "io_uring_enter",
          "io_uring_register", "name_to_handle_at", "open_by_handle_at", "userfaultfd", "settimeofday",
          "clock_settime", "clock_adjtime", "adjtimex", "swapon", "swapoff", "reboot", "acct", "quotactl",
          "syslog", "vhangup", "lookup_dcookie")

# System call numbers per architecture: x86_64 from arch/x86/entry/syscalls/syscall_64.tbl, aarch64 from the
# generic table (include/uapi/asm-generic/unistd.h). tests/test_sandbox_mechanisms.py checks them against the
# installed kernel headers.
SYSCALLS = {
    "x86_64": dict(
        clone=56, clone3=435, unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161,
        open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
        add_key=248, request_key=249, keyctl=250, bpf=321, perf_event_open=298, ptrace=101, process_vm_readv=310,
        process_vm_writev=311, kcmp=312, init_module=175, finit_module=313, delete_module=176, kexec_load=246,
        kexec_file_load=320, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, name_to_handle_at=303,
        open_by_handle_at=304, userfaultfd=323, settimeofday=164, clock_settime=227, clock_adjtime=305,
        adjtimex=159, swapon=167, swapoff=168, reboot=169, acct=163, quotactl=179, syslog=103, vhangup=153,
        lookup_dcookie=212),
    "aarch64": dict(
        clone=220, clone3=435, unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51,
        open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442,
        add_key=217, request_key=218, keyctl=219, bpf=280, perf_event_open=241, ptrace=117, process_vm_readv=270,
        process_vm_writev=271, kcmp=272, init_module=105, finit_module=273, delete_module=106, kexec_load=104,
        kexec_file_load=294, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, name_to_handle_at=264,
        open_by_handle_at=265, userfaultfd=282, settimeofday=170, clock_settime=112, clock_adjtime=266,
        adjtimex=171, swapon=224, swapoff=225, reboot=142, acct=89, quotactl=60, syslog=116, vhangup=58,
        lookup_dcookie=18),
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


class SeccompUnsupported(RuntimeError):
  """No filter is defined for this machine's architecture."""


def _assemble(program: list[tuple]) -> bytes:
  """Encodes `(opcode, k)`, `(opcode, k, true_label, false_label)` and `("label", name)` entries as
  `struct sock_filter` records (u16 code, u8 jt, u8 jf, u32 k), resolving labels to forward jump offsets."""
  positions, index = {}, 0
  for entry in program:
    if entry[0] == "label":
      positions[entry[1]] = index
    else:
      index += 1
  out, index = [], 0
  for entry in program:
    if entry[0] == "label":
      continue
    code, k, *targets = entry
    jumps = [0, 0]
    for i, target in enumerate(targets):
      if target is not None:
        jumps[i] = positions[target] - index - 1
        if not 0 <= jumps[i] <= 255:
          raise ValueError(f"seccomp jump to {target} out of range ({jumps[i]})")
    out.append(struct.pack("<HBBI", code, jumps[0], jumps[1], k))
    index += 1
  return b"".join(out)


def filter_bytes(machine: str | None = None) -> bytes:
  """The filter (module docstring) for `machine` (default: this one's `platform.machine()`)."""
  machine = machine or platform.machine()
  if machine not in SYSCALLS:
    raise SeccompUnsupported(f"the sandbox's seccomp filter is defined for {sorted(SYSCALLS)}, not {machine!r}")
  numbers = SYSCALLS[machine]
  program: list[tuple] = [(_LD_W_ABS, 4), (_JEQ_K, AUDIT_ARCH[machine], None, "kill"), (_LD_W_ABS, 0)]
  if machine == "x86_64":
    program.append((_JGE_K, X32_SYSCALL_BIT, "deny", None))
  program += [(_JEQ_K, numbers[name], "deny", None) for name in DENIED]
  program += [(_JEQ_K, numbers["clone3"], "enosys", None), (_JEQ_K, numbers["clone"], "clone", None),
              (_RET_K, RET_ALLOW),
              ("label", "clone"), (_LD_W_ABS, 16), (_JSET_K, sum(CLONE_NEW_FLAGS.values()), "deny", None),
              (_RET_K, RET_ALLOW),
              ("label", "deny"), (_RET_K, RET_ERRNO | errno.EPERM),
              ("label", "enosys"), (_RET_K, RET_ERRNO | errno.ENOSYS),
              ("label", "kill"), (_RET_K, RET_KILL_PROCESS)]
  return _assemble(program)


def install_source(program: bytes) -> str:
  """Python source that installs `program` in the running process (which must have `no_new_privs` set, as
  `setpriv --no-new-privs` does); raises OSError if the kernel refuses. Self-contained: the sandbox's interpreter
  cannot import this package."""
  return ("import ctypes as _ct\n"
          f"_prog = {program!r}\n"
          "_buf = _ct.create_string_buffer(_prog, len(_prog))\n"
          "class _Fprog(_ct.Structure):\n"
          "  _fields_ = [('len', _ct.c_ushort), ('filter', _ct.c_void_p)]\n"
          "_fprog = _Fprog(len(_prog) // 8, _ct.cast(_buf, _ct.c_void_p))\n"
          "_libc = _ct.CDLL(None, use_errno=True)\n"
          f"if _libc.prctl({PR_SET_SECCOMP}, {SECCOMP_MODE_FILTER}, _ct.byref(_fprog), 0, 0) != 0:\n"
          "  _e = _ct.get_errno()\n"
          "  raise OSError(_e, 'the sandbox could not install its seccomp filter: ' + __import__('os').strerror(_e))\n"
          "del _ct, _prog, _buf, _Fprog, _fprog, _libc\n")
