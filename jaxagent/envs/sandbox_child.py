"""The child program of jaxagent.envs.sandbox: runs untrusted code (run as a script; importing defines only).

The parent runs `python -I -S <this file>`, writes one JSON config to its stdin and reads result lines
(`MARK` + JSON) from its stdout, the control channel. Processes (strong mode, "namespaces"):
  launcher  root, the process the parent started: joins a fresh cgroup (when available), unshares the
            mount, network, pid and IPC namespaces, mounts private tmpfs over the world-writable
            directories, enforces the wall-clock limit by killing init.
  init      root, pid 1 of the new pid namespace: mounts a fresh /proc, reaps; its death kills the
            namespace.
  harness   the run's unprivileged uid (rlimits, no new privileges, not dumpable): forks one worker per
            call, checks what the worker sends back and writes the result lines.
  worker    the same uid, one per call: closes every descriptor except its own result pipe, loads the
            code, makes the call, sends back one value.
Only launcher, init and harness hold the control channel, so model code cannot write result lines: a
worker can only answer its own call, through its own pipe, and the harness accepts one answer per call.
Weak mode ("unsafe-rlimits-only"): launcher (same uid as the parent) + harness + workers with rlimits and
an audit hook in a throwaway directory; no security boundary (see docs/sandbox.md).
Every failure before the harness says "ready", and a worker's failure to set itself up (reported on
a pipe it closes before the model's code runs), is a setup failure ("setup_error" line), never a
result of the model's code; nothing the model's code writes can produce one. The launcher dies with
the parent (PR_SET_PDEATHSIG), and init with the launcher.

No dimension legend: host-side Python, no arrays.
"""

import json
import os
import resource
import select
import signal
import sys
import time

MARK = "@@jaxagent-sbx "
CAP_VALUE_DEPTH = 60  # deeper answers from a worker are refused (the worker's own encoder stops at 50)
PRELOAD = ("collections", "heapq", "bisect", "itertools", "functools", "math", "re", "string", "typing",
           "dataclasses", "fractions", "decimal", "statistics", "random", "operator", "copy", "array",
           "datetime", "enum", "io", "traceback", "cmath", "numbers", "textwrap", "unicodedata")
# Modules a weak-mode worker may not import (process creation, raw sockets, foreign calls).
WEAK_BLOCKED_MODULES = ("_posixsubprocess", "subprocess", "_socket", "socket", "_ctypes", "ctypes", "pty",
                        "multiprocessing", "_multiprocessing", "asyncio")
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38


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


# ---------------------------------------------------------------------------------------------
# Limits and cgroups
# ---------------------------------------------------------------------------------------------
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
    for res, val in ((resource.RLIMIT_AS, per_process), (resource.RLIMIT_CPU, int(L["cpu_s"])),
                     (resource.RLIMIT_FSIZE, int(L["fsize_mb"]) * mb), (resource.RLIMIT_NOFILE, int(L["nofile"])),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
        resource.setrlimit(res, (val, val))


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _mounts():
    with open("/proc/self/mounts") as f:
        return [line.split() for line in f if len(line.split()) >= 4]


def _own_cgroup_v1(controller):
    """The path of this process's cgroup in the v1 hierarchy of `controller` ("" if none)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                return path
    return ""


def cgroup_sweep(parent):
    """Remove the empty cgroups of earlier runs whose launcher is gone (killed before cleaning up)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if name.startswith("jaxagent-sbx-") and len(parts) == 4 and parts[2].isdigit():
            if not os.path.exists("/proc/%s" % parts[2]):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass


def cgroup_create(limits, tag):
    """A fresh cgroup bounding memory (no swap) and processes of the whole run; None when this machine
    offers none. Returns (kind, [(directory, the cgroup.procs to move back to)])."""
    mem = int(limits["memory_mb"]) * 1024 * 1024
    pids = int(limits["nproc"]) + 4  # the harness, init and the launcher are inside too
    for _, mnt, fstype, _opts in (m[:4] for m in _mounts()):
        if fstype != "cgroup2":
            continue
        try:
            with open(os.path.join(mnt, "cgroup.controllers")) as f:
                available = f.read().split()
            if "memory" not in available or "pids" not in available:
                continue
            with open(os.path.join(mnt, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            missing = [c for c in ("memory", "pids") if c not in enabled]
            if missing:
                _write(os.path.join(mnt, "cgroup.subtree_control"), " ".join("+" + c for c in missing))
            own = ""
            with open("/proc/self/cgroup") as f:
                for line in f:
                    if line.startswith("0::"):
                        own = line[3:].strip()
            back = os.path.join(mnt, own.lstrip("/"), "cgroup.procs")
            cgroup_sweep(mnt)
            d = os.path.join(mnt, tag)
            os.mkdir(d)
            try:
                _write(os.path.join(d, "memory.max"), str(mem))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), "0")
                _write(os.path.join(d, "pids.max"), str(pids))
                _write(os.path.join(d, "cgroup.procs"), str(os.getpid()))
            except OSError:
                os.rmdir(d)
                raise
            return "cgroup-v2", [(d, back)]
        except OSError:
            continue
    # cgroup v1: the memory and pids controllers in their own hierarchies.
    roots = {}
    for _, mnt, fstype, opts in (m[:4] for m in _mounts()):
        if fstype == "cgroup":
            for c in ("memory", "pids"):
                if c in opts.split(","):
                    roots[c] = mnt
    if "memory" not in roots:
        return None
    made = []
    try:
        for c in ("memory", "pids"):
            if c not in roots:
                continue
            own = _own_cgroup_v1(c).lstrip("/")
            parent = os.path.join(roots[c], own)
            if not os.path.isdir(parent):
                parent, own = roots[c], ""
            cgroup_sweep(parent)
            d = os.path.join(parent, tag)
            os.mkdir(d)
            made.append((d, os.path.join(roots[c], own, "cgroup.procs")))
            if c == "memory":
                _write(os.path.join(d, "memory.limit_in_bytes"), str(mem))
                if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(mem))
            else:
                _write(os.path.join(d, "pids.max"), str(pids))
        for d, _ in made:
            _write(os.path.join(d, "cgroup.procs"), str(os.getpid()))
    except OSError:
        cgroup_remove(made)
        return None
    return "cgroup-v1", made


