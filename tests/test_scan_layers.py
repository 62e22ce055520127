"""Layers as one `lax.scan` (`qwen3.hidden_states(scan_layers=)`, `MemoryPlan(scan_layers=)`): the same hidden
states, logits and train-step update as the Python loop, and a compiled train step whose temporaries stop growing
with depth under remat (the unrolled step's grow by about a layer's attention work per layer on XLA:CPU)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import critic, optim, train_loss, train_state
from jaxagent.rl import train_step as ts
from jaxagent.rl.memory_plan import MemoryPlan

CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)
FAST = {"xla_backend_optimization_level": 0}
TOL = dict(atol=2e-5, rtol=2e-5)


def np_params(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: jnp.asarray(1.0 + 0.1 * rng.normal(size=s.shape) if s.ndim == 1
                                              else 0.3 * rng.normal(size=s.shape), jnp.float32),
                        qwen3.param_shapes(cfg))


def tokens(b=4, t=10, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, CFG.vocab_size, (b, t)), jnp.int32)


@pytest.mark.parametrize("remat", [None, "full"])
def test_scanned_forward_equals_the_loop(remat):
    params, toks = np_params(CFG), tokens()
    mask = jnp.asarray(np.arange(10)[None] < np.array([10, 7, 4, 9])[:, None])
    index = jnp.asarray([9, 6, 3, 8])

    def run(scan):
        h, _ = qwen3.hidden_states(params, CFG, toks, attention_mask=mask, remat=remat, scan_layers=scan)
        # with `index` the last layer runs for one token: the others are scanned
        hi, _ = qwen3.hidden_states(params, CFG, toks, attention_mask=mask, index=index, remat=remat,
                                    scan_layers=scan)
        return h, hi

    (h0, hi0), (h1, hi1) = jax.jit(lambda: run(False))(), jax.jit(lambda: run(True))()
    np.testing.assert_allclose(np.asarray(h1), np.asarray(h0), **TOL)
    np.testing.assert_allclose(np.asarray(hi1), np.asarray(hi0), **TOL)
    np.testing.assert_allclose(np.asarray(hi0)[:, 0], np.asarray(h0)[np.arange(4), np.asarray(index)], **TOL)
    # the loop with a cache (decoding) takes no scan: same cache either way
    cache = qwen3.init_cache(CFG, 4, 16, jnp.float32)
    c0 = qwen3.hidden_states(params, CFG, toks, cache=cache)[1]
    c1 = qwen3.hidden_states(params, CFG, toks, cache=cache, scan_layers=True)[1]
    for a, b in zip(jax.tree.leaves(c0), jax.tree.leaves(c1)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def ppo_batch(b=8, s=12, seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(s)[None] >= 3) & (rng.random((b, s)) < 0.8)
    return {"tokens": jnp.asarray(rng.integers(0, CFG.vocab_size, (b, s)), jnp.int32),
            "policy_mask": jnp.asarray(mask),
            "advantages": jnp.asarray(rng.normal(size=(b, s)), jnp.float32),
            "old_logprobs": jnp.asarray(-np.log(CFG.vocab_size) + 0.3 * rng.normal(size=(b, s)), jnp.float32),
            "returns": jnp.asarray(rng.normal(size=(b, s)), jnp.float32),
            "old_values": jnp.asarray(0.1 * rng.normal(size=(b, s)), jnp.float32)}


def test_scanned_train_step_gives_the_loops_update():
    """PPO with a separate critic and the exact KL against reference params in the state (every forward of the
    step: policy, reference, critic), two micro-batches, full remat, a bf16 forward: the same update."""
    tx = optim.make_optimizer(1e-2, max_grad_norm=1.0)
    ls = train_state.LossSettings(clip_low=0.2, clip_high=0.28, kl_coef=0.1, kl_estimator="exact")
    vs = train_state.ValueSettings(clip_eps=0.2, shared_backbone=False)

    def run(scan, dtype):
        memory = MemoryPlan(micro_batches=2, remat="full", logits_chunk=5, compute_dtype=dtype,
                            compiler_options=FAST, scan_layers=scan)
        step = ts.build_train_step(CFG, tx, ls, memory, with_ref_params=True, value_settings=vs)
        state = train_state.init_train_state(
            CFG, tx, jax.random.key(0), params=np_params(CFG), with_ref_params=True, value_settings=vs,
            critic_params=critic.init(CFG, jax.random.key(1), backbone=np_params(CFG, 1)))
        return step(state.replace(ref_params=np_params(CFG, 2)), ppo_batch())  # a reference apart: KL > 0

    keys = ("loss", "pg_loss", "kl", "vf_loss", "grad_norm", "critic_grad_norm")
    (s0, m0), (s1, m1) = run(False, None), run(True, None)
    for k in keys:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), err_msg=k, **TOL)
    for tree0, tree1 in ((s0.params, s1.params), (s0.critic_params, s1.critic_params)):
        for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(tree0)[0], jax.tree.leaves(tree1)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), err_msg=jax.tree_util.keystr(path), **TOL)
    assert float(m0["kl"]) > 0 and float(m0["critic_grad_norm"]) > 0
    # bf16 forwards round differently in the two programs (fusions differ): each within bf16 error of f32 (the
    # params are not compared: AdamW's first update is about lr x sign(g), flipped by any rounding of a g near 0)
    for m in (run(False, "bfloat16")[1], run(True, "bfloat16")[1]):
        for k in keys:
            np.testing.assert_allclose(float(m[k]), float(m0[k]), err_msg=k, rtol=2e-2)


def step_temp_bytes(layers: int, scan: bool) -> int:
    """Temporaries of the compiled GRPO step (remat 'full') of a model whose attention work dominates."""
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=8)
    tx = optax.sgd(1e-3)
    step = ts.build_train_step(cfg, tx, train_state.LossSettings(),
                               MemoryPlan(remat="full", compiler_options=FAST, scan_layers=scan))
    state = jax.eval_shape(lambda: train_state.init_train_state(cfg, tx, jax.random.key(0)))
    dtypes = {"tokens": jnp.int32, "policy_mask": jnp.bool_}
    batch = {k: jax.ShapeDtypeStruct((2, 512), dtypes.get(k, jnp.float32)) for k in train_loss.BATCH_KEYS}
    return step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes


def test_scanned_step_memory_stays_flat_with_depth():
    """What would fail it: XLA scheduling a scanned layer's recomputation ahead of its gradient, or the stacked
    weights costing more than the unrolled program's live attention work (both would show in these sizes)."""
    loop = {n: step_temp_bytes(n, False) for n in (2, 6)}
    scan = {n: step_temp_bytes(n, True) for n in (2, 6)}
    per_layer_score = 2 * 8 * 512 * 512 * 4  # one layer's f32 attention scores at 2 x 512 tokens
    assert loop[6] - loop[2] > 4 * per_layer_score / 2, loop  # the unrolled step holds every layer's at once
    assert scan[6] - scan[2] < per_layer_score / 4, scan
    assert scan[6] < loop[6] / 2, (scan, loop)


