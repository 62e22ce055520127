"""Decode slots spent on finished episodes: the per-call split (hand-computed), the count read from a rollout's
turn records, the host loop's own count of the same rollout (they agree, with episode groups, padding and a forced
reply), and the closed-form shares."""
import dataclasses
import types

import jax
import numpy as np
import pytest

from jaxagent.bench.longtail import (decode_slots_per_turn, finished_share_mixture, finished_share_of_turns,
                                     long_tail)
from jaxagent.envs.host import base as host
from jaxagent.rollout import RolloutConfig
from jaxagent.rollout.host_loop import host_config, host_rollout
from jaxagent.rollout.host_timing import HostTiming, decode_shares, decode_slot_counts
from jaxagent.sampling import Sampler


def test_one_call_split_by_hand():
    # 4 rows: 1 padding, 2 sampled (lengths 3 and 5), 1 finished; the loop runs 5 steps
    assert decode_slot_counts(4, 1, [3, 5]) == {"slots": 20, "generated": 8, "tail": 2, "finished": 5, "padding": 5}
    assert decode_slot_counts(3, 0, []) == {"slots": 0, "generated": 0, "tail": 0, "finished": 0, "padding": 0}
    with pytest.raises(ValueError, match="do not fit"):
        decode_slot_counts(2, 1, [1, 1])


def _turns(active, forced, span_len):
    arr = lambda x, dt: np.asarray(x, dt)  # noqa: E731
    return types.SimpleNamespace(turns=types.SimpleNamespace(active=arr(active, bool), forced=arr(forced, bool),
                                                             span_len=arr(span_len, np.int32)))


def test_slots_per_turn_from_turn_records():
    # 3 episodes x 3 turns; episode 1 ends after turn 0, episode 2 is forced at turn 1
    ro = _turns(active=[[1, 1, 1], [1, 0, 0], [1, 1, 0]], forced=[[0, 0, 0], [0, 0, 0], [0, 1, 0]],
                span_len=[[4, 2, 6], [3, 0, 0], [1, 5, 0]])
    one = decode_slots_per_turn(ro, 1)
    assert one["slots"].tolist() == [12, 6, 18] and one["generated"].tolist() == [8, 2, 6]
    assert one["finished"].tolist() == [0, 4, 12] and one["tail"].tolist() == [4, 0, 0]
    # two groups: {0, 2} and {1, pad}
    two = decode_slots_per_turn(ro, 2)
    assert two["slots"].tolist() == [8 + 6, 4, 12] and two["padding"].tolist() == [3, 0, 0]
    assert two["finished"].tolist() == [0, 2, 6]
    tot = long_tail(ro, 1)
    assert tot["decode_slots"] == 36 and tot["decode_finished_share"] == pytest.approx(16 / 36)
    assert tot["active_fraction_per_turn"] == [1.0, round(2 / 3, 4), round(1 / 3, 4)]
    for per in (one, two):
        assert (per["slots"] == sum(per[k] for k in ("generated", "tail", "finished", "padding"))).all()


def test_closed_form_shares():
    assert finished_share_of_turns([2, 4, 4, 2]) == pytest.approx(1 - 3 / 4)
    assert finished_share_of_turns([]) == 0.0
    # p = 0.5 of episodes end at their reference turns (1 and 3 of T_max 4), the rest play 4
    assert finished_share_mixture([1, 3], 4, 0.5) == pytest.approx(0.5 * (4 - 2) / 4)
    assert finished_share_mixture([9], 4, 1.0) == 0.0  # a reference longer than T_max is clipped
    with pytest.raises(ValueError, match="p_end"):
        finished_share_mixture([1], 4, 1.5)
    assert decode_shares({k: np.zeros(2, np.int64) for k in ("slots", "generated", "tail", "finished", "padding")}
                         )["decode_finished_share"] is None


def test_host_loop_counts_the_same_slots(tok, host_model):
    """A random policy on the SQL env, 3 episodes in 2 overlapping groups (one padding row), budgets 3/1/2 (episodes
    end at different turns) and one forced reply: the host loop's own count equals the count from the rollout."""
    cfg, params = host_model
    env = host.make("sql")
    rcfg = RolloutConfig(t_max=3, max_action_tokens=8, max_context=1024, sampler=Sampler(temperature=1.0))
    res = host_rollout(params, cfg, env, tok, env.tasks("all")[:3], [3, 1, 2], jax.random.key(0),
                       dataclasses.replace(host_config(rcfg), overlap_groups=2),
                       forced_actions=[[None, "SELECT 1"], [], []])
    timing: HostTiming = res.trace.timing
    from_rollout = decode_slots_per_turn(res.rollout, 2)
    for k, v in from_rollout.items():
        np.testing.assert_array_equal(timing.decode[k], v, err_msg=k)
    assert timing.decode["padding"][0] > 0 and timing.decode["finished"].sum() > 0
    summary = timing.summary()
    assert summary["decode_slots"] == int(from_rollout["slots"].sum())
    assert summary["decode_finished_share"] == pytest.approx(from_rollout["finished"].sum() / from_rollout["slots"].sum())
