"""Sandboxed execution of untrusted Python code (the coding environment's unit-test runner).

`run_calls(code, entry_point, args_list, limits)` executes `code` in fresh child processes, calls
`entry_point(*args)` once per argument list and returns the JSON-normalised return value (or the error)
of every call. Expected outputs never enter the sandbox: the caller compares values.
Modes (`SandboxLimits.mode`): "namespaces" (the default; "auto" is the same) is strong isolation or nothing: it
needs root with CAP_SYS_ADMIN, CAP_SETUID and CAP_SETGID in a user namespace, seccomp and /proc's children lists,
and without them `run_calls` raises `SandboxUnavailable` naming what is missing, never falling back; each run gets
its own namespaces, root file system, uid, seccomp filter, cgroup (or rlimits), CPU quota and wall-clock kill.
"unsafe-rlimits-only" is an explicit opt-in to NO SECURITY BOUNDARY (rlimits, the CPU quota and an audit hook).
Each call runs in its own worker process, which cannot forge result lines. A sandbox that cannot be set up raises
`SandboxSetupError` (a `SandboxError`, like `SandboxUnavailable`), never a failure of the model's code. The child
program is the package jaxagent/envs/host/sandbox_child/. docs/sandbox.md has the full contract.

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from jaxagent.envs.host.sandbox_child.common import PRELOAD
from jaxagent.envs.host.sandbox_child.seccomp import TABLES as SECCOMP_TABLES

_MARK = b"@@jaxagent-sbx "
_PARENT_GRACE_S = 10.0  # the launcher enforces wall_s; the parent only steps in if the launcher hangs
_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child")  # run as a directory
_MODES = ("namespaces", "auto", "unsafe-rlimits-only")
_CAP_SETGID, _CAP_SETUID, _CAP_SYS_ADMIN = 6, 7, 21
_HOW_TO_GET_IT = (
    "Strong isolation needs root with CAP_SYS_ADMIN, CAP_SETUID and CAP_SETGID in a user namespace that "
    "maps unprivileged uids: run as root (e.g. the CI container's root user), or, without root, inside a "
    "user namespace with a uid range (e.g. `unshare --user --map-root-user --map-auto --fork python ...`, "
    "which needs unprivileged user namespaces: `sysctl -w kernel.unprivileged_userns_clone=1` where that "
    "sysctl exists, `user.max_user_namespaces` > 0, newuidmap and /etc/subuid entries). `unshare -Ur` "
    "alone is not enough: it maps only uid 0. To run without a security boundary anyway (trusted code "
    "only), pass SandboxLimits(mode='unsafe-rlimits-only'). See docs/sandbox.md.")


class SandboxError(RuntimeError):
    """The sandbox itself failed (infrastructure): the model's code must not be scored for it."""

    infrastructure_error = True


class SandboxUnavailable(SandboxError):
    """Strong isolation is not available here and the mode does not allow running without it."""


