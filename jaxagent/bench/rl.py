"""One RL iteration of the study (`rl.loop.rl_iteration`: rollout, advantages, the update) timed phase by phase,
with the decode slots its rollout spent on finished episodes (`longtail`).

Each phase is timed directly around its own call, blocked on its output: the rollout (`runtime.rollout_fn`), the
trainer's pre-update log-probs when the iteration computes them (`runtime.logprobs_fn`: several updates with TIS),
and every update (`runtime.train_step`). The iteration's wall clock is timed around the whole `rl_iteration` call,
so the phases are disjoint parts of it and `other_s` = iteration - phases (advantages, batch slicing, host
metrics) is never negative. A separate old-log-probs pass (`old_logprobs_fn`, the trainer's forward over the
rollout, as an iteration with several updates would run it) is timed after the iteration and reported beside it,
outside the iteration's split when this iteration does not use it.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import jax

from jaxagent.bench.longtail import long_tail
from jaxagent.rl.loop import RLSettings, rl_iteration


class _Clock:
    """Seconds per phase, each call timed alone and blocked on its output."""

    def __init__(self):
        self.s: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, fn: Optional[Callable]) -> Optional[Callable]:
        if fn is None:
            return None

        def timed_call(*args, **kwargs):
            t0 = time.perf_counter()
            out = jax.block_until_ready(fn(*args, **kwargs))
            self.s[name] = self.s.get(name, 0.0) + time.perf_counter() - t0
            self.calls[name] = self.calls.get(name, 0) + 1
            return out
        return timed_call


def timed_iteration(state, runtime, settings: RLSettings, sample_tasks_fn: Callable, t_max: int, *,
                    n_groups: int = 1, old_logprobs_fn: Optional[Callable] = None) -> tuple:
    """Runs one `rl_iteration` with `runtime` (`stages.ArmRuntime`); returns (state, record). `n_groups`: the
    rollout's episode groups (host presets' `overlap_groups`; 1 for the JAX loop), for the slot accounting."""
    clock = _Clock()
    t0 = time.perf_counter()
    state, metrics, ro = rl_iteration(
        state, rollout_fn=clock.wrap("rollout", runtime.rollout_fn), sample_tasks_fn=sample_tasks_fn,
        train_step=clock.wrap("update", runtime.train_step), settings=settings, t_max=t_max,
        values_fn=clock.wrap("values", runtime.values_fn), logprobs_fn=clock.wrap("old_logprobs", runtime.logprobs_fn))
    state = jax.block_until_ready(state)
    total = time.perf_counter() - t0
    phases = {k: clock.s.get(k, 0.0) for k in ("rollout", "old_logprobs", "values", "update")}
    rec = {"bench": "rl_iteration", "episodes": settings.batch_size, "updates": clock.calls.get("update", 0),
           "iteration_s": total, **{f"{k}_s": v for k, v in phases.items()},
           "other_s": total - sum(phases.values()),
           **{f"{k}_share": v / total for k, v in phases.items()},
           "old_logprobs_in_iteration": "old_logprobs" in clock.s,
           "success_rate": metrics["success_rate"], "mean_turns": metrics["mean_turns"],
           "mean_generated_tokens": metrics["mean_generated_tokens"], "loss": metrics.get("loss"),
           **long_tail(ro, n_groups)}
    if old_logprobs_fn is not None:
        t1 = time.perf_counter()
        jax.block_until_ready(old_logprobs_fn(state.params, ro.tokens))
        rec["separate_old_logprobs_s"] = time.perf_counter() - t1
    return state, rec
