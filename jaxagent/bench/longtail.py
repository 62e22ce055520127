"""The long tail of multi-turn rollouts: decode slots spent on episodes that are already over, read from any
`Rollout` (the JAX loop's or the host loop's) after the fact.

Dimension legend (CONVENTIONS.md): B episodes, N turns (T_max).

Each turn, each episode group decodes once over all its policy rows, and the token loop runs until its longest
sampled reply ends (`sampling.decode`: a `while_loop` on "some row not done"). So turn t of group g costs
rows_g x steps_{t,g} slots, steps_{t,g} = max over the rows sampled at t (active and not forced) of
`turns.span_len`, and the slots split as `host_schedule.decode_slot_counts` defines (generated, tail, finished,
padding; the host loop records the same counts while it runs, `HostTiming.decode`). The JAX loop decodes the whole
batch as one group; the host loop's groups are `host_schedule.episode_groups(B, overlap_groups)`.
"""
from __future__ import annotations

import numpy as np

from jaxagent.rollout.host_schedule import DECODE_KINDS, decode_shares, decode_slot_counts, episode_groups
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
    """Totals and shares of the rollout's decode slots (`host_schedule.decode_shares`), and per turn the fraction
    of episodes still playing (`active_fraction_per_turn`) and the slots (`decode_slots_per_turn`)."""
    per_turn = decode_slots_per_turn(ro, n_groups)
    out = decode_shares(per_turn)
    out["active_fraction_per_turn"] = np.asarray(ro.turns.active).mean(axis=0).round(4).tolist()
    out["decode_slots_per_turn"] = per_turn["slots"].tolist()
    return out