def test_scan_layers_reaches_both_studies_presets_and_their_steps(capsys):
    """`--scan-layers` sets the preset field (FrozenLake and host presets, `reproduce`'s one command line), and the
    preset's field reaches the train step the run and the AOT check build (the program's note says so)."""
    import dataclasses

    from experiments import reproduce
    from jaxagent import sharding
    from jaxagent.aot import host
    from jaxagent.study.common.arms import arm_settings
    from jaxagent.study.host.presets import HOST_PRESETS

    for preset in ("ci", "ci-sql"):
        for extra, want in (([], "scan_layers = false"), (["--scan-layers"], "scan_layers = true")):
            with pytest.raises(SystemExit) as e:
                reproduce.main(["--preset", preset, *extra, "--dump-config"])
            assert e.value.code == 0 and want in capsys.readouterr().out.splitlines(), (preset, extra)
    p = dataclasses.replace(HOST_PRESETS["ci-sql"], scan_layers=True)
    assert host.step_options(p)["memory"].scan_layers
    cfg, mesh = p.tiny_model, sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    (prog,) = host.host_programs(p, cfg, mesh, [arm_settings(p, "grpo")], only=["host_train_step"])
    assert prog.note.endswith(", layers scanned")
    assert " while(" in prog.lower().as_text() or "stablehlo.while" in prog.lower().as_text()