def cgroup_remove(made):
    """Move this process back and remove the run's cgroups (waits briefly for the killed processes)."""
    for d, back in made:
        try:
            _write(back, str(os.getpid()))
        except OSError:
            pass
    for d, _ in made:
        for _ in range(200):
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# The worker: one call of the model's code
# ---------------------------------------------------------------------------------------------
def jsonable(v, depth=0):
    import math

    if depth > 50:
        raise ValueError("return value nested too deeply")
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return {"__float__": repr(v)}
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x, depth + 1) for x in v]
    if isinstance(v, (set, frozenset)):
        items = [jsonable(x, depth + 1) for x in v]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=repr)
    if isinstance(v, dict):
        return {str(k): jsonable(x, depth + 1) for k, x in v.items()}
    raise TypeError("unsupported return type " + type(v).__name__)


def err_text(e):
    msg = str(e)
    if len(msg) > 300:
        msg = msg[:300] + "..."
    return type(e).__name__ + (": " + msg if msg else "")


def weak_hook(workdir):
    """Audit hook of weak mode: no sockets, processes, foreign calls, or writes outside `workdir`;
    also the guarded os.mkfifo/os.mknod (which raise no audit event). Returns (hook, guards).
    Python-level only; not a security boundary."""
    wd = os.path.realpath(workdir)

    def outside(path):
        if isinstance(path, int):
            return False
        try:
            p = os.path.realpath(os.fsdecode(path))
        except Exception:
            return True
        return p != wd and not p.startswith(wd + os.sep) and p != os.devnull

    path_events = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.rename": 2, "os.replace": 2,
                   "os.symlink": 2, "os.link": 2, "os.chmod": 1, "os.chown": 1, "os.truncate": 1,
                   "os.utime": 1, "shutil.rmtree": 1, "shutil.move": 2, "shutil.copyfile": 2,
                   "os.mknod": 1, "os.mkfifo": 1}
    me = os.getpid()
    banned = ("socket.__new__", "socket.connect", "socket.bind", "subprocess.Popen", "os.system",
              "os.exec", "os.posix_spawn", "os.spawn", "ctypes.dlopen", "ctypes.dlsym", "os.fork",
              "os.forkpty", "pty.spawn", "os.fork_exec", "os.startfile")
    blocked = set(WEAK_BLOCKED_MODULES)

    def hook(event, args):
        if event in banned:
            raise PermissionError("sandbox: %s is disabled" % event)
        if event == "import" and args and args[0] in blocked:
            raise PermissionError("sandbox: importing %s is disabled" % args[0])
        if event in ("os.kill", "os.killpg") and not (event == "os.kill" and args and args[0] in (0, me)):
            raise PermissionError("sandbox: signalling other processes is disabled")
        if event == "open" and args:
            mode = args[1] if len(args) > 1 else None
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            if isinstance(mode, str):
                writing = any(c in mode for c in "wax+")
            else:
                writing = bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))
            if writing and outside(args[0]):
                raise PermissionError("sandbox: writing outside the work directory is disabled")
        elif event in path_events:
            for a in args[:path_events[event]]:
                if outside(a):
                    raise PermissionError("sandbox: %s outside the work directory is disabled" % event)

    def guard(name, fn):
        def guarded(path, *args, **kwargs):
            if outside(path) or kwargs.get("dir_fd") is not None:
                raise PermissionError("sandbox: os.%s outside the work directory is disabled" % name)
            return fn(path, *args, **kwargs)
        return guarded

    return hook, {name: guard(name, getattr(os, name)) for name in ("mkfifo", "mknod")}


