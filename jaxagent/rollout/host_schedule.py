"""The envs' side of the host rollout (`host_loop`): what runs on the worker threads (`EnvSide`: reset or
step one episode, tokenising its next chunk there), the threads with a time limit per call, the episode
groups that take turns with the model, and the per-turn wall-clock split.

Env calls (`EnvCalls`). Each reset / step runs on one of `workers` daemon threads; its time limit
counts from the moment a worker starts it (not from submission: a call queued behind busy workers is
not late). A call still running at its limit is abandoned: `collect` returns an `EnvTimeout` for it
at once, a fresh thread takes its worker's place, and the stuck thread finishes (or never does) on
its own, its result dropped. The threads are daemons, so a hung call blocks neither the rollout's
return nor the interpreter's exit. An exception that escapes a call (the host loop lets only
infrastructure errors escape) is raised by `collect` in the caller's thread.

Several processes (`EnvCalls(..., share=EnvShare(n_ep))`, multi-process SPMD runs: `host_loop` module
docstring). Each process steps only its own episodes (`episode_owners`: contiguous blocks of the batch,
b * P // B, as a mesh whose batch axes run over the processes in order holds them), so a sandboxed test
run or an SQL query executes once in the job and the env work per host falls with the number of hosts.
After each batch of calls, `EnvShare.exchange` gives every process every episode's result but the env
state: each process pickles its results (observation, info, the numbers, the next chunk's token ids; an
exception as its type name and message) into one byte string, and two `process_allgather`s (the lengths,
then the strings zero-padded to the longest) bring every process's string to every process. Env states
never leave their process (`HostTrace.final_states[b]` is None elsewhere). A time-out is decided by the
one process that ran the call and fails the episode on every process alike; nothing has to agree
any more. An infrastructure error (the sandbox failed: `infrastructure_error`) is shared too and raised
on every process (the original on its own, a `RemoteEnvFailure` naming it elsewhere), so no process is
left waiting in a collective. A result that cannot be pickled becomes an `EnvError` ("UnsendableResult")
on every process, its owner included, and fails its episode.

Groups (`episode_groups`). With G groups, episode b belongs to group b % G (interleaved, so a task's
G rollouts, which sit next to each other, spread over the groups and their step times balance); each
group has the same number of policy rows, ceil(B / G), the last rows of a short group padded with
-1 (never active), so the model compiles once per rollout.

Timing (`HostTiming`), per turn t of the rollout, in seconds of `time.perf_counter`:
  model_s[t]     the calling thread in turn t's model calls (chunk appends, decode, copy to host; a
                 scripted policy's `generate_fn`), summed over groups;
  env_s[t]       turn t's env steps, per group the span from its first step's start to its last step's
                 end (a timed-out step counts up to its limit), summed over groups;
  env_wait_s[t]  the calling thread blocked on turn t's env results: the env time the model did not hide;
  host_s[t]      the calling thread's own bookkeeping for turn t (chunks, buffers, texts, statuses);
  wall_s[t]      = model_s + env_wait_s + host_s: the calling thread's wall clock spent on turn t. The
                 turns' wall_s sum to the turn loop's wall time; without overlap env_wait_s ~= env_s,
                 with it env_wait_s < env_s by the env time spent while another group decoded.
reset_s (all before turn 0: seeds, resets, system turns, KV caches) and total_s (all of `host_rollout`)
are scalars.

Decode slots (`decode_slot_counts`, recorded per turn in `HostTiming.decode`): a decode call runs its token loop
over all of a group's policy rows until the longest sampled reply ends, so it computes rows x steps slots
(steps = the longest reply's length) whatever each row needs. Per turn, summed over groups:
  slots      rows x steps of every decode call;
  generated  the sampled replies' tokens (the useful slots);
  tail       sum over sampled rows of (steps - its reply's length): rows whose reply ended waiting for the longest;
  finished   (live rows not sampled) x steps: episodes already finished (or replying with a given text);
  padding    (the group's padding rows) x steps.
slots = generated + tail + finished + padding; `HostTiming.summary` gives the totals and the shares of slots
(decode_finished_share is the long tail of multi-turn rollouts: slots spent on episodes that are over).

Dimension legend (CONVENTIONS.md): N turns (T_max), B episodes (the rows of a group's policy).
"""
from __future__ import annotations

import dataclasses
import pickle
import queue
import threading
import time
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from jaxagent.envs.jax.budgets import budget_text
from jaxagent.models import chat
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rollout import episode


