"""Sandboxed execution of untrusted Python code (the coding environment's unit-test runner).

`run_calls(code, entry_point, args_list, limits)` executes `code` in a fresh child interpreter, calls
`entry_point(*args)` once per argument list and returns the JSON-normalised return value (or the error)
of every call. Expected outputs never enter the sandbox: the caller compares values, so code that
tampers with the harness cannot fake a pass without producing the right values.

No dimension legend: host-side Python, no arrays.

Isolation, strong mode ("namespaces"; used when the parent runs as root and the kernel allows it, the
case in this project's CI). The parent starts `python -I -S -c <child source>` with no `preexec_fn`
(safe in a threaded parent such as a JAX process); the child is three processes:
  1. launcher (root, host pid namespace): `unshare(NEWNS | NEWNET | NEWPID | NEWIPC)`.
     - network: the new net namespace has only a loopback that is down, so every connect fails
       (ENETUNREACH), local services of the host included.
     - files: mounts become private; fresh size-limited tmpfs are mounted over the world-writable
       directories (/tmp, /var/tmp, /dev/shm, /run/lock). The work directory is /tmp/work on that tmpfs:
       it is thrown away with the namespace. Everything else is protected by the uid switch below (the
       sandbox uid owns nothing outside its work directory). If the interpreter lives under a directory
       others cannot traverse (pyenv under a 0700 /root), a tmpfs is put over that directory and the
       interpreter prefix bind-mounted back read-only, so the unprivileged child can still import the
       standard library (and cannot see the rest of that directory).
  2. init (root, pid 1 of the new pid namespace): mounts a fresh /proc, reaps, exits with the runner.
  3. runner: setrlimit (address space, CPU seconds, file size, open files, no core files, process
     count), `setgroups([])`, `setgid`/`setuid` to a uid drawn at random per run from a high range (so
     RLIMIT_NPROC counts only this run's processes, and it is enforced: it is not for root),
     PR_SET_NO_NEW_PRIVS, then runs the code. The launcher enforces the wall-clock limit by killing
     init, and the kernel then kills every process of the pid namespace (fork bombs included). The
     parent keeps a backup timeout (kill the launcher's session, then every process of the run's uid).
Reading is limited only by file permissions (world-readable files stay readable). Expected outputs
are never sent to the child, but feedback that shows failing tests lets a policy memorise them (as in
DeepCoder-MT); that is a property of the task design, not of the sandbox.
Weak mode ("rlimits"; not root, or namespaces refused): the same rlimits in one child process
(RLIMIT_NPROC is enforced for a non-root user), a throwaway `mkdtemp` work directory, and a
`sys.addaudithook` hook that refuses socket creation and opening files for writing outside the work
directory. Weak mode only stops Python-level escapes (ctypes can get around it); prefer strong mode.
`SandboxResult.isolation` says which mode ran.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

_MARK = "@@jaxagent-sbx "
_PARENT_GRACE_S = 10.0  # the launcher enforces wall_s; the parent only steps in if the launcher hangs


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandbox run (all calls of one submission together)."""

    wall_s: float = 6.0  # whole run: load + every call
    per_call_s: float = 2.0  # each call (and loading the module) gets this much wall time
    cpu_s: int = 5  # RLIMIT_CPU of the runner
    memory_mb: int = 512  # RLIMIT_AS of the runner
    nproc: int = 16  # RLIMIT_NPROC of the sandbox uid
    fsize_mb: int = 8  # RLIMIT_FSIZE; also the size of the private /tmp tmpfs
    nofile: int = 64  # RLIMIT_NOFILE
    max_value_chars: int = 100_000  # a return value whose JSON is longer counts as an error
    mode: str = "auto"  # "auto" | "namespaces" | "rlimits"

    def __post_init__(self):
        if self.mode not in ("auto", "namespaces", "rlimits"):
            raise ValueError(f"SandboxLimits.mode must be auto|namespaces|rlimits, got {self.mode!r}")
        for name in ("wall_s", "per_call_s", "cpu_s", "memory_mb", "nproc", "fsize_mb", "nofile"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class CallOutcome:
    """One call's result: status 'ok' (value holds the JSON-normalised return value), 'error'
    (error holds 'ExcType: message'), 'timeout', or 'not_run' (the run died or ran out of time first)."""

    status: str
    value: Any = None
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    outcomes: tuple[CallOutcome, ...]
    load_error: str | None  # the module failed to execute or lacks the entry point
    timed_out: bool  # the wall-clock limit of the whole run was hit
    isolation: str  # "namespaces" | "rlimits"
    exit_info: str  # how the child ended, for diagnostics
    wall_s: float


# ---------------------------------------------------------------------------------------------
# Child source. Runs in a fresh `python -I -S` interpreter; reads its JSON config from stdin and
# writes result lines (prefixed with _MARK) to fd 1, which is a file owned by the parent.
# ---------------------------------------------------------------------------------------------
_CHILD_SOURCE = r'''
import json, os, sys, signal, resource, time
MARK = "@@jaxagent-sbx "
cfg = json.loads(sys.stdin.read())
os.close(0)
os.open(os.devnull, os.O_RDONLY)
out_fd = 1
notes = []

def emit(obj):
    try:
        os.write(out_fd, (MARK + json.dumps(obj) + "\n").encode())
    except OSError:
        pass

PRELOAD = ("collections", "heapq", "bisect", "itertools", "functools", "math", "re", "string", "typing",
           "dataclasses", "fractions", "decimal", "statistics", "random", "operator", "copy", "array",
           "datetime", "enum", "io", "traceback", "cmath", "numbers", "textwrap", "unicodedata")

def set_limits():
    L = cfg["limits"]
    mb = 1024 * 1024
    for res, val in ((resource.RLIMIT_AS, L["memory_mb"] * mb), (resource.RLIMIT_CPU, L["cpu_s"]),
                     (resource.RLIMIT_FSIZE, L["fsize_mb"] * mb), (resource.RLIMIT_NOFILE, L["nofile"]),
                     (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, L["nproc"])):
        resource.setrlimit(res, (val, val))

def run_calls(workdir):
    """Execute the solution and each call; runs as the unprivileged sandbox user."""
    import builtins, copy, math, io, traceback
    os.chdir(workdir)
    class Timeout(BaseException):
        pass
    def on_alarm(signum, frame):
        raise Timeout()
    signal.signal(signal.SIGALRM, on_alarm)
    class Sink(io.TextIOBase):
        def write(self, s):
            return len(s)
        def writable(self):
            return True
    sink = Sink()
    devnull = os.open(os.devnull, os.O_WRONLY)
    global out_fd
    out_fd = os.dup(1)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = sys.stderr = sink
    sys.setrecursionlimit(3000)
    per = float(cfg["limits"]["per_call_s"])
    maxlen = int(cfg["limits"]["max_value_chars"])

    def err_text(e):
        msg = str(e)
        if len(msg) > 300:
            msg = msg[:300] + "..."
        return type(e).__name__ + (": " + msg if msg else "")

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

    ns = {"__name__": "solution", "__builtins__": builtins}
    signal.setitimer(signal.ITIMER_REAL, per)
    try:
        code = compile(cfg["code"], "<solution>", "exec")
        exec(code, ns)
        signal.setitimer(signal.ITIMER_REAL, 0)
        fn = ns.get(cfg["entry_point"])
        if not callable(fn):
            emit({"load_error": "NameError: function %r is not defined" % cfg["entry_point"]})
            return
    except Timeout:
        emit({"load_error": "Timeout: executing the module took longer than %.1fs" % per})
        return
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(e, SyntaxError):
            emit({"load_error": "SyntaxError: %s (line %s)" % (e.msg, e.lineno)})
        else:
            emit({"load_error": err_text(e)})
        return
    emit({"loaded": True})
    for i, args in enumerate(cfg["args_list"]):
        try:
            signal.setitimer(signal.ITIMER_REAL, per)
            value = fn(*copy.deepcopy(args))
            signal.setitimer(signal.ITIMER_REAL, 0)
            value = jsonable(value)
            text = json.dumps(value)
            if len(text) > maxlen:
                emit({"i": i, "status": "error", "error": "OutputTooLarge: return value over %d chars" % maxlen})
            else:
                emit({"i": i, "status": "ok", "value": value})
        except Timeout:
            emit({"i": i, "status": "timeout"})
        except BaseException as e:
            signal.setitimer(signal.ITIMER_REAL, 0)
            emit({"i": i, "status": "error", "error": err_text(e)})
    emit({"done": True})

def weak_mode(workdir):
    """Rlimits plus an audit hook; one process. Python-level protection only."""
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
                   "os.utime": 1, "shutil.rmtree": 1, "shutil.move": 2, "shutil.copyfile": 2}
    me = os.getpid()
    banned = ("socket.__new__", "socket.connect", "socket.bind", "subprocess.Popen", "os.system",
              "os.exec", "os.posix_spawn", "os.spawn", "ctypes.dlopen", "ctypes.dlsym", "os.fork",
              "os.forkpty", "pty.spawn")
    def hook(event, args):
        if event in banned:
            raise PermissionError("sandbox: %s is disabled" % event)
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
    if os.geteuid() == 0:
        # Root without namespaces: still drop to the run's own uid (RLIMIT_NPROC is then enforced and
        # root-owned files are protected). Lazy stdlib imports may fail if the interpreter's prefix is
        # not readable by others, so import the usual modules first.
        for name in PRELOAD:
            try:
                __import__(name)
            except ImportError:
                pass
        uid = int(cfg["uid"])
        os.chown(workdir, uid, uid)
        set_limits()
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    else:
        set_limits()
    sys.addaudithook(hook)
    run_calls(workdir)

def strong_mode():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
        1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
    CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x08000000, 0x20000000, 0x40000000

    def mount(src, dst, fstype, flags, data=None):
        enc = lambda s: None if s is None else s.encode()
        if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
            raise OSError(ctypes.get_errno(), "mount %s on %s failed" % (src, dst))

    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")
    L = cfg["limits"]
    uid = int(cfg["uid"])
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    size = "size=%dm,mode=1777" % max(1, int(L["fsize_mb"]))
    # Make the interpreter's prefix readable when an ancestor is not traversable by others.
    prefix = os.path.realpath(sys.base_prefix)
    blocked = None
    parts = prefix.strip("/").split("/")
    for k in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:k])
        if not (os.stat(d).st_mode & 0o001):
            blocked = d
            break
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size)
    if blocked is not None and not "/tmp".startswith(blocked):
        stage = "/tmp/.prefix"
        os.mkdir(stage)
        mount(prefix, stage, None, MS_BIND | MS_REC)
        mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        os.makedirs(prefix, exist_ok=True)
        mount(stage, prefix, None, MS_BIND | MS_REC)
        try:
            mount(None, prefix, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        except OSError:
            notes.append("prefix bind not read-only")
        libc.umount2(stage.encode(), 2)  # MNT_DETACH
        os.rmdir(stage)
        notes.append("prefix rebound")
    for d in ("/var/tmp", "/dev/shm", "/run/lock"):
        if os.path.isdir(d) and not os.path.islink(d):
            try:
                mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=1777")
            except OSError:
                notes.append("no tmpfs on " + d)
    workdir = "/tmp/work"
    os.mkdir(workdir, 0o700)
    os.chown(workdir, uid, uid)
    emit({"isolation": "namespaces", "notes": notes})

    init_pid = os.fork()
    if init_pid == 0:
        # pid 1 of the new pid namespace: fresh /proc, then fork the runner and reap.
        try:
            try:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            except OSError:
                pass
            runner = os.fork()
            if runner == 0:
                try:
                    set_limits()
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
                    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG = SIGKILL
                    run_calls(workdir)
                except BaseException as e:
                    emit({"crash": type(e).__name__ + ": " + str(e)[:300]})
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
            os._exit(code if code >= 0 else 128 - code)
        finally:
            os._exit(1)

    flag = []
    def on_alarm(signum, frame):
        flag.append(1)
        os.kill(init_pid, signal.SIGKILL)  # pid 1 dies: the kernel kills the whole pid namespace
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(L["wall_s"]))
    _, status = os.waitpid(init_pid, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    timed_out = bool(flag)
    emit({"exit": os.waitstatus_to_exitcode(status), "timed_out": timed_out})

mode = cfg["mode"]
if mode in ("auto", "namespaces") and os.geteuid() == 0:
    try:
        strong_mode()
        os._exit(0)
    except Exception as e:
        if mode == "namespaces":
            emit({"setup_error": "namespaces unavailable: " + str(e)})
            os._exit(3)
        notes.append("fallback: " + str(e))
elif mode == "namespaces":
    emit({"setup_error": "namespace isolation needs root"})
    os._exit(3)
os.makedirs(cfg["workdir"], mode=0o700, exist_ok=True)
emit({"isolation": "rlimits", "notes": notes})
weak_mode(cfg["workdir"])
emit({"exit": 0, "timed_out": False})
'''


def _pick_uid() -> int:
    """A random uid that no account uses and that the current user namespace maps (uid_map)."""
    ranges = []
    try:
        with open("/proc/self/uid_map") as f:
            for line in f:
                inside, _, count = (int(x) for x in line.split())
                ranges.append((inside, inside + count))
    except (OSError, ValueError):
        ranges = [(0, 65536)]
    rng = random.SystemRandom()
    for lo, hi in ((200_000, 2_000_000_000), (60_000, 65_534)):
        spans = [(max(a, lo), min(b, hi)) for a, b in ranges if min(b, hi) > max(a, lo)]
        if spans:
            a, b = rng.choice(spans)
            return rng.randrange(a, b)
    return 65_534  # nobody


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is `uid` (cleanup after a run killed from outside)."""
    for _ in range(5):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) == uid:
                                found = True
                                os.kill(int(entry), signal.SIGKILL)
                            break
            except (OSError, ValueError):
                continue
        if not found:
            return
        time.sleep(0.01)


def run_calls(code: str, entry_point: str, args_list: Sequence[Sequence[Any]],
              limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` in the sandbox and call `entry_point(*args)` for each args in `args_list`.

    Never raises for anything the code does; raises ValueError for a malformed call (non-str code,
    arguments that are not JSON-serialisable lists).
    """
    if not isinstance(code, str) or not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ValueError("run_calls needs code: str and entry_point: a Python identifier")
    try:
        args_json = json.loads(json.dumps([list(a) for a in args_list]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"run_calls: args_list must be JSON-serialisable lists: {e}") from e
    t0 = time.monotonic()
    n = len(args_json)
    uid = _pick_uid()
    private = tempfile.mkdtemp(prefix="jaxagent-sbx-")  # parent-owned: output files
    os.chmod(private, 0o711)  # traversable, so weak mode's unprivileged child reaches its work dir
    workdir = os.path.join(private, "work")  # weak mode's work directory
    os.mkdir(workdir, 0o700)
    cfg = {"code": code, "entry_point": entry_point, "args_list": args_json, "uid": uid,
           "workdir": workdir, "mode": limits.mode, "limits": dataclasses.asdict(limits)}
    out_path = os.path.join(private, "out")
    err_path = os.path.join(private, "err")
    killed = False
    exit_info = ""
    try:
        with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CHILD_SOURCE],
                stdin=subprocess.PIPE, stdout=out_f, stderr=err_f, cwd=private,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True, close_fds=True)
            try:
                proc.stdin.write(json.dumps(cfg).encode())
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                proc.wait(timeout=limits.wall_s + _PARENT_GRACE_S)
            except subprocess.TimeoutExpired:
                killed = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
            exit_info = f"child exit {proc.returncode}" + (" (killed by parent timeout)" if killed else "")
        with open(out_path, "rb") as f:
            raw = f.read(8 * 1024 * 1024)
        with open(err_path, "rb") as f:
            f.seek(max(0, os.path.getsize(err_path) - 600))
            err_tail = f.read().decode("utf-8", "replace").strip()
        if err_tail:
            exit_info += f"; stderr tail: {err_tail}"
    finally:
        if killed:
            _kill_uid(uid)
        shutil.rmtree(private, ignore_errors=True)
    return _parse_output(raw, n, killed, exit_info, time.monotonic() - t0)


