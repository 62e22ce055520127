"""Strong mode (namespaces, a fresh cgroup, an unprivileged uid) and weak mode (rlimits and an audit hook,
no security boundary), and `main`, which reads the config and runs one of them.

No dimension legend: host-side Python, no arrays.
"""

import json
import os
import signal
import sys

from .cgroups import cgroup_create, cgroup_remove
from .common import (PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PRELOAD, SetupError, die_with_parent,
                     emit, err_text, libc, prctl, set_limits)
from .harness import harness


# ---------------------------------------------------------------------------------------------
# Strong mode: namespaces, a fresh cgroup and an unprivileged uid
# ---------------------------------------------------------------------------------------------
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x08000000, 0x20000000, 0x40000000


def mount(lib, src, dst, fstype, flags, data=None):
    import ctypes

    enc = lambda s: None if s is None else s.encode()
    if lib.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        raise SetupError("mount %s on %s failed: %s" % (src, dst, os.strerror(ctypes.get_errno())))


def private_mounts(lib, cfg, notes):
    """Private mount tree, size-limited tmpfs over the world-writable directories, the interpreter's
    prefix reachable by the unprivileged uid; returns the work directory (on the private /tmp)."""
    mount(lib, None, "/", None, MS_REC | MS_PRIVATE)
    size = "size=%dm,mode=1777" % max(1, int(cfg["limits"]["fsize_mb"]))
    prefix = os.path.realpath(sys.base_prefix)
    blocked = None
    parts = prefix.strip("/").split("/")
    for k in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:k])
        if not (os.stat(d).st_mode & 0o001):
            blocked = d
            break
    mount(lib, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size)
    if blocked is not None and not "/tmp".startswith(blocked):
        stage = "/tmp/.prefix"
        os.mkdir(stage)
        mount(lib, prefix, stage, None, MS_BIND | MS_REC)
        mount(lib, "tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        os.makedirs(prefix, exist_ok=True)
        mount(lib, stage, prefix, None, MS_BIND | MS_REC)
        mount(lib, None, prefix, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        lib.umount2(stage.encode(), 2)  # MNT_DETACH
        os.rmdir(stage)
        notes.append("prefix rebound")
    for d in ("/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(d) and not os.path.islink(d):
            mount(lib, "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777")
    workdir = "/tmp/work"
    uid = int(cfg["uid"])
    os.mkdir(workdir, 0o700)
    os.chown(workdir, uid, uid)
    return workdir


def strong_mode(cfg, out):
    lib = libc()
    notes = []
    made = []
    init_pid = None

    def on_parent_death(signum, frame):
        if init_pid is not None:
            os.kill(init_pid, signal.SIGKILL)  # the whole pid namespace dies with it
            os.waitpid(init_pid, 0)
        cgroup_remove(made)
        os._exit(1)

    signal.signal(signal.SIGTERM, on_parent_death)
    die_with_parent(lib, signal.SIGTERM, int(cfg["parent_pid"]))
    try:
        if cfg.get("cgroup"):
            got = cgroup_create(cfg["limits"], "jaxagent-sbx-%d-%d" % (os.getpid(), int(cfg["uid"])))
            if got is not None:
                kind, made = got
                cfg["cgroup_bound"] = True
                notes.append(kind)
        import ctypes

        if lib.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC) != 0:
            err = ctypes.get_errno()
            raise SetupError("unshare(mount, net, pid, ipc namespaces) failed: %s" % os.strerror(err),
                             unavailable=True)
        workdir = private_mounts(lib, cfg, notes)
    except SetupError as e:
        cgroup_remove(made)
        emit(out, {"setup_error": str(e), "unavailable": e.unavailable})
        os._exit(3)
    except Exception as e:
        cgroup_remove(made)
        emit(out, {"setup_error": "namespace setup: " + err_text(e)})
        os._exit(3)
    bound = notes[0] if made else "rlimits"
    emit(out, {"isolation": "namespaces", "memory_bound": bound, "notes": notes})

    init_pid = os.fork()
    if init_pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        init(cfg, out, lib, workdir)
    flag = []

    def on_alarm(signum, frame):
        flag.append(1)
        os.kill(init_pid, signal.SIGKILL)  # pid 1 dies: the kernel kills the whole pid namespace

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(cfg["limits"]["wall_s"]))
    _, status = os.waitpid(init_pid, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    cgroup_remove(made)
    emit(out, {"exit": os.waitstatus_to_exitcode(status), "timed_out": bool(flag)})
    os._exit(0)


def init(cfg, out, lib, workdir):
    """pid 1 of the run's pid namespace: fresh /proc, start the harness, reap until it ends."""
    code = 1
    try:
        try:
            die_with_parent(lib, signal.SIGKILL, None)
            # Backstop if the launcher died before the line above: pid 1 exits, the namespace dies.
            signal.signal(signal.SIGALRM, lambda signum, frame: os._exit(137))
            signal.setitimer(signal.ITIMER_REAL, float(cfg["limits"]["wall_s"]) + 2.0)
            mount(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except SetupError as e:
            emit(out, {"setup_error": "init: " + str(e)})
            os._exit(3)
        runner = os.fork()
        if runner == 0:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                for name in PRELOAD:  # harmless imports, before the uid may lose access to the prefix
                    try:
                        __import__(name)
                    except ImportError:
                        pass
                set_limits(cfg)
                uid = int(cfg["uid"])
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                prctl(lib, PR_SET_NO_NEW_PRIVS, 1)
                prctl(lib, PR_SET_DUMPABLE, 0)
                prctl(lib, PR_SET_PDEATHSIG, signal.SIGKILL)
            except BaseException as e:
                emit(out, {"setup_error": "dropping privileges: " + err_text(e)})
                os._exit(3)
            emit(out, {"ready": True})
            try:
                harness(cfg, out, workdir, weak=False)
            finally:
                os._exit(0)
        status = 0
        while True:
            try:
                pid, st = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == runner:
                status = st
                break
        code = os.waitstatus_to_exitcode(status)
        code = code if code >= 0 else 128 - code
    finally:
        os._exit(code)


# ---------------------------------------------------------------------------------------------
# Weak mode: rlimits and an audit hook (no security boundary)
# ---------------------------------------------------------------------------------------------
def weak_mode(cfg, out):
    import shutil
    import tempfile

    lib = None
    try:
        lib = libc()
    except OSError:
        pass
    workdir = tempfile.mkdtemp(prefix="jaxagent-sbx-", dir=cfg["tmp_root"])
    harness_pid = None

    def cleanup_and_exit(signum=None, frame=None):
        if harness_pid is not None:
            try:
                os.killpg(harness_pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(workdir, ignore_errors=True)
        os._exit(0 if signum is None else 1)

    signal.signal(signal.SIGTERM, cleanup_and_exit)
    try:
        if lib is not None:
            die_with_parent(lib, signal.SIGTERM, int(cfg["parent_pid"]))
        if os.geteuid() == 0:
            os.chmod(workdir, 0o700)
            os.chown(workdir, int(cfg["uid"]), int(cfg["uid"]))
    except (SetupError, OSError) as e:
        emit(out, {"setup_error": "weak mode setup: " + err_text(e)})
        cleanup_and_exit()
    emit(out, {"isolation": "unsafe-rlimits-only", "memory_bound": "rlimits", "notes": []})
    harness_pid = os.fork()
    if harness_pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.setsid()
            for name in PRELOAD:
                try:
                    __import__(name)
                except ImportError:
                    pass
            emit(out, {"ready": True})
            harness(cfg, out, workdir, weak=True)
        finally:
            os._exit(0)
    flag = []

    def on_alarm(signum, frame):
        flag.append(1)
        try:
            os.killpg(harness_pid, signal.SIGKILL)
        except OSError:
            pass

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(cfg["limits"]["wall_s"]))
    _, status = os.waitpid(harness_pid, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        os.killpg(harness_pid, signal.SIGKILL)
    except OSError:
        pass
    emit(out, {"exit": os.waitstatus_to_exitcode(status), "timed_out": bool(flag)})
    cleanup_and_exit()


def main():
    cfg = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    out = 1
    if cfg["mode"] == "namespaces":
        strong_mode(cfg, out)
    else:
        weak_mode(cfg, out)