def worker(cfg, i, w, sw, workdir, weak):
    """Load the code and make call `i` (None: load only); answers go to pipe `w`. Never returns.
    Whether the worker's own setup worked goes to pipe `sw`, closed before the model's code runs
    (so that code cannot claim an infrastructure failure)."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        lo, hi = min(w, sw), max(w, sw)
        os.closerange(3, lo)  # the control channel and every other descriptor are gone
        os.closerange(lo + 1, hi)
        os.closerange(hi + 1, 1 << 16)
        os.chdir(workdir)
        if weak:
            if os.geteuid() == 0:
                uid = int(cfg["uid"])
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            set_limits(cfg)
            import posix

            for name in WEAK_BLOCKED_MODULES:
                sys.modules.pop(name, None)
            hook, guards = weak_hook(workdir)
            for name, fn in guards.items():
                setattr(os, name, fn)
                setattr(posix, name, fn)
            sys.addaudithook(hook)
        os.write(sw, b"ok")
        os.close(sw)
    except BaseException as e:
        try:
            os.write(sw, ("worker setup: " + err_text(e)).encode()[:400])
        except OSError:
            pass
        os._exit(0)
    run_one(cfg, i, w)
    os._exit(0)


def emit_worker(w, obj):
    try:
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(w, data):]
    except (OSError, ValueError):
        pass


def run_one(cfg, i, w):
    import builtins
    import copy
    import io

    class Timeout(BaseException):
        pass

    def on_alarm(signum, frame):
        raise Timeout()

    class Sink(io.TextIOBase):
        def write(self, s):
            return len(s)

        def writable(self):
            return True

    signal.signal(signal.SIGALRM, on_alarm)
    sys.stdout = sys.stderr = Sink()
    sys.setrecursionlimit(3000)
    per = float(cfg["limits"]["per_call_s"])
    maxlen = int(cfg["limits"]["max_value_chars"])
    ns = {"__name__": "solution", "__builtins__": builtins}
    signal.setitimer(signal.ITIMER_REAL, per)
    try:
        code = compile(cfg["code"], "<solution>", "exec")
        exec(code, ns)
        signal.setitimer(signal.ITIMER_REAL, 0)
        fn = ns.get(cfg["entry_point"])
        if not callable(fn):
            emit_worker(w, {"load_error": "NameError: function %r is not defined" % cfg["entry_point"]})
            return
    except Timeout:
        emit_worker(w, {"load_error": "Timeout: executing the module took longer than %.1fs" % per})
        return
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(e, SyntaxError):
            emit_worker(w, {"load_error": "SyntaxError: %s (line %s)" % (e.msg, e.lineno)})
        else:
            emit_worker(w, {"load_error": err_text(e)})
        return
    emit_worker(w, {"loaded": True})
    if i is None:
        return
    try:
        signal.setitimer(signal.ITIMER_REAL, per)
        value = fn(*copy.deepcopy(cfg["args_list"][i]))
        signal.setitimer(signal.ITIMER_REAL, 0)
        value = jsonable(value)
        text = json.dumps(value)
        if len(text) > maxlen:
            emit_worker(w, {"status": "error", "error": "OutputTooLarge: return value over %d chars" % maxlen})
        else:
            emit_worker(w, {"status": "ok", "value": value})
    except Timeout:
        emit_worker(w, {"status": "timeout"})
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        emit_worker(w, {"status": "error", "error": err_text(e)})


# ---------------------------------------------------------------------------------------------
# The harness: one worker per call, answers checked before they become result lines
# ---------------------------------------------------------------------------------------------
def depth_ok(v, limit=CAP_VALUE_DEPTH):
    stack = [(v, 0)]
    while stack:
        x, d = stack.pop()
        if d > limit:
            return False
        if isinstance(x, list):
            stack.extend((y, d + 1) for y in x)
        elif isinstance(x, dict):
            stack.extend((y, d + 1) for y in x.values())
    return True


def read_answers(r, pid, need, deadline, cap):
    """The first `need` lines worker `pid` sent, read until they are complete, the worker has exited
    (its children may keep the pipe open), or the deadline: (parsed dicts, timed out, problem)."""
    buf = b""
    timed_out = False
    exited = False
    while buf.count(b"\n") < need:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        try:
            ready, _, _ = select.select([r], [], [], 0.0 if exited else min(left, 0.05))
        except InterruptedError:
            continue
        if not ready:
            if exited:
                break
            try:
                exited = os.waitpid(pid, os.WNOHANG)[0] == pid
            except ChildProcessError:
                exited = True
            continue
        chunk = os.read(r, 65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > cap:
            return [], False, "OutputTooLarge: the call sent more than %d bytes" % cap
    msgs = []
    for line in buf.split(b"\n")[:need]:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            return msgs, timed_out, "MalformedResult: the call's answer could not be read"
        if not isinstance(msg, dict):
            return msgs, timed_out, "MalformedResult: the call's answer could not be read"
        msgs.append(msg)
    return msgs, timed_out, None


def call_outcome(msg):
    """The result line for a worker's answer, or None when it is not a well-formed call result."""
    status = msg.get("status")
    if status == "ok" and "value" in msg:
        if not depth_ok(msg["value"]):
            return {"status": "error", "error": "ValueError: return value nested too deeply"}
        return {"status": "ok", "value": msg["value"]}
    if status == "timeout":
        return {"status": "timeout"}
    if status == "error" and isinstance(msg.get("error"), str):
        return {"status": "error", "error": msg["error"][:400]}
    return None


