"""Train step: log-probs, sharded == unsharded, micro-batching, the non-finite guard, KL / entropy /
seq-mean weighting, the PPO critic (separate and shared backbone), optimizer schedules.

Params come from numpy (no jitted random init: its compile alone costs seconds on 2 cores) and one
compiled step is shared per configuration through module-scoped fixtures.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent import sharding
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import critic, losses, optim, train_loss, train_state
from jaxagent.rl import train_step as ts
from jaxagent.rl import logprobs as logprobs_lib
from jaxagent.rl.logits_plan import LogitsPlan
from jaxagent.rl.memory_plan import MemoryPlan

CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8)
B, S = 8, 12


def keep_grads():
    """Identity transform whose state is the last gradient: one compiled step yields the loss, the
    gradients and the update."""
    return optax.GradientTransformation(lambda p: optax.tree.zeros_like(p), lambda g, s, p=None: (g, g))


TX = optax.chain(keep_grads(), optim.make_optimizer(1e-2, weight_decay=0.01, max_grad_norm=1.0))
LS = train_state.LossSettings(clip_low=0.2, clip_high=0.28)
TOL = dict(atol=1e-5, rtol=1e-5)
# LLVM -O0: compiles these tiny steps ~3x faster on 2 loaded cores; every compared run uses it.
FAST = {"xla_backend_optimization_level": 0}


def jit(f):
    return jax.jit(f, compiler_options=FAST)


MEMORY = ("micro_batches", "remat", "compute_dtype", "logits_chunk", "policy_tokens", "packed_policy")


def make_step(ls, mesh=None, **kw):
    """`ts.build_train_step` with the memory knobs among `kw` as its MemoryPlan (and the FAST options)."""
    memory = MemoryPlan(compiler_options=FAST, **{k: kw.pop(k) for k in MEMORY if k in kw})
    return ts.build_train_step(CFG, TX, ls, memory, mesh, **kw)


def np_params(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: jnp.asarray(1.0 + 0.1 * rng.normal(size=s.shape) if s.ndim == 1
                                              else 0.3 * rng.normal(size=s.shape), jnp.float32),
                        qwen3.param_shapes(cfg))


def make_batch(seed=0, b=B, s=S, vocab=CFG.vocab_size):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (b, s))
    lengths = rng.integers(s // 2, s + 1, b)
    pos = np.arange(s)[None]
    mask = (pos >= 3) & (pos < lengths[:, None]) & (rng.random((b, s)) < 0.8)
    mask[1] = False  # a row without policy tokens (dropped group / padding)
    return {"tokens": jnp.asarray(tokens, jnp.int32), "policy_mask": jnp.asarray(mask),
            "advantages": jnp.asarray(rng.normal(size=(b, s)), jnp.float32),
            "old_logprobs": jnp.asarray(-np.log(vocab) + 0.3 * rng.normal(size=(b, s)),
                                        jnp.float32)}


def fresh_state(mesh=None, **kw):
    return train_state.init_train_state(CFG, TX, jax.random.key(0), params=np_params(CFG), mesh=mesh, **kw)


def to_np(tree):
    def conv(x):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)
    return jax.tree.map(conv, tree)


def grads_of(state):
    return state.opt_state[0]


def assert_tree_close(a, b, **tol):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path),
                                   **(tol or TOL))


@pytest.fixture(scope="module")
def step1():
    return make_step(LS)


@pytest.fixture(scope="module")
def reference(step1):
    """Unsharded, one micro-batch: (initial params, new state as numpy, metrics)."""
    state = fresh_state()
    p0 = to_np(state.params)
    new, metrics = step1(state, make_batch())
    return p0, to_np(new), {k: float(v) for k, v in metrics.items()}


# ----------------------------------------------------------------------------- log-probs
def test_token_logprobs_match_manual_log_softmax_gather():
    params, batch = np_params(CFG), make_batch()
    tokens = batch["tokens"]
    logp, ent = jit(lambda p, t: logprobs_lib.token_logprobs(p, CFG, t, with_entropy=True))(params, tokens)
    logits = np.asarray(jit(lambda p, t: qwen3.forward(p, CFG, t)[0])(params, tokens), np.float64)
    z = logits - logits.max(-1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    tok = np.asarray(tokens)
    want = np.zeros((B, S))
    want[:, 1:] = np.take_along_axis(logsm[:, :-1], tok[:, 1:, None], -1)[..., 0]
    want_ent = np.zeros((B, S))
    want_ent[:, 1:] = -(np.exp(logsm) * logsm).sum(-1)[:, :-1]
    assert logp.shape == ent.shape == (B, S)
    np.testing.assert_allclose(np.asarray(logp), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), want_ent, atol=1e-5)
    assert np.all(np.asarray(logp)[:, 0] == 0) and np.all(np.asarray(logp)[:, 1:] < 0)


# ----------------------------------------------------------------------------- chunked log-probs
@pytest.mark.parametrize("tied", [True, False])
def test_chunked_logprobs_and_gradients_equal_unchunked(tied):
    """Chunks of 5 positions over S = 12 (two full chunks and a padded one) under jax.checkpoint:
    the same log-probs, entropies and parameter gradients as one pass over all positions."""
    cfg = CFG if tied else Qwen3Config(**{**CFG.__dict__, "tie_word_embeddings": False})
    params, batch = np_params(cfg, 2), make_batch(2)
    rng = np.random.default_rng(5)
    w1, w2 = (jnp.asarray(rng.normal(size=(B, S)), jnp.float32) for _ in range(2))

    def objective(p, chunk):
        logp, ent = logprobs_lib.token_logprobs(p, cfg, batch["tokens"], with_entropy=True, logits_chunk=chunk)
        return jnp.sum(logp * w1 + ent * w2), (logp, ent)

    (v_c, (lp_c, en_c)), g_c = jit(lambda p: jax.value_and_grad(objective, has_aux=True)(p, 5))(params)
    (v_u, (lp_u, en_u)), g_u = jit(lambda p: jax.value_and_grad(objective, has_aux=True)(p, None))(params)
    scale = float(np.abs(np.asarray(lp_u)).max())
    np.testing.assert_allclose(lp_c, lp_u, atol=1e-5 * scale)
    np.testing.assert_allclose(en_c, en_u, atol=1e-5 * scale)
    np.testing.assert_allclose(v_c, v_u, rtol=1e-5)
    assert np.all(np.asarray(lp_c)[:, 0] == 0) and np.all(np.asarray(en_c)[:, 0] == 0)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g_c)[0], jax.tree.leaves(g_u)):
        b = np.asarray(b)
        np.testing.assert_allclose(a, b, atol=1e-5 * max(np.abs(b).max(), 1e-3),
                                   err_msg=jax.tree_util.keystr(path))
    head = "embed" if tied else "lm_head"
    assert np.abs(np.asarray(g_c[head])).max() > 1e-4  # the head really gets its gradient


def test_chunked_remat_step_equals_reference(reference):
    """Logits in chunks of 5 positions and per-layer remat ('full'): the reference's update."""
    _, ref, ref_m = reference
    new, metrics = make_step(LS, logits_chunk=5, remat="full")(fresh_state(), make_batch())
    for k in ("loss", "pg_loss", "clip_frac", "drift", "entropy", "grad_norm"):
        np.testing.assert_allclose(float(metrics[k]), ref_m[k], err_msg=k, **TOL)
    assert_tree_close(grads_of(new), grads_of(ref))
    assert_tree_close(new.params, ref.params)
    with pytest.raises(ValueError, match="logits_chunk"):
        logprobs_lib.token_logprobs(np_params(CFG), CFG, make_batch()["tokens"], logits_chunk=0)
    with pytest.raises(ValueError, match="remat"):
        make_step(LS, remat="everything")(fresh_state(), make_batch())


