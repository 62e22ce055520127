"""The worker: one call of the model's code in its own process (weak mode: rlimits and an audit hook).

No dimension legend: host-side Python, no arrays.
"""

import builtins
import copy
import io
import json
import math
import os
import signal
import sys

from .common import WEAK_BLOCKED_MODULES, err_text, set_limits


def jsonable(v, depth=0):
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
        emit_worker(w, {"load_error": "Timeout: executing the module took longer than %.1fs" % per, "timed_out": True})
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