def fork_worker(cfg, i, workdir, weak):
    """(pid, answer pipe, setup status) of a new worker for call `i`; pid None when no process could
    be started (the model's own processes may fill the run's limits); status None when the worker
    is set up, else the setup failure."""
    r, w = os.pipe()
    sr, sw = os.pipe()
    pid = None
    for attempt in range(50):
        try:
            pid = os.fork()
            break
        except BlockingIOError:  # processes of the previous call not reaped yet
            time.sleep(0.01)
        except OSError:
            break
    if pid == 0:
        os.close(r)
        os.close(sr)
        worker(cfg, i, w, sw, workdir, weak)
    os.close(w)
    os.close(sw)
    if pid is None:
        os.close(r)
        os.close(sr)
        return None, None, None
    status = b""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sr], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(sr, 4096) if ready else b""
        if not chunk:
            break
        status += chunk
    os.close(sr)
    if status == b"ok":
        return pid, r, None
    return pid, r, status.decode("utf-8", "replace") or "worker setup: the worker died before it was set up"


def harness(cfg, out, workdir, weak):
    """Run every call in its own worker and write the checked results to `out`."""
    per = float(cfg["limits"]["per_call_s"])
    cap = 2 * int(cfg["limits"]["max_value_chars"]) + 65536
    n = len(cfg["args_list"])
    for i in list(range(n)) or [None]:
        pid, r, setup_problem = fork_worker(cfg, i, workdir, weak)
        first_worker = i is None or i == 0  # no model code has run yet: a failure here is ours
        if setup_problem is not None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
        if first_worker and (pid is None or setup_problem is not None):
            emit(out, {"setup_error": setup_problem or "could not start a worker process"})
            return
        if pid is None or setup_problem is not None:
            # Later workers can be broken by earlier calls (a removed work directory, leftover
            # processes): the model's doing.
            msgs, timed_out = [{"loaded": True}], False
            problem = "Crash: the call could not start (%s)" % (setup_problem or "no process could be started")
        else:
            need = 1 if i is None else 2  # "loaded" (or the load error), then the call's answer
            msgs, timed_out, problem = read_answers(r, pid, need, time.monotonic() + 2 * per + 0.5, cap)
            os.close(r)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
            if not weak:
                try:
                    os.kill(-1, signal.SIGKILL)  # whatever the call left behind (this uid; not the harness)
                except OSError:
                    pass
        if i is None or i == 0:
            first = msgs[0] if msgs else {}
            if "loaded" in first:
                emit(out, {"loaded": True})
            elif isinstance(first.get("load_error"), str):
                emit(out, {"load_error": first["load_error"][:400]})
                return
            elif timed_out:
                emit(out, {"load_error": "Timeout: executing the module took longer than %.1fs" % per})
                return
            elif first:
                emit(out, {"load_error": "MalformedResult: the program wrote over the sandbox's answer"})
                return
            else:
                emit(out, {"load_error": problem or "Crash: the program died before the tests ran "
                                                    "(memory, process or file limit)"})
                return
        if i is None:
            break
        answer = msgs[1] if len(msgs) > 1 else None
        line = call_outcome(answer) if isinstance(answer, dict) else None
        if line is None and msgs and isinstance(msgs[0].get("load_error"), str):
            line = {"status": "error", "error": msgs[0]["load_error"][:400]}
        if line is None:
            if timed_out:
                line = {"status": "timeout"}
            elif problem:
                line = {"status": "error", "error": problem}
            else:
                line = {"status": "error", "error": "Crash: the call died (memory, process or file limit)"}
        line["i"] = i
        emit(out, line)
    emit(out, {"done": True})


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


if __name__ == "__main__":
    main()