# ----------------------------------------------------------------------------- sampler/trainer mismatch
def test_mismatch_metrics_from_the_first_pass(reference):
    """Without sampler_logprobs, old_logprobs are the sampler's: mismatch = |logp_train - old| over
    policy tokens, logp_train from the pre-update params."""
    p0, _, ref_m = reference
    batch = make_batch()
    logp = np.asarray(jit(lambda p, t: logprobs_lib.token_logprobs(p, CFG, t))(p0, batch["tokens"]))
    mask = np.asarray(batch["policy_mask"])
    gap = np.abs(logp - np.asarray(batch["old_logprobs"]))[mask]
    np.testing.assert_allclose(ref_m["mismatch_mean"], gap.mean(), rtol=1e-5)
    np.testing.assert_allclose(ref_m["mismatch_max"], gap.max(), rtol=1e-5)
    np.testing.assert_allclose(ref_m["mismatch_mean"], ref_m["drift"], rtol=1e-6)


def test_tis_with_sampler_logprobs_and_micro_batches():
    """old_logprobs = trainer's, sampler_logprobs = sampler's: mismatch = |old - sampler| (hand
    values), the loss = losses.policy_loss with TIS weights min(exp(old - sampler), C)."""
    batch = make_batch(3)
    mask = np.array(batch["policy_mask"])
    delta = np.where(np.arange(B * S).reshape(B, S) % 3 == 0, 1.5, -0.25).astype(np.float32)
    delta[7, 11] = 3.0  # the largest gap, on a policy token
    mask[7, 11] = True
    batch["policy_mask"] = jnp.asarray(mask)
    batch["sampler_logprobs"] = batch["old_logprobs"] - jnp.asarray(delta)
    ls = train_state.LossSettings(clip_low=0.2, clip_high=0.28, tis_cap=2.0)
    _, m = make_step(ls, micro_batches=2)(fresh_state(), batch)
    np.testing.assert_allclose(float(m["mismatch_mean"]), np.abs(delta)[mask].mean(), rtol=1e-5)
    assert float(m["mismatch_max"]) == pytest.approx(3.0, rel=1e-6)
    # weights exp(1.5) -> 2 (truncated), exp(-.25) = .7788, exp(3) -> 2
    w = np.minimum(np.exp(delta), 2.0)[mask]
    np.testing.assert_allclose(float(m["tis_weight_mean"]), w.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(m["tis_trunc_frac"]), (np.exp(delta)[mask] > 2).mean(), rtol=1e-5)
    logp = jit(lambda p, t: logprobs_lib.token_logprobs(p, CFG, t))(np_params(CFG), batch["tokens"])
    want, _ = losses.policy_loss(logp, batch["old_logprobs"], batch["advantages"], batch["policy_mask"],
                                 clip_low=0.2, clip_high=0.28, agg_mode="token-mean",
                                 sampler_logp=batch["sampler_logprobs"], tis_cap=2.0)
    np.testing.assert_allclose(float(m["loss"]), float(want), **TOL)


