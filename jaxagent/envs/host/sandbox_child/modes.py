"""Strong mode (namespaces, its own root, a seccomp filter, a fresh cgroup, an unprivileged uid, a CPU
quota) and weak mode (rlimits, a CPU quota and an audit hook, no security boundary), and `main`, which
reads the config and runs one of them.

No dimension legend: host-side Python, no arrays.
"""

import json
import os
import select
import signal
import sys
import time

from . import seccomp
from .cgroups import cgroup_cpu_s, cgroup_create, cgroup_remove
from .common import (PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, SetupError, die_with_parent,
                     emit, err_text, libc, prctl, set_limits)
from .harness import harness
from .rootfs import MS_NODEV, MS_NOEXEC, MS_NOSUID, build_root, mount


# ---------------------------------------------------------------------------------------------
# Strong mode: namespaces, its own root, a seccomp filter, a fresh cgroup and an unprivileged uid
# ---------------------------------------------------------------------------------------------
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = (
    0x20000, 0x04000000, 0x08000000, 0x20000000, 0x40000000)
WATCH_S = 0.02  # how often the launcher reads the run's CPU time


def tree_cpu_s(root, count_root=True):
    """CPU seconds of process `root` and all its descendants, the exited ones included: each process's
    user + system time plus that of the children it has reaped (an orphan is reaped by init, or by a
    subreaper); read from /proc, following every thread's children."""
    ticks, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            tids = os.listdir("/proc/%d/task" % pid)
        except (OSError, IndexError):
            continue
        times = [int(x) for x in fields[11:15]]  # utime, stime, cutime, cstime (stat fields 14-17)
        ticks += sum(times) if (count_root or pid != root) else times[2] + times[3]
        for tid in tids:
            try:
                with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                    stack.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
    return ticks / os.sysconf("SC_CLK_TCK")


def _self_cpu_s():
    t = os.times()
    return t.user + t.system


def run_cpu_s(cpu_file, since, root, count_root):
    """CPU seconds of the run: from its cgroup (`cpu_file`), less this launcher's own time since it joined the
    cgroup (`since`, its CPU seconds then), where there is one; else its process tree (`tree_cpu_s`), which misses
    children reaped by the kernel (a parent ignoring SIGCHLD): the weaker bound."""
    if cpu_file is not None:
        used = cgroup_cpu_s(cpu_file)
        if used is not None:
            return max(0.0, used - (_self_cpu_s() - since))
    return tree_cpu_s(root, count_root)


def watch(pid, limits, kill, tree=None, cpu_file=None, since=0.0):
    """Wait for child `pid` while the run has wall time and CPU time left; `kill()` ends the run when
    either is spent. The run's CPU time is its cgroup's (`run_cpu_s`; `cpu_file`, `since`), else that of `pid`'s
    process tree, or of this process's children when `tree` is "children" (a subreaper's orphans included).
    Returns (wait status, timed out, CPU quota exceeded, CPU seconds used)."""
    root, count_root = (os.getpid(), False) if tree == "children" else (pid, True)
    deadline = time.monotonic() + float(limits["wall_s"])
    quota = float(limits["cpu_s"])
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    timed_out = exceeded = False
    used = 0.0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        used = max(used, run_cpu_s(cpu_file, since, root, count_root))
        if used >= quota or time.monotonic() >= deadline:
            exceeded, timed_out = used >= quota, used < quota
            kill()
            _, status = os.waitpid(pid, 0)
            break
        if pidfd is not None:
            select.select([pidfd], [], [], WATCH_S)
        else:
            time.sleep(WATCH_S)
    if pidfd is not None:
        os.close(pidfd)
    if cpu_file is not None:  # all the run's processes used, up to their end
        used = max(used, run_cpu_s(cpu_file, since, root, count_root))
    return status, timed_out, exceeded, used


