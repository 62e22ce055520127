"""The host rollout's env calls (`host_loop`): resets and steps on worker threads, each with a time limit,
and, in a multi-process run, the exchange of their results between the processes.

Env calls (`EnvCalls`). Each reset / step runs on one of `workers` daemon threads; its time limit counts from the
moment a worker starts it (not from submission). A call still running at its limit is abandoned: `collect` returns
an `EnvTimeout` for it at once and a fresh thread takes its worker's place. An exception that escapes a call (only
infrastructure errors do) is raised by `collect` in the caller's thread.
Several processes (`EnvCalls(..., share=EnvShare(n_ep))`). Each process steps only its own episodes
(`episode_owners`: contiguous blocks of the batch, b * P // B), and after each batch of calls `EnvShare.exchange`
gives every process every episode's result but the env state (pickled, gathered with `process_allgather`). A
time-out is decided by the one process that ran the call; an infrastructure error is raised on every process (a
`RemoteEnvFailure` naming it elsewhere); a result that cannot be pickled becomes an `EnvError` ("UnsendableResult")
on every process and fails its episode. The threads, the exchange, and why no process is left waiting in a
collective: docs/host_rollout.md, "Time limit" and "Several processes".
"""
from __future__ import annotations

import pickle
import queue
import threading
import time
from typing import Callable, NamedTuple, Optional

import numpy as np


class EnvTimeout(TimeoutError):
    """An env call gave no result within its time limit (the call was abandoned)."""


class EnvError(Exception):
    """An env exception raised on another process (its type's name and its message), or a result that could
    not be sent between processes (module docstring)."""

    def __init__(self, type_name: str, message: str):
        super().__init__(message)
        self.type_name = type_name


class RemoteEnvFailure(RuntimeError):
    """An infrastructure error raised by an env call on another process (module docstring)."""

    infrastructure_error = True


class Raised(NamedTuple):
    """An exception that escaped an env call, held until every process knows of it."""

    error: BaseException


def episode_owners(n_ep: int, n_proc: int) -> np.ndarray:
    """int [B]: the process that steps episode b, contiguous blocks b * P // B (module docstring)."""
    return (np.arange(n_ep, dtype=np.int64) * n_proc // max(n_ep, 1)).astype(np.int32)


def allgather_bytes(blob: bytes) -> list:
    """Every process's `blob`, in process order (a collective: every process calls it)."""
    from jax.experimental import multihost_utils
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([len(blob)], np.int32))).reshape(-1)
    buf = np.zeros((max(int(sizes.max()), 1),), np.uint8)
    buf[:len(blob)] = np.frombuffer(blob, np.uint8)
    all_PxL = np.asarray(multihost_utils.process_allgather(buf))
    return [all_PxL[p, :int(sizes[p])].tobytes() for p in range(sizes.shape[0])]


def _wire(res):
    """What crosses to the other processes for one result (never the env state, res[0])."""
    if isinstance(res, Raised):
        err = res.error
        return ("raised", type(err).__name__, str(err), bool(getattr(err, "infrastructure_error", False)))
    if isinstance(res, EnvTimeout):
        return ("timeout", str(res))
    if isinstance(res, BaseException):
        return ("error", getattr(res, "type_name", type(res).__name__), str(res))
    return ("ok", res[1:])


def _unwire(msg, process: int):
    kind = msg[0]
    if kind == "ok":
        return (None, *msg[1])
    if kind == "timeout":
        return EnvTimeout(msg[1])
    if kind == "error":
        return EnvError(msg[1], msg[2])
    failure = RemoteEnvFailure(f"process {process}: {msg[1]}: {msg[2]}")
    failure.infrastructure_error = msg[3]
    return Raised(failure)


class EnvShare:
    """This process's part of an SPMD rollout's env calls: which episodes it steps, and the exchange of the
    results (module docstring)."""

    def __init__(self, n_ep: int, process_index: Optional[int] = None, process_count: Optional[int] = None,
                 gather: Callable[[bytes], list] = allgather_bytes):
        if process_index is None or process_count is None:
            import jax
            process_index, process_count = jax.process_index(), jax.process_count()
        self.me, self.n_proc, self.gather = int(process_index), int(process_count), gather
        self.owner_B = episode_owners(n_ep, self.n_proc)

    def owns(self, b: int) -> bool:
        return int(self.owner_B[b]) == self.me

    def exchange(self, idx, local: dict) -> list:
        """Every episode's result, aligned with `idx`, from this process's results `local` {b: result} of its
        own episodes of `idx` (a collective: every process calls it with the same `idx`)."""
        mine = []
        for b in idx:
            if not self.owns(b):
                continue
            try:
                mine.append((int(b), pickle.dumps(_wire(local[b]), protocol=pickle.HIGHEST_PROTOCOL)))
            except Exception as err:  # noqa: BLE001 -- an unpicklable info: the episode fails everywhere
                local[b] = EnvError("UnsendableResult", f"the env result could not be sent to the other processes "
                                                        f"({type(err).__name__}: {err})")
                mine.append((int(b), pickle.dumps(_wire(local[b]))))
        theirs = {}
        for p, blob in enumerate(self.gather(pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL))):
            if p != self.me:
                for b, item in pickle.loads(blob):  # written by a process of this job: trusted
                    theirs[b] = _unwire(pickle.loads(item), p)
        out = [local[b] if self.owns(b) else theirs[int(b)] for b in idx]
        raised = [r for r in out if isinstance(r, Raised)]
        if raised:  # the same first failure on every process: its own original where it happened
            own = [r for b, r in zip(idx, out) if isinstance(r, Raised) and self.owns(b)]
            raise (own[0] if own and own[0] is raised[0] else raised[0]).error
        return out


