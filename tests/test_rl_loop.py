"""The RL loop end to end: advantages per estimator on a real rollout, and GRPO learning sanity."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl.loop import RLSettings, compute_advantages, rl_iteration
from jaxagent.rl.optim import make_optimizer
from jaxagent.rl.train_step import LossSettings, init_train_state, make_train_step
from jaxagent.rollout import rollout
from jaxagent.sampling import Sampler
from jaxagent.study.stages import TaskSettings
from jaxagent.study.toy import make_toy_world

TS = TaskSettings(size=4, t_max=6, max_context=320, random_start=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_toy_world(tmp_path_factory.mktemp("tok"))


def _untrained(world, seed=0):
    """A random tiny Qwen3 whose embeddings favour the answer tokens, so that it emits valid moves in
    random directions (the 'untrained' level: no knowledge of the map)."""
    tok = world.tokenizer
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    params = qwen3.init(cfg, jax.random.key(seed))
    ids = jnp.asarray([tok.encode(a)[0] for a in world.env.ACTION_STRINGS] + [tok.im_end_id])
    params["embed"] = params["embed"].at[ids].multiply(40.0)
    return cfg, params


def _rollout_fn(world, cfg):
    rcfg = TS.rollout_config(sampler=Sampler(temperature=1.0))
    return lambda p, tasks, b, k: rollout(p, cfg, world.env, world.layout, world.fmt, tasks, b, k,
                                          TS.env_params(), rcfg)


def test_advantages_on_a_rollout(world):
    cfg, params = _untrained(world)
    g = 4
    tasks = jax.tree.map(lambda x: jnp.repeat(x, g, axis=0), TS.sample(jax.random.key(0), 4))
    ro = _rollout_fn(world, cfg)(params, tasks, np.full(16, TS.t_max), jax.random.key(1))
    for est in ("grpo", "dr_grpo", "rloo", "gigpo", "process"):
        adv, keep, _ = compute_advantages(ro, RLSettings(estimator=est, n_tasks=4, group_size=g))
        adv = np.asarray(adv)
        assert adv.shape == ro.tokens.shape and np.isfinite(adv).all()
        assert (adv[~np.asarray(ro.policy_mask)] == 0).all(), est
    # GRPO: every policy token of an episode carries that episode's group-normalised return
    adv, _, _ = compute_advantages(ro, RLSettings(estimator="grpo", n_tasks=4, group_size=g))
    R = np.asarray(ro.episode_return).reshape(4, g)
    want = (R - R.mean(1, keepdims=True)) / (R.std(1, ddof=1, keepdims=True) + 1e-6)
    want = np.where(R.std(1, keepdims=True) > 0, want, 0.0).reshape(-1)
    pm = np.asarray(ro.policy_mask)
    for i in range(16):
        np.testing.assert_allclose(np.asarray(adv)[i][pm[i]], want[i], atol=1e-5)
    # zero-variance filter drops exactly the groups with equal returns
    _, keep, _ = compute_advantages(ro, RLSettings(estimator="grpo", n_tasks=4, group_size=g,
                                                   filter_zero_variance=True))
    assert (np.asarray(keep).reshape(4, g).all(1) == (R.std(1) > 0)).all()


@pytest.mark.slow
def test_grpo_raises_success_over_untrained(world):
    cfg, params = _untrained(world)
    settings = RLSettings(estimator="grpo", n_tasks=8, group_size=8)
    opt = make_optimizer(3e-3, max_grad_norm=1.0)
    step = make_train_step(cfg, opt, LossSettings(clip_low=0.2, clip_high=0.28),
                           compiler_options={"xla_backend_optimization_level": 0})
    state = init_train_state(cfg, opt, jax.random.key(0), params=params)
    roll = _rollout_fn(world, cfg)

    def success(p, seed):
        tasks = TS.sample(jax.random.key(10_000 + seed), 64)
        return float(np.mean(np.asarray(roll(p, tasks, np.full(64, TS.t_max), jax.random.key(seed)).success)))

    before = np.mean([success(state.params, s) for s in range(2)])
    for _ in range(15):
        state, m, _ = rl_iteration(state, rollout_fn=roll, sample_tasks_fn=TS.sample, train_step=step,
                                   settings=settings, t_max=TS.t_max)
        assert np.isfinite(m["loss"]) and m["skipped"] == 0
    after = np.mean([success(state.params, s) for s in range(2)])
    # Measured here: 0.06 -> 0.15 (seeded). A 128-episode success rate has a standard error of ~0.03.
    assert after >= before + 0.07 and after >= 2 * before, (before, after)
