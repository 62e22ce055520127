"""The public API: every subpackage exports its names, string options jit, `grpo_loss` equals its formula, and
bad inputs to the entry points raise errors that name the argument, what it should be and what came."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import checks, rl
from jaxagent.eval import passk
from jaxagent.models import Qwen3Config, forward, init
from jaxagent.rl import AggMode, GroupEstimator, KLEstimator, grpo_loss, policy_loss
from jaxagent.sampling import generate

PACKAGES = ("jaxagent.models", "jaxagent.sampling", "jaxagent.envs", "jaxagent.envs.jax", "jaxagent.rollout",
            "jaxagent.rl", "jaxagent.eval", "jaxagent.study")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_package_exports_what_it_lists(name):
    mod = importlib.import_module(name)
    assert len(mod.__all__) >= 5 and len(set(mod.__all__)) == len(mod.__all__)
    for attr in mod.__all__:
        assert getattr(mod, attr) is not None, f"{name}.{attr}"


def test_the_names_a_researcher_looks_for():
    import jaxagent.eval as ev
    import jaxagent.rollout as ro
    import jaxagent.models as models
    assert rl.batch_group_advantages is rl.advantages.batch_group_advantages and rl.gae is rl.advantages.gae
    assert ev.pass_at_k_grid is passk.pass_at_k_grid and ev.upper_bound.__module__ == "jaxagent.eval.pass_drivers"
    assert ro.env_text.__module__ == "jaxagent.rollout.layout" and models.load is models.weights.load


# ----------------------------------------------------------------------------- options under jit
LOGP = np.log(np.asarray([[0.5, 0.4, 0.3, 0.9], [0.2, 0.6, 0.7, 0.1], [0.3, 0.3, 0.3, 0.3], [0.8, 0.5, 0.2, 0.4]],
                         np.float32))
OLD = np.log(np.asarray([[0.4, 0.4, 0.5, 0.9], [0.3, 0.5, 0.7, 0.2], [0.3, 0.2, 0.4, 0.3], [0.8, 0.6, 0.1, 0.4]],
                        np.float32))
REF = np.log(np.full((4, 4), 0.45, np.float32))
MASK = np.asarray([[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1], [0, 1, 0, 0]], np.int32)
REWARDS_PxG = np.asarray([[1.0, 0.0], [0.0, 0.0]], np.float32)  # group 0 has signal, group 1 none


def test_policy_loss_jits_with_enum_options():
    kw = dict(clip_low=0.2, clip_high=0.28)
    adv = np.tile(np.asarray([[1.0], [-1.0], [0.5], [2.0]], np.float32), (1, 4))
    eager, _ = policy_loss(LOGP, OLD, adv, MASK, agg_mode="seq-mean-token-mean", ref_logp=REF, kl_coef=0.1, **kw)
    jitted, aux = jax.jit(policy_loss)(LOGP, OLD, adv, MASK, agg_mode=AggMode.SEQ_MEAN_TOKEN_MEAN, ref_logp=REF,
                                       kl_coef=0.1, kl_estimator=KLEstimator.K2, **kw)
    k2, _ = policy_loss(LOGP, OLD, adv, MASK, agg_mode="seq-mean-token-mean", ref_logp=REF, kl_coef=0.1,
                        kl_estimator="k2", **kw)
    np.testing.assert_allclose(jitted, k2, rtol=1e-6)
    assert abs(float(eager) - float(jitted)) > 1e-4  # k3 vs k2: the static option reached the trace
    with pytest.raises(ValueError, match="policy_loss: agg_mode must be one of 'token-mean'"):
        policy_loss(LOGP, OLD, adv, MASK, agg_mode="mean", **kw)
    # the group estimators and norm modes jit the same way
    a = jax.jit(rl.batch_group_advantages)(REWARDS_PxG, GroupEstimator.DR_GRPO)
    np.testing.assert_allclose(a, [[0.5, -0.5], [0.0, 0.0]])


def _grpo_reference(logp, old, rewards_PxG, mask, ref, eps_lo, eps_hi, beta):
    """Shao et al. 2024 eq. 3-4 written out in numpy: -1/G sum_i 1/|o_i| sum_t [min(rA, clip(r)A) - beta k3]."""
    r = rewards_PxG.astype(np.float64)
    adv = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)
    adv = np.where(r.max(1, keepdims=True) == r.min(1, keepdims=True), 0.0, adv).reshape(-1)
    ratio = np.exp(logp.astype(np.float64) - old)
    surr = np.minimum(ratio * adv[:, None], np.clip(ratio, 1 - eps_lo, 1 + eps_hi) * adv[:, None])
    x = ref.astype(np.float64) - logp
    k3 = np.exp(x) - x - 1
    per_tok = surr - beta * k3
    m = mask.astype(bool)
    per_seq = [per_tok[i][m[i]].mean() for i in range(len(m)) if m[i].any()]
    return -float(np.mean(per_seq)), adv


def test_grpo_loss_equals_its_formula_and_jits():
    want, adv = _grpo_reference(LOGP, OLD, REWARDS_PxG, MASK, REF, 0.2, 0.28, 0.05)
    got, aux = grpo_loss(LOGP, OLD, REWARDS_PxG, MASK, clip_eps=0.2, clip_high=0.28, kl_coef=0.05, ref_logp_BxT=REF)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(aux["advantages_PxG"]).reshape(-1), adv, rtol=1e-5)
    jitted, _ = jax.jit(grpo_loss)(LOGP, OLD, REWARDS_PxG, MASK, clip_eps=0.2, clip_high=0.28, kl_coef=0.05,
                                   ref_logp_BxT=REF, agg_mode=AggMode.SEQ_MEAN_TOKEN_MEAN)
    np.testing.assert_allclose(float(jitted), want, rtol=1e-5)
    # the gradient flows to the current log-probs only through the policy tokens
    g = jax.grad(lambda lp: grpo_loss(lp, OLD, REWARDS_PxG, MASK, kl_coef=0.05, ref_logp_BxT=REF)[0])(LOGP)
    assert np.all(np.asarray(g)[MASK == 0] == 0) and np.any(np.asarray(g)[MASK == 1] != 0)
    with pytest.raises(ValueError, match=r"grpo_loss: rewards_PxG is \[2, 3\] \(6 rollouts\) but logp_BxT has B = 4"):
        grpo_loss(LOGP, OLD, np.zeros((2, 3), np.float32), MASK)


# ----------------------------------------------------------------------------- bad inputs, named
@pytest.fixture(scope="module")
def tiny():
    cfg = Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return cfg, init(cfg, jax.random.key(0))


def test_forward_names_bad_arguments(tiny):
    cfg, params = tiny
    with pytest.raises(TypeError, match=r"qwen3.forward: tokens_BxT must be an integer array \[B, T\]; got "
                                        r"float32\[2, 5\]"):
        forward(params, cfg, jnp.zeros((2, 5), jnp.float32))
    with pytest.raises(ValueError, match=r"qwen3.forward: tokens_BxT must be .*\(rank 2\); got int32\[5\]"):
        forward(params, cfg, jnp.zeros((5,), jnp.int32))
    with pytest.raises(ValueError, match=r"attention_mask has T = 4 .* but tokens_BxT has T = 5"):
        forward(params, cfg, jnp.zeros((2, 5), jnp.int32), attention_mask=jnp.ones((2, 4), bool))
    with pytest.raises(ValueError, match=r"params\['embed'\] is \[32, 16\] but cfg says \[V=64, D=16\]"):
        forward(params, Qwen3Config(**{**cfg.__dict__, "vocab_size": 64}), jnp.zeros((2, 5), jnp.int32))
    with pytest.raises(TypeError, match="cfg must be a Qwen3Config; got dict"):
        forward(params, dict(cfg.__dict__), jnp.zeros((2, 5), jnp.int32))
    # the same checks run while tracing: inside a user's jit the error is ours, not XLA's
    with pytest.raises(TypeError, match="tokens_BxT must be an integer array"):
        jax.jit(lambda t: forward(params, cfg, t)[0])(jnp.zeros((2, 5), jnp.float32))


def test_generate_names_bad_arguments(tiny):
    cfg, params = tiny
    key = jax.random.key(0)
    with pytest.raises(TypeError, match=r"generate: prompt_BxL must be an integer array \[B, L\]; got float32\[2, 3\]"):
        generate(params, cfg, np.zeros((2, 3), np.float32), key, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"generate: prompt_BxL must be .*\(rank 2\); got int64\[3\]"):
        generate(params, cfg, np.zeros(3, np.int64), key, max_new_tokens=2)
    with pytest.raises(TypeError, match="generate: max_new_tokens must be an integer scalar; got float64"):
        generate(params, cfg, np.zeros((2, 3), np.int32), key, max_new_tokens=2.0)
    with pytest.raises(ValueError, match="explicit max_steps"):
        jax.jit(lambda p: generate(params, cfg, p, key, max_new_tokens=2).tokens)(jnp.zeros((2, 3), jnp.int32))


def test_losses_and_advantages_name_bad_arguments():
    kw = dict(clip_low=0.2, clip_high=0.2, agg_mode="token-mean")
    with pytest.raises(ValueError, match=r"policy_loss: logp_BxT must be a floating-point array \[B, T\] \(rank 2\); "
                                         r"got float32\[4\]"):
        policy_loss(LOGP[0], OLD[0], OLD[0], MASK[0], **kw)
    with pytest.raises(TypeError, match=r"policy_loss: adv_BxT must be a floating-point array \[B, T\]; got int32"):
        policy_loss(LOGP, OLD, MASK, MASK, **kw)
    with pytest.raises(ValueError, match=r"policy_loss: mask_BxT has T = 3 \(shape \[4, 3\]\) but logp_BxT has T = 4"):
        policy_loss(LOGP, OLD, OLD, MASK[:, :3], **kw)
    with pytest.raises(ValueError, match=r"batch_group_advantages: rewards_BxG must be .*\(rank 2\); got float32\[4\]"):
        rl.batch_group_advantages(REWARDS_PxG.reshape(-1))
    with pytest.raises(TypeError, match="gigpo_advantages: anchors_GxN must be an integer array"):
        rl.gigpo_advantages(np.zeros(2), np.zeros((2, 3)), np.ones((2, 3)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="gae: values_N has N = 4 .* but rewards_N has N = 3"):
        rl.gae(np.zeros(3), np.zeros(4), np.ones(3), 0.0, gamma=0.9, lam=0.9)


def test_pass_functions_name_bad_arguments():
    with pytest.raises(TypeError, match=r"pass_at_k_per_task: success_PxZ must be a bool or integer array \[P, Z\]; "
                                        r"got float32\[3, 4\]"):
        passk.pass_at_k_per_task(np.zeros((3, 4), np.float32), [1])
    with pytest.raises(ValueError, match=r"pass_at_k_grid: success_UxPxZ must be .*\(rank 3\); got bool\[3, 4\]"):
        passk.pass_at_k_grid(np.zeros((3, 4), bool), [1])
    with pytest.raises(ValueError, match=r"pass_at_k_grid: every k in ks_J must lie in \[1, 4\]"):
        passk.pass_at_k_grid(np.zeros((2, 3, 4), bool), [1, 5])
    with pytest.raises(ValueError, match="valid_PxZ has Z = 2"):
        passk.pass_at_k_per_task(np.zeros((3, 4), bool), [1], np.ones((3, 2), bool))
    with pytest.raises(TypeError, match="truncated_success: budgets_U must be an integer array"):
        passk.truncated_success(np.zeros((3, 4), np.int32), np.asarray([1.0, 2.0]))


def test_checks_read_only_shapes():
    """Under jit the checked function's program holds no trace of the checks: same jaxpr with a check-free twin."""
    def checked(x):
        checks.arrays("f", [("x_BxT", x, "BT", "float")])
        return x * 2

    assert str(jax.make_jaxpr(checked)(np.ones((2, 3), np.float32))) == \
        str(jax.make_jaxpr(lambda x: x * 2)(np.ones((2, 3), np.float32)))
    assert checks.describe(np.zeros((2, 3), np.float32)) == "float32[2, 3]" and checks.describe(None) == "None"
