"""The long tail of multi-turn rollouts: decode slots spent on episodes that are already over, read from any
`Rollout` (the JAX loop's or the host loop's) after the fact.

Dimension legend (CONVENTIONS.md): B episodes, N turns (T_max).

Each turn, each episode group decodes once over all its policy rows, and the token loop runs until its longest
sampled reply ends (`sampling.decode`: a `while_loop` on "some row not done"). So turn t of group g costs
rows_g x steps_{t,g} slots, steps_{t,g} = max over the rows sampled at t (active and not forced) of
`turns.span_len`, and the slots split as `host_timing.decode_slot_counts` defines (generated, tail, finished,
padding; the host loop records the same counts while it runs, `HostTiming.decode`). The JAX loop decodes the whole
batch as one group; the host loop's groups are `host_schedule.episode_groups(B, overlap_groups)`.
"""
from __future__ import annotations

import numpy as np

from jaxagent.rollout.host_schedule import episode_groups
from jaxagent.rollout.host_timing import DECODE_KINDS, decode_shares, decode_slot_counts
from jaxagent.rollout.types import Rollout


def decode_slots_per_turn(ro: Rollout, n_groups: int = 1) -> dict:
    """{kind: int64 [N]} for kind in `DECODE_KINDS`, summed over the episode groups (module docstring)."""
    active_BxN, forced_BxN, len_BxN = (np.asarray(x) for x in (ro.turns.active, ro.turns.forced, ro.turns.span_len))
    n_ep, n_turns = active_BxN.shape
    out = {k: np.zeros((n_turns,), np.int64) for k in DECODE_KINDS}
    sampled_BxN = active_BxN & ~forced_BxN
    for rows in episode_groups(n_ep, n_groups):
        live = rows[rows >= 0]
        for t in range(n_turns):
            lengths = len_BxN[live, t][sampled_BxN[live, t]]
            for k, v in decode_slot_counts(len(rows), len(rows) - len(live), lengths).items():
                out[k][t] += v
    return out


def long_tail(ro: Rollout, n_groups: int = 1) -> dict:
    """Totals and shares of the rollout's decode slots (`host_timing.decode_shares`), and per turn the fraction
    of episodes still playing (`active_fraction_per_turn`) and the slots (`decode_slots_per_turn`)."""
    per_turn = decode_slots_per_turn(ro, n_groups)
    out = decode_shares(per_turn)
    out["active_fraction_per_turn"] = np.asarray(ro.turns.active).mean(axis=0).round(4).tolist()
    out["decode_slots_per_turn"] = per_turn["slots"].tolist()
    return out


def finished_share_of_turns(turns_used_B) -> float:
    """The finished-episode share of a rollout whose every turn decodes the same number of steps (some reply reaches
    the token cap each turn, as with long replies), from the turns each episode played:
        share = sum_t (B - active_t) / (B x T_run) = 1 - mean_b(turns_used_b) / T_run,   T_run = max_b turns_used_b
    (active_t = episodes still playing at turn t; one group, no padding)."""
    n = np.asarray(turns_used_B, np.float64)
    return 0.0 if n.size == 0 or n.max() == 0 else float(1.0 - n.mean() / n.max())


def finished_share_mixture(min_turns_P, t_max: int, p_end: float) -> float:
    """`finished_share_of_turns` in expectation when each episode ends at its task's reference turn count m_p (the
    shortest solution, clipped to T_max) with probability `p_end` and otherwise plays all T_max turns, tasks drawn
    uniformly: share = p_end x (T_max - E[m]) / T_max (T_run = T_max: with many episodes one plays them all)."""
    if not 0.0 <= p_end <= 1.0:
        raise ValueError(f"p_end must be in [0, 1], got {p_end}")
    m = np.minimum(np.asarray(min_turns_P, np.float64), t_max)
    return float(p_end * (t_max - m.mean()) / t_max)