def _parse_output(raw: bytes, n: int, killed: bool, exit_info: str, wall: float) -> SandboxResult:
    outcomes: dict[int, CallOutcome] = {}
    load_error = None
    isolation = "rlimits"
    timed_out = killed
    loaded = False
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith(_MARK):
            continue
        try:
            msg = json.loads(line[len(_MARK):])
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        if "isolation" in msg:
            isolation = str(msg["isolation"])
        elif "load_error" in msg and load_error is None and not loaded:
            load_error = str(msg["load_error"])
        elif "loaded" in msg:
            loaded = True
        elif "setup_error" in msg:
            exit_info += f"; setup error: {msg['setup_error']}"
        elif "crash" in msg:
            exit_info += f"; runner crash: {msg['crash']}"
        elif "exit" in msg:
            timed_out = timed_out or bool(msg.get("timed_out"))
            exit_info += f"; runner exit {msg['exit']}"
        elif "i" in msg and isinstance(msg["i"], int) and 0 <= msg["i"] < n and msg["i"] not in outcomes:
            status = msg.get("status")
            if status == "ok":
                outcomes[msg["i"]] = CallOutcome("ok", value=msg.get("value"))
            elif status == "timeout":
                outcomes[msg["i"]] = CallOutcome("timeout", error="Timeout: the call took too long")
            else:
                outcomes[msg["i"]] = CallOutcome("error", error=str(msg.get("error")))
    if load_error is None and not loaded:
        load_error = ("Timeout: the program ran out of time before the tests ran" if timed_out
                      else "Crash: the program died before the tests ran (memory, process or file limit)")
    if load_error is not None:
        missing = CallOutcome("not_run", error=load_error)
    elif timed_out:
        missing = CallOutcome("not_run", error="Timeout: the whole run ran out of time")
    else:
        missing = CallOutcome("not_run", error="Crash: the program died (memory, process or file limit)")
    full = tuple(outcomes.get(i, missing) for i in range(n))
    return SandboxResult(outcomes=full, load_error=load_error, timed_out=timed_out, isolation=isolation,
                         exit_info=exit_info, wall_s=wall)
