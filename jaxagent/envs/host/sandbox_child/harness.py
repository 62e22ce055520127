"""The harness: one worker per call, answers checked before they become result lines.

No dimension legend: host-side Python, no arrays.
"""

import json
import os
import select
import signal
import time

from .common import CAP_VALUE_DEPTH, emit
from .worker import worker


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
                emit(out, {"load_error": first["load_error"][:400], "timed_out": first.get("timed_out") is True})
                return
            elif timed_out:
                emit(out, {"load_error": "Timeout: executing the module took longer than %.1fs" % per,
                           "timed_out": True})
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
            # a load that ran out of time in this call's worker is the call's time-out (a result that depends on
            # time, which the caller must not keep)
            line = ({"status": "timeout"} if msgs[0].get("timed_out") is True else
                    {"status": "error", "error": msgs[0]["load_error"][:400]})
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
