"""Tests for jaxagent.rollout.episode: the one budget text, the status rules on numpy and jax arrays, the
settings shared by both loops."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.envs.jax import budgets
from jaxagent.rollout import episode, types
from jaxagent.rollout.host_loop import HostRolloutConfig, host_config
from jaxagent.rollout.jax_loop import RolloutConfig

R, S, F, BE, CE = types.RUNNING, types.SUCCESS, types.FAILED, types.BUDGET_EXHAUSTED, types.CONTEXT_EXHAUSTED


def test_one_budget_template():
    assert episode.budget_text(1, 5) == "Turn 2 of 5. 4 turns left."
    # the jittable envs' word template is the same text split into words
    assert " ".join(budgets.DEFAULT_TEMPLATE).replace(" .", ".") == budgets.BUDGET_TEMPLATE
    assert budgets.DEFAULT_TEMPLATE == ("Turn", "{turn}", "of", "{budget}", ".", "{remaining}", "turns", "left", ".")


@pytest.mark.parametrize("xp", [np, jnp])
def test_status_rules(xp):
    status = xp.asarray([R, R, R, S, R], np.int32)
    budget = xp.asarray([3, 1, 3, 3, 2], np.int32)
    fits = xp.asarray([True, True, False, True, True])
    new, active = episode.turn_start(status, 1, budget, fits)
    assert type(new) is type(status) and new.dtype == np.int32
    # episode 1 has no budget left at turn 1 (stays running, inactive); 2 does not fit; 3 already ended
    np.testing.assert_array_equal(np.asarray(new), [R, R, CE, S, R])
    np.testing.assert_array_equal(np.asarray(active), [True, False, False, False, True])
    done = xp.asarray([True, False, False, False, False])
    success = xp.asarray([False, False, False, False, False])
    after = episode.after_step(new, active, done, success, episode.out_of_budget(1, budget))
    np.testing.assert_array_equal(np.asarray(after), [F, R, CE, S, BE])
    np.testing.assert_array_equal(np.asarray(episode.finished(after)), [True, False, False, True, False])
    rew = xp.asarray(np.arange(10, dtype=np.float32).reshape(5, 2))
    np.testing.assert_array_equal(np.asarray(episode.episode_return(after, rew)), [1, 0, 0, 13, 0])


def test_host_config_rejects_jax_fields():
    base = RolloutConfig(t_max=3, max_action_tokens=8, max_context=64)
    assert host_config(base) == HostRolloutConfig(t_max=3, max_action_tokens=8, max_context=64)
    for field, value in (("allow_forced", True), ("kv_windows", 2), ("expert_fn", lambda *a: 0)):
        with pytest.raises(ValueError, match=field):
            host_config(dataclasses.replace(base, **{field: value}))
    with pytest.raises(ValueError, match="t_max"):
        HostRolloutConfig(t_max=0)
