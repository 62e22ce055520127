"""The evaluation drivers' placement (`driver_common.run_rollouts(mesh=, compute_dtype=)`, the scoring's
`mesh=`): on a (data, fsdp, tensor) = (2, 2, 2) mesh of the 8 fake CPU devices (conftest) the rollouts get
the training rollout's bf16 copy of the weights laid out per `sharding.ROLLOUT_RULES`, the episodes split
over the batch axes, under the mesh context, and come back replicated (the training rollout's very program:
one compile, the same episodes); the teacher-forced and reply
log-probs on the mesh equal the single-device ones; without a mesh and in float32 nothing changes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import sharding
from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.envs.jax.frozenlake import sample_tasks
from jaxagent.eval import driver_common, scoring
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rollout import types
from jaxagent.rollout.jax_loop import rollout_jit
from jaxagent.sampling import Sampler
from jaxagent.sampling.generate import rollout_params
from jaxagent.study import stages
from jaxagent.study.toy import make_toy_world

T_MAX, BATCH = 2, 8


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_toy_world(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def cfg(world):
    return Qwen3Config(vocab_size=world.tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(2, 2, 2)


@pytest.fixture(scope="module")
def params(cfg):
    return qwen3.init(cfg, jax.random.key(0))


TS = stages.TaskSettings(t_max=T_MAX, max_action_tokens=4, max_context=128)
ENV_PARAMS = TS.env_params()  # as the eval stage (jaxagent/study/frozenlake/measure.py) and the training rollout pass them


@pytest.fixture(scope="module")
def rcfg():
    """The eval stage's RolloutConfig (`measure.eval_setup`), which equals the training rollout's (temperature 1)."""
    return TS.rollout_config(sampler=Sampler(temperature=1.0), allow_forced=True)


@pytest.fixture(scope="module")
def tasks():
    return sample_tasks(jax.random.key(1), BATCH, 4, 0.8, random_start=True)


@pytest.fixture(scope="module")
def on_mesh(world, cfg, params, rcfg, tasks, mesh):
    """run_rollouts on the mesh in bf16, with a spy on what `rollout` receives."""
    seen = []
    real = driver_common.rollout

    def spy(p, *args, **kw):
        seen.append(dict(params=jax.tree.leaves(p), tasks=jax.tree.leaves(args[4]),
                         mesh=jax.sharding.get_abstract_mesh()))
        return real(p, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver_common, "rollout", spy)
        r = driver_common.run_rollouts(world, cfg, params, tasks, np.full(BATCH, T_MAX), jax.random.key(2), ENV_PARAMS,
                                       rcfg, batch_size=BATCH, mesh=mesh, compute_dtype=jnp.bfloat16)
    return r, seen


def test_rollout_params_cast_and_layout(cfg, params, mesh):
    assert rollout_params(params, cfg) is params
    assert rollout_params(params, cfg, compute_dtype=jnp.float32) is params  # nothing to cast
    placed = rollout_params(params, cfg, mesh=mesh, compute_dtype="bfloat16")
    want = sharding.shardings_for(qwen3.logical_axes(cfg), params, mesh, sharding.ROLLOUT_RULES)
    for x, x0, sh in zip(jax.tree.leaves(placed), jax.tree.leaves(params), jax.tree.leaves(want)):
        assert x.dtype == jnp.bfloat16 and x.shape == x0.shape
        assert x.sharding.is_equivalent_to(sh, x.ndim)
        assert "fsdp" not in str(x.sharding.spec) and "data" not in str(x.sharding.spec)  # whole over the rows' axes
    np.testing.assert_array_equal(np.asarray(placed["embed"], np.float32),
                                  np.asarray(params["embed"].astype(jnp.bfloat16), np.float32))
    with pytest.raises(ValueError, match="floating"):
        rollout_params(params, cfg, compute_dtype=jnp.int32)


def test_rollouts_on_the_mesh_run_like_training(on_mesh, mesh):
    r, seen = on_mesh
    assert len(seen) == 1
    assert not seen[0]["mesh"].empty and dict(seen[0]["mesh"].shape) == dict(mesh.shape)
    assert all(x.dtype == jnp.bfloat16 for x in seen[0]["params"])
    maps = seen[0]["tasks"][0]
    assert maps.sharding.spec[0] == ("data", "fsdp")  # episodes over the batch axes
    for x in jax.tree.leaves(r):
        assert x.sharding.is_fully_replicated
    assert r.tokens.shape == (BATCH, 128)
    assert set(np.unique(np.asarray(r.status)).tolist()) <= {types.SUCCESS, types.FAILED, types.BUDGET_EXHAUSTED,
                                                              types.CONTEXT_EXHAUSTED}
    assert (np.asarray(r.turns_used) >= 1).all()


def test_eval_rollouts_are_the_training_rollout_program(world, cfg, params, tasks, mesh, on_mesh):
    r, _ = on_mesh
    compiled = rollout_jit._cache_size()
    rt = stages.make_arm_runtime(world, cfg, TS, stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"]), mesh=mesh,
                                 compute_dtype="bfloat16")
    placed = jax.device_put(params, sharding.shardings_for(qwen3.logical_axes(cfg), params, mesh))
    train = rt.rollout_fn(placed, tasks, np.full(BATCH, T_MAX), jax.random.fold_in(jax.random.key(2), 0))
    assert rollout_jit._cache_size() == compiled  # no new rollout compile
    np.testing.assert_array_equal(np.asarray(train.tokens), np.asarray(r.tokens))
    np.testing.assert_array_equal(np.asarray(train.status), np.asarray(r.status))


def test_no_mesh_float32_is_the_plain_rollout(world, cfg, params, rcfg, tasks):
    args = (world, cfg, params, tasks, np.full(BATCH, T_MAX), jax.random.key(3), ENV_PARAMS, rcfg)
    plain = driver_common.run_rollouts(*args, batch_size=BATCH)
    same = driver_common.run_rollouts(*args, batch_size=BATCH, mesh=None, compute_dtype=jnp.float32)
    host = lambda x: np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)  # noqa: E731
                                else x)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(same)):
        np.testing.assert_array_equal(host(a), host(b))


def test_scoring_on_the_mesh_equals_one_device(world, cfg, params, mesh, on_mesh):
    r, _ = on_mesh
    placed = jax.device_put(params, sharding.shardings_for(qwen3.logical_axes(cfg), params, mesh))
    one = scoring.teacher_forced_logprobs(params, cfg, r.tokens, batch_size=BATCH)
    sharded = scoring.teacher_forced_logprobs(placed, cfg, r.tokens, batch_size=BATCH, mesh=mesh)
    assert sharded.sharding.is_fully_replicated
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(one), atol=2e-5, rtol=1e-5)
    ctx, ctx_len = r.tokens, np.full(BATCH, 40, np.int32)
    one = scoring.reply_logprobs(world, cfg, params, ctx, ctx_len, score_batch=BATCH)
    sharded = scoring.reply_logprobs(world, cfg, placed, ctx, ctx_len, score_batch=BATCH, mesh=mesh)
    assert sharded.shape == (BATCH, fls.N_ACTIONS)
    np.testing.assert_allclose(np.asarray(sharded), np.asarray(one), atol=2e-5, rtol=1e-5)