def strong_mode(cfg, out):
    lib = libc()
    notes = []
    made = []
    cpu_file, since = None, 0.0
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
                kind, made, cpu_file = got
                since = _self_cpu_s()
                cfg["cgroup_bound"] = True
                notes.append(kind)
        import ctypes

        # The mount namespace is init's own (rootfs.build_root): this launcher keeps the host's view,
        # for the cgroup and /proc.
        if lib.unshare(CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS) != 0:
            err = ctypes.get_errno()
            raise SetupError("unshare(net, pid, ipc, uts namespaces) failed: %s" % os.strerror(err),
                             unavailable=True)
    except SetupError as e:
        cgroup_remove(made)
        emit(out, {"setup_error": str(e), "unavailable": e.unavailable})
        os._exit(3)
    except Exception as e:
        cgroup_remove(made)
        emit(out, {"setup_error": "namespace setup: " + err_text(e)})
        os._exit(3)
    bound = notes[0] if made else "rlimits"
    emit(out, {"isolation": "namespaces", "memory_bound": bound, "notes": notes,
               "cpu_bound": bound if cpu_file is not None else "process-tree"})

    init_pid = os.fork()
    if init_pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        init(cfg, out, lib)
    status, timed_out, exceeded, used = watch(init_pid, cfg["limits"], lambda: os.kill(init_pid, signal.SIGKILL),
                                              cpu_file=cpu_file, since=since)
    cgroup_remove(made)  # killing pid 1 above killed the whole pid namespace
    emit(out, {"exit": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "cpu_exceeded": exceeded,
               "cpu_s": round(used, 3)})
    os._exit(0)


def init(cfg, out, lib):
    """pid 1 of the run's pid namespace: its own mount namespace and root, a fresh /proc; starts the
    harness and reaps until it ends."""
    code = 1
    try:
        try:
            import ctypes

            die_with_parent(lib, signal.SIGKILL, None)
            # Backstop if the launcher died before the line above: pid 1 exits, the namespace dies.
            signal.signal(signal.SIGALRM, lambda signum, frame: os._exit(137))
            signal.setitimer(signal.ITIMER_REAL, float(cfg["limits"]["wall_s"]) + 2.0)
            if lib.unshare(CLONE_NEWNS) != 0:
                raise SetupError("unshare(mount namespace) failed: %s" % os.strerror(ctypes.get_errno()),
                                 unavailable=True)
            lib.sethostname(b"sandbox", 7)
            workdir = build_root(lib, cfg, int(cfg["uid"]))
            mount(lib, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except SetupError as e:
            emit(out, {"setup_error": "init: " + str(e), "unavailable": e.unavailable})
            os._exit(3)
        except Exception as e:
            emit(out, {"setup_error": "init: " + err_text(e)})
            os._exit(3)
        runner = os.fork()
        if runner == 0:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                for name in cfg["preload"]:  # harmless imports, while the new root is fresh
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
            try:
                seccomp.install(lib)
            except SetupError as e:
                emit(out, {"setup_error": "seccomp: " + str(e), "unavailable": e.unavailable})
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
            prctl(lib, PR_SET_CHILD_SUBREAPER, 1)  # orphans of the run stay in its CPU account
        if os.geteuid() == 0:
            os.chmod(workdir, 0o700)
            os.chown(workdir, int(cfg["uid"]), int(cfg["uid"]))
    except (SetupError, OSError) as e:
        emit(out, {"setup_error": "weak mode setup: " + err_text(e)})
        cleanup_and_exit()
    emit(out, {"isolation": "unsafe-rlimits-only", "memory_bound": "rlimits", "notes": [],
               "cpu_bound": "process-tree"})
    harness_pid = os.fork()
    if harness_pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.setsid()
            for name in cfg["preload"]:
                try:
                    __import__(name)
                except ImportError:
                    pass
            emit(out, {"ready": True})
            harness(cfg, out, workdir, weak=True)
        finally:
            os._exit(0)

    def kill():
        try:
            os.killpg(harness_pid, signal.SIGKILL)
        except OSError:
            pass

    status, timed_out, exceeded, used = watch(harness_pid, cfg["limits"], kill, tree="children")
    kill()
    emit(out, {"exit": os.waitstatus_to_exitcode(status), "timed_out": timed_out, "cpu_exceeded": exceeded,
               "cpu_s": round(used, 3)})
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
