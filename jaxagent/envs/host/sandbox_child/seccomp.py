"""A seccomp filter for the model's processes: no namespaces, no mounts, no socket families but local,
IPv4 and IPv6 (which reach nothing in the run's empty network namespace), no io_uring.

A classic BPF program, assembled here and installed with prctl(PR_SET_SECCOMP) after no_new_privs; it is
inherited by every process the model's code starts and cannot be removed. Refused, with the errno the program
sees: unshare, setns and clone with any CLONE_NEW* flag (EPERM), clone3 (ENOSYS, so that the C library falls back
to clone, whose flags the filter can read); socket and socketpair of any family but AF_UNIX, AF_INET and AF_INET6
(EAFNOSUPPORT); io_uring, mount and the new mount API, pivot_root, ptrace and the other calls listed in
docs/sandbox.md, "The seccomp filter" (EPERM); any other architecture's calling convention kills the process
(x32 calls on x86_64 get ENOSYS). Syscall tables exist for x86_64 and aarch64; on other machines the strong
sandbox is unavailable.

No dimension legend: host-side Python, no arrays.
"""

import ctypes
import os
import platform
import struct

from .common import SetupError

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
EPERM, EINVAL, ENOSYS, EAFNOSUPPORT = 1, 22, 38, 97
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16  # struct seccomp_data; arg0's low 32 bits (little-endian)
CLONE_NEW_FLAGS = 0x7E020080  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
ALLOWED_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6
DENIED = ("unshare setns mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick "
          "mount_setattr io_uring_setup io_uring_enter io_uring_register bpf perf_event_open userfaultfd "
          "keyctl add_key request_key ptrace process_vm_readv process_vm_writev name_to_handle_at "
          "open_by_handle_at kexec_load kexec_file_load init_module finit_module delete_module acct swapon "
          "swapoff reboot sethostname setdomainname syslog fanotify_init pidfd_getfd quotactl vhangup").split()
# (audit arch, syscall numbers) per machine, from the kernel's syscall tables.
TABLES = {
    "x86_64": (0xC000003E, dict(
        clone=56, clone3=435, socket=41, socketpair=53, unshare=272, setns=308, mount=165, umount2=166,
        pivot_root=155, chroot=161, open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432,
        fspick=433, mount_setattr=442, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=321,
        perf_event_open=298, userfaultfd=323, keyctl=250, add_key=248, request_key=249, ptrace=101,
        process_vm_readv=310, process_vm_writev=311, name_to_handle_at=303, open_by_handle_at=304,
        kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313, delete_module=176, acct=163,
        swapon=167, swapoff=168, reboot=169, sethostname=170, setdomainname=171, syslog=103, fanotify_init=300,
        pidfd_getfd=438, quotactl=179, vhangup=153)),
    "aarch64": (0xC00000B7, dict(
        clone=220, clone3=435, socket=198, socketpair=199, unshare=97, setns=268, mount=40, umount2=39,
        pivot_root=41, chroot=51, open_tree=428, move_mount=429, fsopen=430, fsconfig=431, fsmount=432,
        fspick=433, mount_setattr=442, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, bpf=280,
        perf_event_open=241, userfaultfd=282, keyctl=219, add_key=217, request_key=218, ptrace=117,
        process_vm_readv=270, process_vm_writev=271, name_to_handle_at=264, open_by_handle_at=265,
        kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273, delete_module=106, acct=89,
        swapon=224, swapoff=225, reboot=142, sethostname=161, setdomainname=162, syslog=116, fanotify_init=262,
        pidfd_getfd=438, quotactl=60, vhangup=58)),
}


def assemble(program):
    """Classic BPF bytes from (code, k, true label, false label) tuples and label strings; a jump's
    labels (None: the next instruction) become the relative offsets BPF wants."""
    where, pc = {}, 0
    for item in program:
        if isinstance(item, str):
            where[item] = pc
        else:
            pc += 1
    out, pc = [], 0
    for item in program:
        if isinstance(item, str):
            continue
        code, k, jt, jf = item
        off = lambda label: 0 if label is None else where[label] - pc - 1  # noqa: E731
        if not (0 <= off(jt) < 256 and 0 <= off(jf) < 256):
            raise SetupError("seccomp program: a jump is out of range")
        out.append(struct.pack("=HBBI", code, off(jt), off(jf), k))
        pc += 1
    return b"".join(out)


def filter_program(machine):
    """The filter (module docstring) for `machine` (platform.machine()) as BPF bytes."""
    if machine not in TABLES:
        raise SetupError("the seccomp filter has no syscall table for %s (it knows %s)"
                         % (machine, ", ".join(sorted(TABLES))), unavailable=True)
    arch, nr = TABLES[machine]
    deny = lambda errno: (RET_K, RET_ERRNO | errno, None, None)  # noqa: E731
    allow = (RET_K, RET_ALLOW, None, None)
    prog = [(LD_W_ABS, OFF_ARCH, None, None), (JEQ_K, arch, "arch ok", None), (RET_K, RET_KILL_PROCESS, None, None),
            "arch ok", (LD_W_ABS, OFF_NR, None, None)]
    if machine == "x86_64":
        prog += [(JGE_K, 0x40000000, "enosys", None)]  # the x32 ABI
    prog += [(JEQ_K, nr["clone"], "clone", None), (JEQ_K, nr["clone3"], "enosys", None),
             (JEQ_K, nr["socket"], "socket", None), (JEQ_K, nr["socketpair"], "socket", None)]
    prog += [(JEQ_K, nr[name], "eperm", None) for name in DENIED]
    prog += [allow,
             "clone", (LD_W_ABS, OFF_ARG0, None, None), (JSET_K, CLONE_NEW_FLAGS, "eperm", None), allow,
             "socket", (LD_W_ABS, OFF_ARG0, None, None)]
    prog += [(JEQ_K, family, "allow", None) for family in ALLOWED_FAMILIES]
    prog += [deny(EAFNOSUPPORT), "allow", allow, "eperm", deny(EPERM), "enosys", deny(ENOSYS)]
    return assemble(prog)


class _FProg(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(lib):
    """Install the filter on this process (no_new_privs must be set, or the caller hold CAP_SYS_ADMIN)."""
    code = filter_program(platform.machine())
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _FProg(len(code) // 8, ctypes.addressof(buf))
    if lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise SetupError("installing the seccomp filter failed: %s" % os.strerror(err),
                         unavailable=err in (EINVAL, ENOSYS))