class SandboxSetupError(SandboxError):
    """Setting up the sandbox (namespaces, mounts, cgroup, privilege drop) failed before the model's
    code started."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandbox run (all calls of one submission together)."""

    wall_s: float = 6.0  # whole run: load + every call
    per_call_s: float = 2.0  # each call (and loading the module before it) gets this much wall time
    cpu_s: int = 5  # CPU seconds of the whole run (all its processes together)
    memory_mb: int = 512  # memory of the whole run (all its processes together)
    nproc: int = 16  # processes of the run (the harness and each call's worker included)
    fsize_mb: int = 8  # RLIMIT_FSIZE; also the size of the private /tmp tmpfs
    nofile: int = 64  # RLIMIT_NOFILE
    max_value_chars: int = 100_000  # a return value whose JSON is longer counts as an error
    mode: str = "namespaces"  # "namespaces" (= "auto") | "unsafe-rlimits-only" (no security boundary)
    process_mb: int = 128  # without a cgroup: address space per process; processes = memory_mb // this
    cgroup: bool = True  # bound the run with a fresh cgroup when the machine has one

    def __post_init__(self):
        if self.mode not in _MODES:
            hint = " (the weak mode is now named 'unsafe-rlimits-only')" if self.mode == "rlimits" else ""
            raise ValueError(f"SandboxLimits.mode must be one of {_MODES}, got {self.mode!r}{hint}")
        for name in ("wall_s", "per_call_s", "cpu_s", "memory_mb", "nproc", "fsize_mb", "nofile",
                     "max_value_chars", "process_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {getattr(self, name)!r}")
        if self.nproc < 2:
            raise ValueError(f"SandboxLimits.nproc must be >= 2 (the harness and one call), got {self.nproc}")
        if self.process_mb > self.memory_mb:
            raise ValueError(f"SandboxLimits.process_mb ({self.process_mb}) exceeds memory_mb ({self.memory_mb})")

    @property
    def strong(self) -> bool:
        return self.mode != "unsafe-rlimits-only"


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
    isolation: str  # "namespaces" | "unsafe-rlimits-only"
    exit_info: str  # how the child ended, for diagnostics
    wall_s: float
    memory_bound: str = ""  # how the run's memory was bounded: "cgroup-v2" | "cgroup-v1" | "rlimits"
    cpu_s: float = 0.0  # CPU seconds the run's processes used (as last measured by the launcher)
    cpu_exceeded: bool = False  # the run was stopped at its CPU quota (limits.cpu_s)
    load_timed_out: bool = False  # load_error is the module's load running out of time (per_call_s)
    cpu_bound: str = ""  # how cpu_s was measured: "cgroup-v2" | "cgroup-v1" (every process of the run, docs/sandbox.md)
    #                      or "process-tree" (the weaker bound: misses children reaped by the kernel)


def _id_ranges(path: str) -> list[tuple[int, int]]:
    """[(first, end)) ids of this user namespace listed in /proc/self/{uid,gid}_map."""
    ranges = []
    with open(path) as f:
        for line in f:
            inside, _, count = (int(x) for x in line.split())
            ranges.append((inside, inside + count))
    return ranges


def pick_uid() -> int | None:
    """A random unprivileged uid, unused by accounts, that this namespace maps as uid and gid."""
    try:
        uids, gids = _id_ranges("/proc/self/uid_map"), _id_ranges("/proc/self/gid_map")
    except (OSError, ValueError):
        return None
    rng = random.SystemRandom()
    for lo, hi in ((200_000, 2_000_000_000), (60_000, 65_534)):
        spans = [(max(a, lo), min(b, hi)) for a, b in uids if min(b, hi) > max(a, lo)]
        spans = [(max(a, c), min(b, d)) for a, b in spans for c, d in gids if min(b, d) > max(a, c)]
        if spans:
            a, b = rng.choice(spans)
            return rng.randrange(a, b)
    return None