def error_text(where: str, err: BaseException) -> str:
    return f"{where}: {getattr(err, 'type_name', type(err).__name__)}: {err}"


@dataclasses.dataclass(frozen=True)
class EnvSide:
    """What runs on the worker threads: reset or step one episode and build its next chunk (thread-safe:
    no shared state is written; an env exception is returned, an infrastructure error raised)."""

    env: Any
    tokenizer: Tokenizer
    pieces: Any                 # chat.turn_pieces
    tasks: list
    seeds: list
    budget_B: np.ndarray
    hide_budget: bool
    budget_template: str
    system_fn: Callable          # (env, task) -> (system content, tools)
    process_reward_fn: Optional[Callable]  # (env, state, action_text, remaining) -> float

    def budget(self, b: int, t: int) -> Optional[str]:
        return None if self.hide_budget else budget_text(t, int(self.budget_B[b]), self.budget_template)

    def reset(self, b):
        """Reset episode b and build its first chunk: (state, obs, system ids, rest) or the exception."""
        try:
            state, obs = self.env.reset(self.seeds[b], self.tasks[b])
            content, tools = self.system_fn(self.env, self.tasks[b])
            sys_ids = chat.system_turn(self.tokenizer, content, tools)
            return state, obs, sys_ids, episode.host_first_chunk(self.tokenizer, self.pieces, obs, self.budget(b, 0))
        except Exception as err:  # noqa: BLE001 -- an env failure ends only its own episode
            if getattr(err, "infrastructure_error", False):
                raise  # the sandbox failed, not the model: never score it as the model's 0
            return err

    def step(self, b, t, state, text, closed):
        """Step episode b at turn t and build its next chunk (None when the episode ends here):
        (state, obs, info, (reward, done, valid, success, anchor, process reward), chunk) or the
        exception raised (by the env, or on its malformed output)."""
        try:
            remaining = int(self.budget_B[b]) - t
            proc = 0.0 if self.process_reward_fn is None else float(
                self.process_reward_fn(self.env, state, text, remaining))
            state, obs, reward, done, info = self.env.step(state, text)
            if not isinstance(info, dict):
                raise TypeError(f"env.step returned info of type {type(info).__name__}, expected dict")
            nums = (float(reward), bool(done), bool(info.get("valid", True)), bool(info.get("success", False)),
                    int(info.get("anchor", -1)), proc)
            chunk = None
            if not nums[1] and not episode.out_of_budget(t, self.budget_B[b]):
                chunk = episode.host_next_chunk(self.tokenizer, self.pieces, obs, info.get("obs_role", "user"),
                                                self.budget(b, t + 1), closed)
            return state, obs, info, nums, chunk
        except Exception as err:  # noqa: BLE001
            if getattr(err, "infrastructure_error", False):
                raise
            return err


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


class InFlight(NamedTuple):
    """A group's turn whose env steps are running."""

    t: int
    idx: np.ndarray             # the active episodes
    calls: list                 # their env calls (`EnvCalls.submit_for`: None where another process steps it)
    start_slot: np.ndarray
    replies: tuple
    texts: dict
    is_forced: np.ndarray


@dataclasses.dataclass
class Group:
    """Episodes that take their turns together: policy rows (episode ids, -1 pads), the group's policy
    (None with `generate_fn`), its next turn and its turn in flight."""

    rows: np.ndarray
    member: np.ndarray          # bool [B]
    policy: Any                 # HostPolicy, or None
    t: int = 0
    inflight: Optional[InFlight] = None


def span(calls: list) -> float:
    """Wall seconds from the first call's start to the last call's end (all collected; None entries, other
    processes' calls, skipped)."""
    started = [c.started for c in calls if c is not None and c.started is not None]
    ended = [c.ended for c in calls if c is not None and c.ended is not None]
    return max(ended) - min(started) if started and ended else 0.0


