"""The per-turn wall-clock split of a host rollout (`host_loop`) into model vs env time, and the decode
slots each turn computed: `HostTiming`, `decode_slot_counts`.

Timing, per turn t, seconds of `time.perf_counter`: model_s[t] (the calling thread in the turn's model calls),
env_s[t] (the turn's env steps, per group first start to last end), env_wait_s[t] (the calling thread blocked on
env results: the env time the model did not hide), host_s[t] (the thread's own bookkeeping), and
    wall_s[t] = model_s[t] + env_wait_s[t] + host_s[t];
scalars reset_s (before turn 0) and total_s (all of `host_rollout`).
Decode slots, per turn summed over groups: a decode call computes rows x steps slots (steps = its longest reply), so
    slots = generated + tail + finished + padding
(the sampled tokens; rows whose reply ended waiting for the longest; rows of finished episodes or given replies;
padding rows). `HostTiming.summary` gives totals and shares (decode_finished_share: the long tail of multi-turn
rollouts). Each quantity in full: docs/host_rollout.md, "Timing and decode slots".

Dimension legend (CONVENTIONS.md): N turns (T_max).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import numpy as np


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