def strong_isolation_problem() -> str | None:
    """What this process lacks for the namespace sandbox (None when nothing is missing)."""
    if not hasattr(os, "geteuid") or not sys.platform.startswith("linux"):
        return f"the namespace sandbox needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return f"the process is not root (euid {os.geteuid()})"
    try:
        with open("/proc/self/status") as f:
            status = f.read().splitlines()
        caps = next(int(line.split()[1], 16) for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return "the effective capabilities cannot be read from /proc/self/status"
    if not os.path.exists(f"/proc/self/task/{os.getpid()}/children"):
        return ("the kernel does not list a process's children in /proc (CONFIG_PROC_CHILDREN), which the "
                "sandbox's CPU quota needs")
    if not any(line.startswith("Seccomp:") for line in status):
        return "the kernel has no seccomp (CONFIG_SECCOMP), which the sandbox's syscall filter needs"
    if platform.machine() not in SECCOMP_TABLES:
        return (f"the sandbox's syscall filter knows {', '.join(sorted(SECCOMP_TABLES))}, not "
                f"{platform.machine()}")
    missing = [name for bit, name in ((_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"), (_CAP_SETUID, "CAP_SETUID"),
                                      (_CAP_SETGID, "CAP_SETGID")) if not caps >> bit & 1]
    if missing:
        return f"root lacks the capabilities {', '.join(missing)}"
    if pick_uid() is None:
        return ("this user namespace maps no unprivileged uid/gid to run model code as (uid_map "
                "lists only root, as under `unshare -Ur`)")
    return None


def _hidden_paths() -> list[str]:
    """Directories the run's root must not show even where a bound directory holds them: this
    process's import paths (site-packages, the package's checkout, editable installs), the package's
    own directory, and the site-packages of every prefix of this interpreter: in a virtual environment
    `site.getsitepackages()` names only the venv's, while the base interpreter's (whose library directory
    the root binds) may hold the package installed, answers included. The child masks those that lie
    inside what it binds."""
    import site

    package = os.path.dirname(os.path.dirname(os.path.dirname(_CHILD)))  # the jaxagent directory
    prefixes = list(dict.fromkeys([sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]))
    paths = [package, os.path.dirname(package), *site.getsitepackages(), *site.getsitepackages(prefixes),
             site.getusersitepackages(), *sys.path]
    return [os.path.abspath(p) for p in dict.fromkeys(paths) if isinstance(p, str) and p]


def interpreter() -> str:
    """The interpreter the sandbox child runs (`python -I -S`, so no site-packages of any environment): the file
    behind `sys.executable`. A virtual environment's python is a link to its base interpreter; following it keeps
    the venv's own path (e.g. under /tmp, where the run has its private /tmp) out of the run's root. In a venv
    made with --copies, the base prefix's interpreter of the same version."""
    exe = os.path.realpath(sys.executable)
    venv = os.path.realpath(sys.prefix)
    if sys.prefix != sys.base_prefix and exe.startswith(venv + os.sep):
        for name in (os.path.basename(exe), "python%d.%d" % sys.version_info[:2]):
            base = os.path.join(sys.base_prefix, "bin", name)
            if os.path.isfile(base):
                return os.path.realpath(base)
    return exe


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


def preloads(code: str) -> list[str]:
    """The modules of `PRELOAD` that `code` names (as a whole word anywhere in its text): a strong-mode run imports
    them once, before its calls' workers fork, instead of once per call (weak mode imports all of them). Naming one
    in a comment only costs its import; a module imported without being named (e.g. by `__import__` of a built
    string) is imported inside the call, as any other module is. Importing all of them took about 25 ms per run, a
    third of a short run's time (docs/sandbox.md)."""
    words = set(re.findall(r"\w+", code))
    return [m for m in PRELOAD if m in words]


def run_calls(code: str, entry_point: str, args_list: Sequence[Sequence[Any]],
              limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` in the sandbox and call `entry_point(*args)` for each args in `args_list`.

    Never raises for anything the code does. Raises ValueError for a malformed call (non-str code,
    arguments that are not JSON-serialisable lists), `SandboxUnavailable` when the mode needs strong
    isolation that this process cannot get, `SandboxSetupError` when the sandbox failed before the
    code started (the message gives the cause).
    """
    if not isinstance(code, str) or not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ValueError("run_calls needs code: str and entry_point: a Python identifier")
    try:
        args_json = json.loads(json.dumps([list(a) for a in args_list]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"run_calls: args_list must be JSON-serialisable lists: {e}") from e
    if limits.strong:
        problem = strong_isolation_problem()
        if problem is not None:
            raise SandboxUnavailable(f"the code sandbox refuses to run model code: {problem}. {_HOW_TO_GET_IT}")
    t0 = time.monotonic()
    uid = pick_uid()
    if uid is None:
        uid = 65_534  # weak mode only: a root caller's workers drop to nobody
    cfg = {"code": code, "entry_point": entry_point, "args_list": args_json, "uid": uid,
           "mode": "namespaces" if limits.strong else "unsafe-rlimits-only", "parent_pid": os.getpid(),
           "tmp_root": tempfile.gettempdir(), "cgroup": bool(limits.cgroup), "hide": _hidden_paths(),
           "limits": dataclasses.asdict(limits),
           # weak mode: a root caller's workers run as nobody, who may not read the interpreter's own files
           "preload": preloads(code) if limits.strong else list(PRELOAD)}
    killed = False
    proc = subprocess.Popen([interpreter(), "-I", "-S", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd="/", env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                            start_new_session=True, close_fds=True)
    try:
        try:
            raw, err = proc.communicate(json.dumps(cfg).encode(), timeout=limits.wall_s + _PARENT_GRACE_S)
        except subprocess.TimeoutExpired:
            killed = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if limits.strong:
                _kill_uid(uid)
            try:
                raw, err = proc.communicate(timeout=5.0)
            except subprocess.TimeoutExpired:
                raw, err = b"", b"(the sandbox's output pipes stayed open after it was killed)"
    except BaseException:
        proc.kill()
        raise
    exit_info = f"child exit {proc.returncode}" + (" (killed by parent timeout)" if killed else "")
    err_tail = (err or b"")[-600:].decode("utf-8", "replace").strip()
    if err_tail:
        exit_info += f"; stderr tail: {err_tail}"
    return _parse_output(raw or b"", len(args_json), killed, exit_info, time.monotonic() - t0)


def _parse_output(raw: bytes, n: int, killed: bool, exit_info: str, wall: float) -> SandboxResult:
    """Turn the control channel's lines into a result; raise for a sandbox that never got the code
    running. Only the launcher, init and the harness write this channel (sandbox_child/)."""
    outcomes: dict[int, CallOutcome] = {}
    load_error = None
    load_timed_out = False
    isolation = memory_bound = cpu_bound = ""
    timed_out = killed
    cpu_used, cpu_exceeded = 0.0, False
    loaded = ready = False
    setup_error = None
    unavailable = False
    for line in raw.split(b"\n"):
        if not line.startswith(_MARK):
            continue
        try:
            msg = json.loads(line[len(_MARK):].decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            exit_info += "; an unreadable control line was ignored"
            continue
        if not isinstance(msg, dict):
            continue
        if "setup_error" in msg and setup_error is None:
            setup_error = str(msg["setup_error"])
            unavailable = bool(msg.get("unavailable"))
        elif "isolation" in msg and not isolation:
            isolation = str(msg["isolation"])
            memory_bound = str(msg.get("memory_bound", ""))
            cpu_bound = str(msg.get("cpu_bound", ""))
        elif "ready" in msg:
            ready = True
        elif "load_error" in msg and load_error is None and not loaded:
            load_error = str(msg["load_error"])
            load_timed_out = msg.get("timed_out") is True
        elif "loaded" in msg:
            loaded = True
        elif "exit" in msg:
            timed_out = timed_out or bool(msg.get("timed_out"))
            cpu_exceeded = bool(msg.get("cpu_exceeded"))
            cpu_used = float(msg.get("cpu_s") or 0.0)
            exit_info += f"; launcher saw exit {msg['exit']}"
        elif "i" in msg and isinstance(msg["i"], int) and 0 <= msg["i"] < n and msg["i"] not in outcomes:
            status = msg.get("status")
            if status == "ok":
                outcomes[msg["i"]] = CallOutcome("ok", value=msg.get("value"))
            elif status == "timeout":
                outcomes[msg["i"]] = CallOutcome("timeout", error="Timeout: the call took too long")
            else:
                outcomes[msg["i"]] = CallOutcome("error", error=str(msg.get("error")))
    if setup_error is not None:
        cls = SandboxUnavailable if unavailable else SandboxSetupError
        raise cls(f"the code sandbox could not be set up: {setup_error} ({exit_info})"
                  + (f". {_HOW_TO_GET_IT}" if unavailable else ""))
    if not ready:
        why = "it ran out of time" if timed_out else "it died"
        raise SandboxSetupError(f"the code sandbox failed before the code started ({why}): {exit_info}")
    quota = f"CPUQuota: the run used up its CPU time ({cpu_used:.2f} s of all its processes together)"
    if load_error is None and not loaded:
        load_error = (quota if cpu_exceeded else
                      "Timeout: the program ran out of time before the tests ran" if timed_out
                      else "Crash: the program died before the tests ran (memory, process or file limit)")
    if load_error is not None:
        missing = CallOutcome("not_run", error=load_error)
    elif cpu_exceeded:
        missing = CallOutcome("not_run", error=quota)
    elif timed_out:
        missing = CallOutcome("not_run", error="Timeout: the whole run ran out of time")
    else:
        missing = CallOutcome("not_run", error="Crash: the program died (memory, process or file limit)")
    full = tuple(outcomes.get(i, missing) for i in range(n))
    return SandboxResult(outcomes=full, load_error=load_error, timed_out=timed_out, isolation=isolation,
                         exit_info=exit_info, wall_s=wall, memory_bound=memory_bound, cpu_s=cpu_used,
                         cpu_exceeded=cpu_exceeded, load_timed_out=load_timed_out, cpu_bound=cpu_bound)