def test_tis_without_sampler_key_uses_the_first_pass_as_old_policy(reference):
    """old_logprobs are the sampler's; pi_old_train = this step's forward: ratio 1, no clipping, and
    the loss is token-mean of -min(exp(logp - old), C) * A."""
    p0, _, ref_m = reference
    batch = make_batch()
    _, m = make_step(train_state.LossSettings(clip_low=0.2, clip_high=0.28, tis_cap=1.5))(fresh_state(), batch)
    logp = np.asarray(jit(lambda p, t: logprobs_lib.token_logprobs(p, CFG, t))(p0, batch["tokens"]), np.float64)
    mask = np.asarray(batch["policy_mask"])
    w = np.minimum(np.exp(logp - np.asarray(batch["old_logprobs"])), 1.5)[mask]
    want = np.mean(-w * np.asarray(batch["advantages"])[mask])
    np.testing.assert_allclose(float(m["loss"]), want, rtol=1e-5, atol=1e-6)
    assert float(m["clip_frac"]) == 0.0 and float(m["ratio_mean"]) == pytest.approx(1.0)
    np.testing.assert_allclose(float(m["mismatch_mean"]), ref_m["mismatch_mean"], rtol=1e-5)
    with pytest.raises(ValueError, match="tis_cap"):
        train_state.LossSettings(tis_cap=0.0)


# ----------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("shape", [(2, 2, 2),
                                   pytest.param((1, 4, 2), marks=pytest.mark.slow),
                                   pytest.param((8, 1, 1), marks=pytest.mark.slow)])
def test_sharded_step_equals_unsharded(reference, shape):
    p0, ref, ref_m = reference
    mesh = sharding.make_mesh(*shape)
    state = fresh_state(mesh)
    assert_tree_close(to_np(state.params), p0, atol=0, rtol=0)
    # the (2, 2, 2) mesh also accumulates 2 micro-batches: sharding and micro-batching compose
    step = make_step(LS, mesh, micro_batches=2 if shape == (2, 2, 2) else 1)
    new, metrics = step(state, make_batch())
    for k in ("loss", "pg_loss", "clip_frac", "drift", "entropy", "grad_norm", "tokens"):
        np.testing.assert_allclose(float(metrics[k]), ref_m[k], err_msg=k, **TOL)
    assert_tree_close(grads_of(new), grads_of(ref))           # gradients
    assert_tree_close(new.params, ref.params)                 # one AdamW update
    assert_tree_close(new.opt_state[1].inner_state, ref.opt_state[1].inner_state)
    # the state really is sharded as the rules say, optimizer moments like their parameters
    want = train_state.state_shardings(CFG, TX, mesh)
    up = new.params["layers"][0]["mlp"]["up_proj"]
    assert up.sharding.spec == want.params["layers"][0]["mlp"]["up_proj"].spec
    mu = new.opt_state[1].inner_state[1][0].mu["layers"][0]["mlp"]["up_proj"]
    assert mu.sharding.spec == up.sharding.spec
    if shape == (2, 2, 2):
        assert up.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
        assert len(up.addressable_shards) == 8 and up.addressable_shards[0].data.shape == (16, 32)


def test_state_shardings_follow_logical_axes():
    mesh = sharding.make_mesh(1, 4, 2)
    sh = train_state.state_shardings(CFG, TX, mesh, with_ref_params=True,
                                     value_settings=train_state.ValueSettings())
    P = jax.sharding.PartitionSpec
    assert sh.params["embed"].spec == P("tensor", "fsdp")
    assert sh.ref_params["embed"].spec == P("tensor", "fsdp")
    assert sh.opt_state[1].inner_state[1][0].nu["embed"].spec == P("tensor", "fsdp")
    assert sh.opt_state[1].inner_state[1][0].count.spec == P()
    assert sh.critic_params["value_head"]["kernel"].spec == P("fsdp")
    assert sh.critic_params["backbone"]["layers"][0]["attn"]["q_proj"].spec == P("fsdp", "tensor", None)
    assert sh.step.spec == P() and sh.rng.spec == P()