def episode_groups(n_ep: int, n_groups: int) -> list:
    """The episodes of each group as policy rows: int arrays [ceil(n_ep / G)], -1 for padding rows."""
    n_groups = max(1, min(n_groups, n_ep))
    rows = -(-n_ep // n_groups)
    out = []
    for g in range(n_groups):
        eps = np.arange(g, n_ep, n_groups)
        out.append(np.concatenate([eps, np.full((rows - len(eps),), -1, eps.dtype)]).astype(np.int64))
    return out


DECODE_KINDS = ("slots", "generated", "tail", "finished", "padding")


def decode_slot_counts(n_rows: int, n_padding: int, sampled_lengths) -> dict:
    """One decode call's slots split as in the module docstring: `n_rows` policy rows of which `n_padding` are
    padding, `sampled_lengths` the reply lengths (stop token included) of the rows it sampled. The token loop runs
    steps = max(sampled_lengths) (0 when none is sampled): slots = n_rows x steps, generated = sum of the lengths,
    tail = sum (steps - length), finished = (n_rows - n_padding - sampled) x steps, padding = n_padding x steps."""
    lengths = np.asarray(sampled_lengths, np.int64).reshape(-1)
    if n_padding < 0 or lengths.size + n_padding > n_rows or (lengths < 0).any():
        raise ValueError(f"{lengths.size} sampled and {n_padding} padding rows do not fit {n_rows} rows "
                         "(or a length is negative)")
    steps = int(lengths.max()) if lengths.size else 0
    return {"slots": n_rows * steps, "generated": int(lengths.sum()), "tail": int((steps - lengths).sum()),
            "finished": (n_rows - n_padding - lengths.size) * steps, "padding": n_padding * steps}


@dataclasses.dataclass
class HostTiming:
    """Per-turn wall seconds of a host rollout, split into model vs env, and its decode slots (module docstring)."""

    model_s: np.ndarray         # f64 [N]
    env_s: np.ndarray           # f64 [N]
    env_wait_s: np.ndarray      # f64 [N]
    host_s: np.ndarray          # f64 [N]
    n_groups: int = 1
    reset_s: float = 0.0
    total_s: float = 0.0
    decode: Optional[dict] = None  # {kind: int64 [N]} for kind in DECODE_KINDS (zeros until recorded)

    def __post_init__(self):
        if self.decode is None:
            self.decode = {k: np.zeros(np.shape(self.model_s), np.int64) for k in DECODE_KINDS}

    def add_decode(self, t: int, n_rows: int, n_padding: int, sampled_lengths):
        for k, v in decode_slot_counts(n_rows, n_padding, sampled_lengths).items():
            self.decode[k][t] += v

    @property
    def wall_s(self) -> np.ndarray:
        return self.model_s + self.env_wait_s + self.host_s

    def summary(self) -> dict[str, Any]:
        """Totals over the turns, for a metrics log: model_s, env_s, env_wait_s, host_s, wall_s, reset_s,
        total_s, hidden_env_s = max(0, env_s - env_wait_s) (env time spent while the model decoded), and the decode
        slots' totals and shares (`decode_shares`)."""
        out = {k: float(getattr(self, k).sum()) for k in ("model_s", "env_s", "env_wait_s", "host_s", "wall_s")}
        out.update(reset_s=float(self.reset_s), total_s=float(self.total_s), n_groups=self.n_groups,
                   hidden_env_s=max(0.0, out["env_s"] - out["env_wait_s"]))
        out.update(decode_shares(self.decode))
        return out


def decode_shares(decode: dict) -> dict:
    """Totals of per-turn decode slot counts ({kind: [N]}) as decode_<kind>, and decode_<kind>_share = the
    kind's share of all slots (None when no slot was decoded)."""
    tot = {k: int(np.sum(decode[k])) for k in DECODE_KINDS}
    out = {f"decode_{k}": v for k, v in tot.items()}
    for k in DECODE_KINDS[1:]:
        out[f"decode_{k}_share"] = tot[k] / tot["slots"] if tot["slots"] else None
    return out


class TurnClock:
    """Attributes the calling thread's wall clock to (kind, turn) segments: each `lap` ends one segment."""

    KINDS = ("model_s", "env_wait_s", "host_s")

    def __init__(self, t_max: int, t0: float):
        self.timing = HostTiming(*(np.zeros((t_max,)) for _ in range(4)))
        self.t0 = self.last = t0

    def lap(self, kind: str, t: int):
        now = time.perf_counter()
        getattr(self.timing, kind)[t] += now - self.last
        self.last = now

    def reset_done(self):
        now = time.perf_counter()
        self.timing.reset_s, self.last = now - self.t0, now

    def add_env(self, t: int, seconds: float):
        self.timing.env_s[t] += seconds

    def finish(self, n_groups: int) -> HostTiming:
        self.timing.total_s, self.timing.n_groups = time.perf_counter() - self.t0, n_groups
        return self.timing
