"""The sandbox child's shared pieces: the control channel, libc calls, setup errors, rlimits.

No dimension legend: host-side Python, no arrays.
"""

import json
import os
import resource


MARK = "@@jaxagent-sbx "
CAP_VALUE_DEPTH = 60  # deeper answers from a worker are refused (the worker's own encoder stops at 50)
# Standard-library modules imported once per run, before the calls' workers fork from the process that imported
# them: those of them the program names (`sandbox.preloads`); any other import works as usual, inside the call.
PRELOAD = ("collections", "heapq", "bisect", "itertools", "functools", "math", "re", "string", "typing",
           "dataclasses", "fractions", "decimal", "statistics", "random", "operator", "copy", "array",
           "datetime", "enum", "io", "traceback", "cmath", "numbers", "textwrap", "unicodedata")
# Modules a weak-mode worker may not import (process creation, raw sockets, foreign calls).
WEAK_BLOCKED_MODULES = ("_posixsubprocess", "subprocess", "_socket", "socket", "_ctypes", "ctypes", "pty",
                        "multiprocessing", "_multiprocessing", "asyncio")
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38


class SetupError(Exception):
    """The sandbox could not be set up (reported as infrastructure, never as the model's failure)."""

    def __init__(self, message, unavailable=False):
        super().__init__(message)
        self.unavailable = unavailable


def emit(fd, obj):
    """Write one result line to the control channel (all of it; a short write would split the line)."""
    data = (MARK + json.dumps(obj) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass


def libc():
    import ctypes

    lib = ctypes.CDLL(None, use_errno=True)
    lib.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    lib.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    lib.unshare.argtypes = [ctypes.c_int]
    lib.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib


def prctl(lib, option, value):
    import ctypes

    if lib.prctl(option, value, 0, 0, 0) != 0:
        raise SetupError("prctl(%d, %d) failed: %s" % (option, value, os.strerror(ctypes.get_errno())))


def die_with_parent(lib, sig, parent_pid):
    """Get `sig` when the parent dies; exit now if it already has (the fork-to-prctl race; not
    checkable across a pid namespace, where getppid() is 0: pass None)."""
    prctl(lib, PR_SET_PDEATHSIG, sig)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def err_text(e):
    msg = str(e)
    if len(msg) > 300:
        msg = msg[:300] + "..."
    return type(e).__name__ + (": " + msg if msg else "")


def process_limits(cfg):
    """(processes, bytes per process): with a cgroup bounding the run, the configured process count
    and the whole budget per process; otherwise processes * bytes per process <= the budget."""
    L = cfg["limits"]
    mb = 1024 * 1024
    if cfg.get("cgroup_bound"):
        return int(L["nproc"]), int(L["memory_mb"]) * mb
    n = max(2, min(int(L["nproc"]), int(L["memory_mb"]) // int(L["process_mb"])))
    return n, int(L["memory_mb"]) * mb // n


def set_limits(cfg):
    L = cfg["limits"]
    mb = 1024 * 1024
    nproc, per_process = process_limits(cfg)
    # RLIMIT_CPU is each process's backstop; the launcher stops the run at cpu_s of all processes together.
    for res, val in ((resource.RLIMIT_AS, per_process), (resource.RLIMIT_CPU, int(L["cpu_s"]) + 1),
                     (resource.RLIMIT_FSIZE, int(L["fsize_mb"]) * mb), (resource.RLIMIT_NOFILE, int(L["nofile"])),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
        resource.setrlimit(res, (val, val))