class _Call:
    """One submitted call and what became of it (fields written under `EnvCalls._cond`)."""

    __slots__ = ("fn", "args", "started", "ended", "result", "error", "done", "abandoned")

    def __init__(self, fn, args):
        self.fn, self.args = fn, args
        self.started = self.ended = self.result = self.error = None
        self.done = self.abandoned = False


class EnvCalls:
    """Env calls on `workers` daemon threads, each with `timeout_s` seconds from its start (None: no limit);
    `share`: this process's part of a multi-process rollout (module docstring; None: one process)."""

    def __init__(self, workers: int, timeout_s: Optional[float], share: Optional[EnvShare] = None):
        self.workers, self.timeout_s, self.share = workers, timeout_s, share
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cond = threading.Condition()
        for _ in range(workers):
            self._spawn()

    def _spawn(self):
        threading.Thread(target=self._work, name="host-env", daemon=True).start()

    def _work(self):
        while True:
            call = self._queue.get()
            if call is None:
                return
            with self._cond:
                call.started = time.perf_counter()
                self._cond.notify_all()
            try:
                result, error = call.fn(*call.args), None
            except BaseException as err:  # noqa: BLE001 -- handed to the caller's thread by `collect`
                result, error = None, err
            with self._cond:
                abandoned = call.abandoned
                if not abandoned:
                    call.ended, call.result, call.error, call.done = time.perf_counter(), result, error, True
                self._cond.notify_all()
            if abandoned:
                return  # a fresh thread took this one's place when the call timed out

    def submit(self, fn: Callable, *args) -> _Call:
        call = _Call(fn, args)
        self._queue.put(call)
        return call

    def submit_for(self, b: int, fn: Callable, *args) -> Optional[_Call]:
        """`submit(fn, *args)` when this process steps episode b, else None (another process runs it)."""
        if self.share is not None and not self.share.owns(b):
            return None
        return self.submit(fn, *args)

    def _settled(self, call: _Call, now: float) -> bool:
        """The call returned, or is abandoned now that it ran past its limit (a fresh worker replaces it)."""
        if call.done or call.abandoned:
            return True
        if self.timeout_s is not None and call.started is not None and now - call.started >= self.timeout_s:
            call.abandoned, call.ended = True, call.started + self.timeout_s
            self._spawn()
            return True
        return False

    def first_done(self, batches: list, block: bool = True) -> Optional[int]:
        """The index of a batch (a list of calls) whose calls all returned or timed out; without `block`,
        None when no batch has."""
        with self._cond:
            while True:
                now = time.perf_counter()
                settled = [[self._settled(c, now) for c in calls] for calls in batches]  # marks every time-out
                for i, flags in enumerate(settled):
                    if all(flags):
                        return i
                if not block:
                    return None
                ends = [c.started + self.timeout_s for calls in batches for c in calls
                        if self.timeout_s is not None and c.started is not None and not (c.done or c.abandoned)]
                # woken at the next limit, or when a call starts or ends
                self._cond.wait(min(min(ends) - now, threading.TIMEOUT_MAX) if ends else None)

    def collect(self, calls: list, raise_errors: bool = True) -> list:
        """The calls' results in order (waited for), an `EnvTimeout` for each call past its limit; re-raises
        the first exception a call raised (held as `Raised` without `raise_errors`)."""
        self.first_done([calls])
        out = []
        for c in calls:
            if c.abandoned:
                out.append(EnvTimeout(f"no result within {self.timeout_s:g} s (the call was abandoned)"))
            elif c.error is not None:
                if raise_errors:
                    raise c.error
                out.append(Raised(c.error))
            else:
                out.append(c.result)
        return out

    def results(self, idx, calls: list) -> list:
        """Every episode's result of a batch, aligned with the episodes `idx`; `calls[i]` is None where another
        process steps idx[i] (`submit_for`). One process: `collect`; several: `EnvShare.exchange`."""
        own = [c for c in calls if c is not None]
        got = iter(self.collect(own, raise_errors=self.share is None))
        local = {int(b): next(got) for b, c in zip(idx, calls) if c is not None}
        if self.share is None:
            return [local[int(b)] for b in idx]
        return self.share.exchange([int(b) for b in idx], local)

    def close(self):
        """Drops calls not yet started and lets the idle workers exit (abandoned threads exit on their own)."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for _ in range(self.workers):
            self._queue.put(None)


def span(calls: list) -> float:
    """Wall seconds from the first call's start to the last call's end (all collected; None entries, other
    processes' calls, skipped)."""
    started = [c.started for c in calls if c is not None and c.started is not None]
    ended = [c.ended for c in calls if c is not None and c.ended is not None]
    return max(ended) - min(started) if started and ended else 0.0