# ----------------------------------------------------------------------------- micro-batches
@pytest.mark.parametrize("m", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_micro_batches_give_the_same_update(reference, m):
    _, ref, ref_m = reference
    step = make_step(LS, micro_batches=m)
    new, metrics = step(fresh_state(), make_batch())
    for k in ("loss", "pg_loss", "clip_frac", "drift", "entropy", "grad_norm", "tokens"):
        np.testing.assert_allclose(float(metrics[k]), ref_m[k], err_msg=k, **TOL)
    assert_tree_close(grads_of(new), grads_of(ref))
    assert_tree_close(new.params, ref.params)


# ----------------------------------------------------------------------------- non-finite guard
def test_nan_advantage_skips_the_update_and_counts_it(step1, reference):
    p0, ref, _ = reference
    state = fresh_state()
    inner0 = to_np(state.opt_state[1].inner_state)
    bad = make_batch()
    mask = np.asarray(bad["policy_mask"])
    r, c = np.argwhere(mask)[0]
    adv = np.asarray(bad["advantages"]).copy()
    adv[r, c] = np.nan
    bad["advantages"] = jnp.asarray(adv)
    state, m = step1(state, bad)
    assert float(m["skipped"]) == 1.0 and float(m["skipped_total"]) == 1.0
    assert not np.isfinite(float(m["grad_norm"]))
    assert_tree_close(state.params, p0, atol=0, rtol=0)        # bitwise unchanged
    assert_tree_close(state.opt_state[1].inner_state, inner0, atol=0, rtol=0)
    assert int(state.step) == 1
    # a NaN outside the policy mask never reaches the loss: the step applies, as the reference
    off = make_batch()
    r, c = np.argwhere(~mask)[0]
    adv = np.asarray(off["advantages"]).copy()
    adv[r, c] = np.inf
    off["advantages"] = jnp.asarray(adv)
    state, m = step1(state, off)
    assert float(m["skipped"]) == 0.0 and float(m["skipped_total"]) == 1.0
    assert_tree_close(state.params, ref.params)
    assert int(optim.nonfinite_count(state.opt_state)) == 1 and int(state.step) == 2
    assert step1._cache_size() == 1  # same shapes: no retrace


# ----------------------------------------------------------------------------- KL, entropy, seq-mean
@pytest.mark.parametrize("estimator", ["k3", "k2"])
def test_kl_entropy_and_seq_mean_weighting_match_full_batch_loss(estimator):
    """The loss uses the configured KL estimator; the logged `kl` is the token-mean k3 monitor either way."""
    ls = train_state.LossSettings(clip_low=0.2, clip_high=0.28, agg_mode="seq-mean-token-mean",
                                  kl_coef=0.1, kl_estimator=estimator, entropy_coef=0.01)
    batch = make_batch(1)
    rng = np.random.default_rng(3)
    params = np_params(CFG)
    logp, ent = jit(lambda p, t: logprobs_lib.token_logprobs(p, CFG, t, with_entropy=True))(
        params, batch["tokens"])
    batch["ref_logprobs"] = logp + jnp.asarray(0.2 * rng.normal(size=(B, S)), jnp.float32)
    want, aux = losses.policy_loss(logp, batch["old_logprobs"], batch["advantages"],
                                   batch["policy_mask"], clip_low=0.2, clip_high=0.28,
                                   agg_mode="seq-mean-token-mean", kl_coef=0.1,
                                   ref_logp=batch["ref_logprobs"], kl_estimator=estimator,
                                   entropy_coef=0.01, entropy_BxT=ent)
    step = make_step(ls, micro_batches=2)
    _, m = step(fresh_state(), batch)
    np.testing.assert_allclose(float(m["loss"]), float(want), **TOL)
    np.testing.assert_allclose(float(m["pg_loss"]), float(aux["pg_loss"]), **TOL)
    np.testing.assert_allclose(float(m["kl"]), float(aux["kl_ref_k3"]), **TOL)
    np.testing.assert_allclose(float(m["entropy"]), float(aux["entropy"]), **TOL)
    np.testing.assert_allclose(float(m["drift"]), float(aux["approx_kl_old_abs"]), **TOL)
    assert float(m["kl"]) > 1e-3


@pytest.mark.parametrize("logits_chunk,policy_tokens,packed", [(5, None, False), (None, None, False), (4, 5, False),
                                                        (3, None, True)])
def test_exact_kl_step_matches_full_vocabulary_reference(logits_chunk, policy_tokens, packed):
    """kl_estimator='exact': the step's loss and gradient equal those of the policy loss with the full-vocabulary
    KL(pi || pi_ref) at every policy token's state, computed from whole [B, S, V] logits of both models; the
    reference (a different model here) gets no gradient. Two micro-batches; logits in chunks of 5 positions
    (S = 12) or in one pass; with policy_tokens 5 (the most policy tokens of a row here) the logits only at those;
    packed: each micro-batch's policy positions in one list (in chunks of 3 positions)."""
    ls = train_state.LossSettings(clip_low=0.2, clip_high=0.28, kl_coef=0.5, kl_estimator="exact")
    batch = make_batch(2)
    params, ref_params = np_params(CFG), np_params(CFG, 7)
    state = fresh_state(with_ref_params=True).replace(ref_params=jax.tree.map(jnp.copy, ref_params))  # donated
    step = make_step(ls, micro_batches=2, with_ref_params=True, logits_chunk=logits_chunk,
                     policy_tokens=policy_tokens, packed_policy=packed)
    if packed:
        batch = {**batch, "policy_index": logprobs_lib.packed_policy_positions(batch["policy_mask"], 8, 2)}
    new, m = step(state, batch)
    if packed:
        assert batch["policy_index"].shape[1] % 8 == 0 and m["policy_tokens_over"] == 0
    if policy_tokens is not None:
        assert int(np.asarray(batch["policy_mask"]).sum(1).max()) == policy_tokens and m["policy_tokens_over"] == 0

    def full_logits(p):
        return qwen3.forward(p, CFG, batch["tokens"])[0]

    def want_loss(p):
        z, zr = full_logits(p), jax.lax.stop_gradient(full_logits(ref_params))
        shift = lambda x: jnp.pad(x[:, :-1], ((0, 0), (1, 0)))  # noqa: E731
        kl = shift(losses.exact_kl(z, zr))
        logp = logprobs_lib.token_logprobs(p, CFG, batch["tokens"])
        ref_logp = logprobs_lib.token_logprobs(ref_params, CFG, batch["tokens"])
        loss, aux = losses.policy_loss(logp, batch["old_logprobs"], batch["advantages"], batch["policy_mask"],
                                       clip_low=0.2, clip_high=0.28, agg_mode="token-mean", kl_coef=0.5,
                                       ref_logp=ref_logp, kl_estimator="exact", kl_exact_BxT=kl)
        return loss, (aux, losses.aggregate(kl, batch["policy_mask"], "token-mean"))

    (want, (aux, kl_mean)), g = jit(jax.value_and_grad(want_loss, has_aux=True))(params)
    np.testing.assert_allclose(float(m["loss"]), float(want), **TOL)
    np.testing.assert_allclose(float(m["kl_exact"]), float(kl_mean), **TOL)
    np.testing.assert_allclose(float(m["kl"]), float(aux["kl_ref_k3"]), **TOL)
    assert float(m["kl_exact"]) > 1e-2
    assert_tree_close(grads_of(new), g, atol=2e-5, rtol=2e-4)
    assert_tree_close(new.ref_params, ref_params, atol=0, rtol=0)


def test_policy_tokens_give_the_same_update(reference):
    """With policy_tokens bounding every row's policy tokens (here the batch's most), the step projects at those
    positions only and gives the full step's metrics, gradients and update (to float rounding)."""
    _, ref, ref_m = reference
    batch = make_batch()
    step = make_step(LS, policy_tokens=int(np.asarray(batch["policy_mask"]).sum(1).max()))
    new, metrics = step(fresh_state(), batch)
    for k in ("loss", "pg_loss", "clip_frac", "drift", "entropy", "grad_norm", "tokens"):
        np.testing.assert_allclose(float(metrics[k]), ref_m[k], err_msg=k, **TOL)
    assert float(metrics["policy_tokens_over"]) == 0
    assert_tree_close(grads_of(new), grads_of(ref))
    assert_tree_close(new.params, ref.params)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_packed_policy_positions_give_the_same_update(reference, micro_batches):
    """packed_policy: the step projects at the batch's policy positions, one flat list per micro-batch padded to a
    bucket, and gives the full step's metrics, gradients and update (to float rounding), with one micro-batch or
    two (each its own list, rows j, j + 2, ...)."""
    _, ref, ref_m = reference
    batch = make_batch()
    index = logprobs_lib.packed_policy_positions(batch["policy_mask"], 16, micro_batches)
    n = int(np.asarray(batch["policy_mask"]).sum())
    assert index.shape == (micro_batches, -(-max(np.asarray(batch["policy_mask"])[j::micro_batches].sum()
                                                 for j in range(micro_batches)) // 16) * 16)
    assert (index > 0).sum() == n  # every policy token once, the rest padding
    step = make_step(LS, packed_policy=True, micro_batches=micro_batches)
    new, metrics = step(fresh_state(), {**batch, "policy_index": index})
    for k in ("loss", "pg_loss", "clip_frac", "drift", "entropy", "grad_norm", "tokens"):
        np.testing.assert_allclose(float(metrics[k]), ref_m[k], err_msg=k, **TOL)
    assert float(metrics["policy_tokens_over"]) == 0
    assert_tree_close(grads_of(new), grads_of(ref))
    assert_tree_close(new.params, ref.params)
    # a list that misses tokens is counted (here the last real entry of micro-batch 0 dropped)
    short = index.copy()
    short[0, (short[0] > 0).sum() - 1] = 0
    _, m = step(fresh_state(), {**batch, "policy_index": short})
    assert float(m["policy_tokens_over"]) == 1


def test_packed_policy_positions_layout_and_refusals():
    """`packed_policy_positions`: flat indices r x T + t of each micro-batch's policy tokens (rows j, j + Mb, ...),
    row-major, padded with 0 to a multiple of the bucket; bad masks and settings raise; the step refuses a packed
    batch without its list (or with a wrong one), a list without packed_policy, and packed with policy_tokens."""
    mask = np.zeros((4, 5), bool)
    mask[0, [1, 3]] = True
    mask[1, 4] = True
    mask[3, [2, 3, 4]] = True
    np.testing.assert_array_equal(logprobs_lib.packed_policy_positions(mask, 4),
                                  [[1, 3, 9, 17, 18, 19, 0, 0]])
    # micro-batch 0: rows 0, 2 -> [1, 3]; micro-batch 1: rows 1, 3 -> [4, 7, 8, 9]
    np.testing.assert_array_equal(logprobs_lib.packed_policy_positions(mask, 4, 2), [[1, 3, 0, 0], [4, 7, 8, 9]])
    assert logprobs_lib.packed_policy_positions(np.zeros((2, 3), bool), 4).tolist() == [[0, 0, 0, 0]]
    # a small count is padded to the next power of two (at least 16), not to a whole bucket
    few = np.zeros((2, 40), bool)
    few[:, 1:11] = True
    assert logprobs_lib.packed_policy_positions(few, 2048).shape == (1, 32)
    many = np.zeros((8, 600), bool)
    many[:, 1:301] = True
    assert logprobs_lib.packed_policy_positions(many, 2048).shape == (1, 4096)  # 2,400: a multiple of the bucket
    bad = mask.copy()
    bad[2, 0] = True
    with pytest.raises(ValueError, match="position 0"):
        logprobs_lib.packed_policy_positions(bad, 4)
    with pytest.raises(ValueError, match="multiple of micro_batches"):
        logprobs_lib.packed_policy_positions(mask, 4, 3)
    with pytest.raises(ValueError, match="bucket"):
        logprobs_lib.packed_policy_positions(mask, 0)
    with pytest.raises(ValueError, match="give one"):
        make_step(LS, packed_policy=True, policy_tokens=4)
    with pytest.raises(ValueError, match="one batch shard"):
        make_step(LS, sharding.make_mesh(8, 1, 1), packed_policy=True)
    batch = make_batch()
    step = make_step(LS, packed_policy=True)
    with pytest.raises(ValueError, match="lacks keys"):
        step(fresh_state(), batch)
    with pytest.raises(ValueError, match="micro_batches = 1, N"):
        step(fresh_state(), {**batch, "policy_index": jnp.zeros((2, 8), jnp.int32)})
    with pytest.raises(ValueError, match="packed_policy=True"):
        make_step(LS)(fresh_state(), {**batch, "policy_index": jnp.zeros((1, 8), jnp.int32)})


def test_logits_plans_agree_at_the_policy_tokens():
    """`LogitsPlan`: per-row (a bound on each row's policy tokens) and packed (one flat list) give the full pass's
    log-probs, entropies, reference log-probs and exact KL at every policy token and 0 elsewhere; `missed` counts the
    policy tokens a plan leaves out."""
    batch = make_batch()
    tokens, mask = batch["tokens"], batch["policy_mask"]
    params, ref = np_params(CFG), np_params(CFG, 7)
    most = int(np.asarray(mask).sum(1).max())
    index = jnp.asarray(logprobs_lib.packed_policy_positions(mask, 16)[0])
    plans = {"full": LogitsPlan(CFG, logits_chunk=5), "per-row": LogitsPlan(CFG, "per-row", most, logits_chunk=5),
             "packed": LogitsPlan(CFG, "packed", logits_chunk=5)}
    got = {k: jit(lambda p, r, i, plan=plan: plan(p, tokens, mask, i, ref_params=r))(params, ref, index)
           for k, plan in plans.items()}
    m = np.asarray(mask)
    for k in ("per-row", "packed"):
        for f in ("logp", "entropy", "ref_logp", "kl"):
            a, b = np.asarray(getattr(got[k], f)), np.asarray(getattr(got["full"], f))
            np.testing.assert_allclose(a[m], b[m], err_msg=f"{k} {f}", **TOL)
            assert not a[~m].any() and np.abs(b[~m]).max() > 0, (k, f)
    assert plans["full"].missed(mask) is None
    assert int(LogitsPlan(CFG, "per-row", most - 1).missed(mask)) == int((m.sum(1) == most).sum())
    assert float(plans["packed"].missed(mask, index[:-1])) == float(index[-1] > 0)
    with pytest.raises(ValueError, match="per-row"):
        LogitsPlan(CFG, "full", 4)


def test_memory_plan_resolves_its_knobs():
    """One `MemoryPlan`: dtype names resolved (float32: no cast), compiler options as hashable pairs, the plan's
    logits mode from policy_tokens / packed_policy, bad knobs refused when the plan is made."""
    mp = MemoryPlan(micro_batches=2, compute_dtype="bfloat16", compiler_options={"a": 1}, policy_tokens=4)
    assert mp.compute_dtype == jnp.bfloat16 and mp.compiler_options == (("a", 1),) and mp.options() == {"a": 1}
    assert hash(mp) == hash(MemoryPlan(micro_batches=2, compute_dtype=jnp.bfloat16, compiler_options=(("a", 1),),
                                       policy_tokens=4))
    assert MemoryPlan(compute_dtype="float32").compute_dtype is None and MemoryPlan().options() is None
    assert [MemoryPlan(**kw).logits_plan(CFG).mode for kw in ({}, {"policy_tokens": 3}, {"packed_policy": True})] \
        == ["full", "per-row", "packed"]
    assert mp.logits_plan(CFG).compute_dtype == jnp.bfloat16 and mp.logits_plan(CFG).policy_tokens == 4
    for kw, word in (({"micro_batches": 0}, "micro_batches"), ({"compute_dtype": "int32"}, "floating"),
                     ({"compute_dtype": "f33"}, "dtype name")):
        with pytest.raises(ValueError, match=word):
            MemoryPlan(**kw)


def test_composed_step_checks_the_batch_on_the_host(reference):
    """`make_train_step` over `make_policy_loss` (the pieces `build_train_step` joins) gives the reference update,
    and a bad batch is refused before the jitted step is called (nothing traced)."""
    _, ref, ref_m = reference
    loss = train_loss.make_policy_loss(LS, MemoryPlan().logits_plan(CFG))
    step = ts.make_train_step(loss, TX, compiler_options=FAST)
    new, m = step(fresh_state(), make_batch())
    np.testing.assert_allclose(float(m["loss"]), ref_m["loss"], **TOL)
    assert_tree_close(new.params, ref.params)
    step._jit = lambda *a: pytest.fail("the jitted step ran on a bad batch")
    batch = make_batch()
    with pytest.raises(ValueError, match="shape"):
        step(fresh_state(), {**batch, "advantages": batch["advantages"][:, :5]})
    with pytest.raises(ValueError, match="ref_logprobs"):
        ts.make_train_step(train_loss.make_policy_loss(train_state.LossSettings(kl_coef=0.1), loss.plan), TX)(
            fresh_state(), batch)


def test_policy_positions_and_tokens_beyond_the_bound_are_counted():
    """`policy_positions`: each row's policy positions in order, padded with 0; the train step's
    policy_tokens_over counts the tokens past the bound (their log-probs would read 0), and a bad bound raises."""
    mask = np.zeros((3, 10), bool)
    mask[0, [2, 3, 7]] = True
    mask[2, 1:9] = True
    pos, over = logprobs_lib.policy_positions(jnp.asarray(mask), 4)
    assert pos.tolist() == [[2, 3, 7, 0], [0, 0, 0, 0], [1, 2, 3, 4]] and int(over) == 4
    batch = make_batch(3)
    n = np.asarray(batch["policy_mask"]).sum(1)
    step = make_step(LS, policy_tokens=4)
    _, m = step(fresh_state(), batch)
    assert float(m["policy_tokens_over"]) == np.maximum(n - 4, 0).sum() > 0
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="policy_tokens"):
            make_step(LS, policy_tokens=bad)


def test_exact_kl_needs_the_reference_model_in_the_step():
    ls = train_state.LossSettings(kl_coef=0.1, kl_estimator="exact")
    with pytest.raises(ValueError, match="with_ref_params=True"):
        ts.build_train_step(CFG, TX, ls)
    step = make_step(ls, with_ref_params=True)
    batch = make_batch()
    batch["ref_logprobs"] = batch["old_logprobs"]
    with pytest.raises(ValueError, match="drop batch\\['ref_logprobs'\\]"):
        step(fresh_state(with_ref_params=True), batch)


# ----------------------------------------------------------------------------- PPO critic
def ppo_batch(seed=0):
    batch = make_batch(seed)
    rng = np.random.default_rng(seed + 10)
    batch["returns"] = jnp.asarray(rng.normal(size=(B, S)), jnp.float32)
    batch["old_values"] = jnp.asarray(0.1 * rng.normal(size=(B, S)), jnp.float32)
    return batch


def test_critic_values_align_to_action_tokens():
    cp = critic.init(CFG, jax.random.key(1), backbone=np_params(CFG, 1))
    tokens = make_batch()["tokens"]
    v = jit(lambda p, t: critic.values(p, CFG, t))(cp, tokens)
    h, _ = jit(lambda p, t: qwen3.hidden_states(p, CFG, t))(cp["backbone"], tokens)
    raw = np.einsum("btd,d->bt", np.asarray(h), np.asarray(cp["value_head"]["kernel"]))
    assert v.shape == (B, S) and np.all(np.asarray(v)[:, 0] == 0)
    np.testing.assert_allclose(np.asarray(v)[:, 1:], raw[:, :-1], atol=1e-5)
    with pytest.raises(ValueError, match="shared-backbone"):
        critic.values({"value_head": cp["value_head"]}, CFG, tokens)


def test_critic_values_fn_row_chunks_and_mesh_equal_plain_values():
    """`critic.make_values_fn` (PPO's old values in stages): 4 row chunks on a (2, 2, 2) mesh, rows sharded
    over data x fsdp, give the plain values; bad chunk counts are a clear error."""
    cp = critic.init(CFG, jax.random.key(1), backbone=np_params(CFG, 1))
    tokens = make_batch()["tokens"]
    want = np.asarray(jit(lambda p, t: critic.values(p, CFG, t))(cp, tokens))
    mesh = sharding.make_mesh(2, 2, 2)
    fn = critic.make_values_fn(CFG, mesh=mesh, micro_batches=2, remat="full")
    p_sh = sharding.shardings_for(critic.logical_axes(CFG), cp, mesh)
    row = sharding.row_sharding(mesh)
    got = fn(jax.device_put(cp, p_sh), jax.device_put(tokens, row))
    assert got.sharding.is_equivalent_to(row, 2)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    with pytest.raises(ValueError, match="row chunks"):
        critic.values(cp, CFG, tokens, micro_batches=3)


def test_ppo_step_separate_critic(reference):
    _, ref, _ = reference
    vs = train_state.ValueSettings(clip_eps=0.2, shared_backbone=False)
    state = fresh_state(value_settings=vs, critic_params=critic.init(
        CFG, jax.random.key(1), backbone=np_params(CFG, 1)))
    c0 = to_np(state.critic_params)
    batch = ppo_batch()
    v = jit(lambda p, t: critic.values(p, CFG, t))(state.critic_params, batch["tokens"])
    want, vaux = losses.value_loss(v, batch["old_values"], batch["returns"], batch["policy_mask"],
                                   clip_eps=0.2)
    step = make_step(LS, value_settings=vs, micro_batches=2)
    new, m = step(state, batch)
    np.testing.assert_allclose(float(m["vf_loss"]), float(want), **TOL)
    np.testing.assert_allclose(float(m["vf_clip_frac"]), float(vaux["vf_clip_frac"]), **TOL)
    # a separate critic leaves the policy's update exactly as without it
    assert_tree_close(new.params, ref.params)
    assert float(m["critic_grad_norm"]) > 0 and float(m["critic_skipped"]) == 0
    moved = jax.tree.map(lambda a, b: np.max(np.abs(np.asarray(a) - b)), new.critic_params, c0)
    assert min(jax.tree.leaves(moved)) > 0


@pytest.mark.slow
def test_ppo_step_shared_backbone(reference):
    _, ref, ref_m = reference
    vs = train_state.ValueSettings(clip_eps=0.2, vf_coef=0.5, shared_backbone=True)
    state = fresh_state(value_settings=vs)
    assert set(state.critic_params) == {"value_head"}
    head0 = to_np(state.critic_params)
    batch = ppo_batch()
    h, _ = jit(lambda p, t: qwen3.hidden_states(p, CFG, t))(state.params, batch["tokens"])
    v = critic.head_values(state.critic_params["value_head"], h)
    want, _ = losses.value_loss(v, batch["old_values"], batch["returns"], batch["policy_mask"],
                                clip_eps=0.2)
    step = make_step(LS, value_settings=vs)
    new, m = step(state, batch)
    np.testing.assert_allclose(float(m["vf_loss"]), float(want), **TOL)
    np.testing.assert_allclose(float(m["loss"]), ref_m["loss"], **TOL)
    # the value loss also shapes the policy backbone's gradient
    diff = np.abs(np.asarray(grads_of(new)["layers"][0]["mlp"]["up_proj"])
                  - grads_of(ref)["layers"][0]["mlp"]["up_proj"])
    assert diff.max() > 1e-6
    assert np.abs(np.asarray(new.critic_params["value_head"]["kernel"])
                  - head0["value_head"]["kernel"]).max() > 0


# ----------------------------------------------------------------------------- bad input
def test_bad_batches_raise_clear_errors(step1):
    state = fresh_state()
    batch = make_batch()
    with pytest.raises(ValueError, match="lacks keys"):
        step1(state, {k: v for k, v in batch.items() if k != "advantages"})
    with pytest.raises(ValueError, match="shape"):
        step1(state, {**batch, "advantages": batch["advantages"][:, :5]})
    with pytest.raises(ValueError, match="micro_batches"):
        make_step(LS, micro_batches=3)(state, batch)
    with pytest.raises(ValueError, match="ref_logprobs"):
        make_step(train_state.LossSettings(kl_coef=0.1))(state, batch)
    with pytest.raises(ValueError, match="data x fsdp"):
        make_step(LS, sharding.make_mesh(8, 1, 1), micro_batches=2)(
            fresh_state(sharding.make_mesh(8, 1, 1)), batch)
    with pytest.raises(ValueError, match="agg_mode"):
        train_state.LossSettings(agg_mode="sum")


# ----------------------------------------------------------------------------- optimizer
def test_schedules():
    s = optim.make_schedule(1.0, "linear_warmup_cosine", warmup_steps=10, total_steps=110)
    np.testing.assert_allclose([float(s(i)) for i in (0, 5, 10, 60, 110)],
                               [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)
    c = optim.make_schedule(2.0, "cosine", total_steps=100, final_lr_ratio=0.1)
    np.testing.assert_allclose([float(c(0)), float(c(50)), float(c(100))], [2.0, 1.1, 0.2],
                               atol=1e-6)
    k = optim.make_schedule(3.0, "constant", warmup_steps=4)
    np.testing.assert_allclose([float(k(0)), float(k(2)), float(k(4)), float(k(99))],
                               [0.0, 1.5, 3.0, 3.0], atol=1e-6)
    for kw in ({"schedule": "cosine"}, {"schedule": "linear_warmup_cosine", "warmup_steps": 5,
                                        "total_steps": 5}, {"schedule": "exp"},
               {"max_grad_norm": 0.0}):
        with pytest.raises(ValueError):
            optim.make_optimizer(1e-3, **kw)


def test_optimizer_clips_then_adamw_and_guards():
    tx = optim.make_optimizer(0.1, max_grad_norm=1.0, weight_decay=0.0)
    p = {"w": jnp.array([1.0, 2.0])}
    st = tx.init(p)
    u, st = tx.update({"w": jnp.array([30.0, -40.0])}, st, p)  # norm 50 -> clipped to 1
    # first Adam step: m/sqrt(v) = sign(g) (bias-corrected), so the update is -lr * sign(g)
    np.testing.assert_allclose(np.asarray(u["w"]), [-0.1, 0.1], atol=1e-6)
    u, st2 = tx.update({"w": jnp.array([jnp.inf, 1.0])}, st, p)
    assert np.all(np.asarray(u["w"]) == 0) and int(optim.nonfinite_count(st2)) == 1
    assert int(optim.last_step_skipped(st2)) == 1
    assert int(st2.inner_state[1][0].count) == int(st.inner_state[1][0].count)
