"""Advantage estimators, each for ONE group or ONE trajectory, with vmapped batch wrappers.

Dimension legend: B groups in a batch, G rollouts in a group, N steps of a trajectory (turns or
tokens: GAE and discounting do not care which), T tokens of a sequence.

Standard deviation. Every `(x - mean) / (std + eps)` here uses the *sample* std (ddof=1, Bessel's correction) by
default, as torch.std does in verl and in verl-agent (GiGPO's reference code), so advantages match the frameworks
this family of papers trains with; the population std (ddof=0) is one keyword away, a factor sqrt(n/(n-1)) per
group of size n (1.07 at G=8, 1.03 at G=16) that Adam largely absorbs. Denominators are max(n - ddof, 1), so a
singleton group stays finite; a group whose values are all equal gets advantage exactly 0 (not rounding noise / eps).
Masks: a masked (0) step gets advantage 0 and is *skipped* by recursions (GAE, discounting): the carry passes
through it unchanged, so trailing padding and interleaved non-policy tokens both work.
Inputs are checked by shape and dtype when traced (`jaxagent.checks`: a ValueError / TypeError naming the argument);
string options take the `GroupEstimator` / `NormMode` members (static under `jax.jit`) or their strings.
"""
import enum

import jax
import jax.numpy as jnp
from jax import lax

from jaxagent import checks


@checks.static_option
class GroupEstimator(enum.StrEnum):
    """The outcome baseline of `batch_group_advantages`."""

    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"


@checks.static_option
class NormMode(enum.StrEnum):
    """Group normalisation: (x - mean) / (std + eps), or x - mean."""

    MEAN_STD = "mean_std"
    MEAN = "mean"


GROUP_ESTIMATORS = tuple(m.value for m in GroupEstimator)


def _float(x):
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _check_norm(mode, ddof, where="advantages"):
    mode = checks.option(NormMode, mode, where, "mode")
    if ddof not in (0, 1):
        raise ValueError(f"{where}: ddof must be 0 (population std) or 1 (sample std), got {ddof!r}")
    return mode


def _rewards(where, name, x, dims):
    """A numeric rewards array of rank len(dims) (`checks.array`), as a jax array."""
    checks.array(where, name, x, dims, "number")
    return jnp.asarray(x)


def _check_unit(name, x):
    if isinstance(x, (int, float)) and not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {x}")


def _normalise(x_G, mode, eps, ddof):
    """(x - mean) [/ (std + eps)] over one full group; all-equal groups give exactly 0."""
    centred = x_G - jnp.mean(x_G)
    if mode == "mean_std":
        var = jnp.sum(centred**2) / max(x_G.shape[0] - ddof, 1)
        centred = centred / (jnp.sqrt(var) + eps)
    return jnp.where(jnp.max(x_G) == jnp.min(x_G), 0.0, centred)


# ----------------------------------------------------------------------------- outcome (group)
def grpo_advantages(rewards_G, *, eps=1e-6, ddof=1):
    """GRPO outcome advantage for one group of G rollouts of the same prompt.

    A_i = (R_i - mean_j R_j) / (std_j R_j + eps)      (std: sample by default, see module doc)
    Source: Shao et al. 2024, DeepSeekMath, Sec. 4.1.2 (outcome supervision), GRPO.
    """
    rewards_G = _rewards("grpo_advantages", "rewards_G", rewards_G, "G")
    _check_norm("mean_std", ddof, "grpo_advantages")
    return _normalise(_float(rewards_G), "mean_std", eps, ddof)


def dr_grpo_advantages(rewards_G):
    """Dr.GRPO advantage for one group: A_i = R_i - mean_j R_j (no std division).

    Source: Liu et al. 2025, "Understanding R1-Zero-like Training: A Critical Perspective", Sec. 3
    (Dr. GRPO: removing the question-level difficulty bias of the std normaliser).
    """
    rewards_G = _rewards("dr_grpo_advantages", "rewards_G", rewards_G, "G")
    return _normalise(_float(rewards_G), "mean", 0.0, 0)


def rloo_advantages(rewards_G):
    """REINFORCE leave-one-out advantage for one group: A_i = R_i - 1/(G-1) sum_{j != i} R_j.

    Equals G/(G-1) * (R_i - mean R). Source: Ahmadian et al. 2024, "Back to Basics: Revisiting
    REINFORCE Style Optimization for Learning from Human Feedback in LLMs" (RLOO estimator);
    Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!".
    """
    rewards_G = _rewards("rloo_advantages", "rewards_G", rewards_G, "G")
    g = rewards_G.shape[0]
    if g < 2:
        raise ValueError(f"rloo_advantages: RLOO needs a group of at least 2 rollouts, got G={g}")
    r = _float(rewards_G)
    return r - (jnp.sum(r) - r) / (g - 1)


def has_reward_variance(rewards_G, *, atol=0.0):
    """True when a group's rewards are not all equal (max - min > atol): the group carries signal.

    Groups where this is False have all-zero group-relative advantages; DAPO's dynamic sampling
    drops them (Yu et al. 2025, "DAPO", Sec. 3.2 dynamic sampling: keep 0 < #correct < G).
    """
    rewards_G = _rewards("has_reward_variance", "rewards_G", rewards_G, "G")
    return (jnp.max(rewards_G) - jnp.min(rewards_G)) > atol


def batch_group_advantages(rewards_BxG, estimator="grpo", *, eps=1e-6, ddof=1):
    """Outcome advantages for B independent groups: vmap of the one-group estimator -> A_BxG.

    estimator: a `GroupEstimator` or its string ('grpo', 'dr_grpo', 'rloo')."""
    rewards_BxG = _rewards("batch_group_advantages", "rewards_BxG", rewards_BxG, "BG")
    estimator = checks.option(GroupEstimator, estimator, "batch_group_advantages", "estimator")
    if estimator == GroupEstimator.GRPO:
        fn = lambda r: grpo_advantages(r, eps=eps, ddof=ddof)  # noqa: E731
    elif estimator == GroupEstimator.DR_GRPO:
        fn = dr_grpo_advantages
    else:
        fn = rloo_advantages
    return jax.vmap(fn)(rewards_BxG)


def batch_has_reward_variance(rewards_BxG, *, atol=0.0):
    """Keep-mask_B for DAPO-style filtering of zero-variance groups."""
    rewards_BxG = _rewards("batch_has_reward_variance", "rewards_BxG", rewards_BxG, "BG")
    return jax.vmap(lambda r: has_reward_variance(r, atol=atol))(rewards_BxG)


# ----------------------------------------------------------------------------- GAE (trajectory)
def gae(rewards_N, values_N, mask_N, bootstrap_value, *, gamma, lam, dones_N=None):
    """Generalised advantage estimation for one trajectory (turn- or token-level).

    delta_t = r_t + gamma * (1 - d_t) V_{t+1} - V_t
    A_t     = delta_t + gamma * lam * (1 - d_t) A_{t+1},      R_t = A_t + V_t (the value target)
    Source: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", eq. 16. Computed with a reverse lax.scan.

    V_{t+1}, A_{t+1} are those of the next *valid* step; after the last valid step they are
    (bootstrap_value, 0): pass 0 for a terminated episode, V(s_N) for a truncated one. Masked steps
    get A = R = 0 and are skipped. dones_N[t] = 1 ends an episode after step t: nothing flows back
    across it (use it when several episodes share one sequence).
    Returns (advantages_N, returns_N).
    """
    checks.arrays("gae", [("rewards_N", rewards_N, "N", "number"), ("values_N", values_N, "N", "number"),
                          ("mask_N", mask_N, "N", "number"), ("bootstrap_value", bootstrap_value, "", "number"),
                          ("dones_N", dones_N, "N", "number")])
    _check_unit("gamma", gamma)
    _check_unit("lam", lam)
    if dones_N is None:
        dones_N = jnp.zeros(jnp.shape(mask_N), jnp.float32)
    rewards_N, values_N, dones_N = _float(rewards_N), _float(values_N), jnp.asarray(dones_N)
    valid_N = jnp.asarray(mask_N).astype(bool)

    def step(carry, xs):
        next_value, next_adv = carry
        r, v, valid, done = xs
        keep = 1.0 - done.astype(r.dtype)
        next_value, next_adv = next_value * keep, next_adv * keep
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        carry = (jnp.where(valid, v, next_value), jnp.where(valid, adv, next_adv))
        return carry, jnp.where(valid, adv, 0.0)

    init = (_float(bootstrap_value).astype(values_N.dtype), jnp.zeros((), values_N.dtype))
    _, adv_N = lax.scan(step, init, (rewards_N, values_N, valid_N, dones_N), reverse=True)
    return adv_N, jnp.where(valid_N, adv_N + values_N, 0.0)


def batch_gae(rewards_BxN, values_BxN, mask_BxN, bootstrap_B, *, gamma, lam, dones_BxN=None):
    """vmap of `gae` over B trajectories -> (advantages_BxN, returns_BxN)."""
    checks.arrays("batch_gae", [("rewards_BxN", rewards_BxN, "BN", "number"),
                                ("values_BxN", values_BxN, "BN", "number"), ("mask_BxN", mask_BxN, "BN", "number"),
                                ("bootstrap_B", bootstrap_B, "B", "number"), ("dones_BxN", dones_BxN, "BN", "number")])
    if dones_BxN is None:
        dones_BxN = jnp.zeros(jnp.shape(mask_BxN), jnp.float32)
    fn = lambda r, v, m, b, d: gae(r, v, m, b, gamma=gamma, lam=lam, dones_N=d)  # noqa: E731
    return jax.vmap(fn)(rewards_BxN, values_BxN, mask_BxN, bootstrap_B, dones_BxN)


def discounted_returns(rewards_N, mask_N, *, gamma):
    """R_t = sum_{k >= t, valid} gamma^{k-t'} r_k over the valid steps of one trajectory.

    (Exponent counts valid steps only; masked steps are skipped.) GAE with V = 0, lam = 1,
    bootstrap 0. Sutton & Barto 2018, eq. 3.8.
    """
    zeros_N = jnp.zeros(jnp.shape(rewards_N), jnp.float32)
    return gae(rewards_N, zeros_N, mask_N, jnp.zeros(()), gamma=gamma, lam=1.0)[0]


# ----------------------------------------------------------------------------- GiGPO (group)
def _segment_normalise(x_M, valid_M, seg_M, mode, eps, ddof):
    """_normalise within segments of a flat array; invalid entries weigh 0 and get 0."""
    m = x_M.shape[0]
    w_M = valid_M.astype(x_M.dtype)
    n_S = jax.ops.segment_sum(w_M, seg_M, m)
    mean_S = jax.ops.segment_sum(w_M * x_M, seg_M, m) / jnp.maximum(n_S, 1.0)
    centred_M = x_M - mean_S[seg_M]
    hi_S = jax.ops.segment_max(jnp.where(valid_M, x_M, -jnp.inf), seg_M, m)
    lo_S = jax.ops.segment_min(jnp.where(valid_M, x_M, jnp.inf), seg_M, m)
    if mode == "mean_std":
        var_S = jax.ops.segment_sum(w_M * centred_M**2, seg_M, m) / jnp.maximum(n_S - ddof, 1.0)
        centred_M = centred_M / (jnp.sqrt(var_S)[seg_M] + eps)
    flat_M = (hi_S == lo_S)[seg_M]  # includes singleton step groups
    return jnp.where(valid_M & ~flat_M, centred_M, 0.0)


def gigpo_advantages(returns_G, step_rewards_GxN, mask_GxN, anchors_GxN, *, gamma=0.95,
                     omega=1.0, mode="mean_std", eps=1e-6, ddof=1):
    """GiGPO advantages for one rollout group -> A_GxN (0 on masked steps).

    A_E(i)   = norm_{j in group}(R_j)                              (episode-level advantage)
    R_t(i)   = sum_{k >= t} gamma^{k-t} r_k(i)                     (discounted step return, eq. 5)
    A_S(i,t) = norm_{(j,k): anchor(j,k) = anchor(i,t)}(R_k(j))     (step-level advantage)
    A(i,t)   = A_E(i) + omega * A_S(i,t)                           (combined, omega = 1 there)
    norm is (x - mean) / (std + eps) for mode 'mean_std', x - mean for 'mean'. A step group is all
    valid steps, across the G trajectories (repeats within one trajectory included), with the same
    anchor id; singleton or all-equal step groups give A_S = 0, so with no repeated anchor GiGPO is
    exactly GRPO ('mean_std') or Dr.GRPO ('mean'). Source: Feng et al. 2025, "Group-in-Group Policy
    Optimization for LLM Agent Training", arXiv 2505.10978, method section (anchor state grouping).
    Anchor ids (any int32, e.g. state hashes) are remapped to dense segment ids with
    jnp.unique(size=G*N): static shapes, jittable.
    """
    checks.arrays("gigpo_advantages", [
        ("returns_G", returns_G, "G", "number"), ("step_rewards_GxN", step_rewards_GxN, "GN", "number"),
        ("mask_GxN", mask_GxN, "GN", "number"), ("anchors_GxN", anchors_GxN, "GN", "integer")])
    mode = _check_norm(mode, ddof, "gigpo_advantages")
    step_rewards_GxN, mask_GxN, anchors_GxN = (jnp.asarray(x) for x in (step_rewards_GxN, mask_GxN, anchors_GxN))
    _check_unit("gamma", gamma)
    g, n = step_rewards_GxN.shape
    valid_GxN = mask_GxN.astype(bool)
    episode_G = _normalise(_float(returns_G), mode, eps, ddof)
    step_ret_GxN = jax.vmap(lambda r, m: discounted_returns(r, m, gamma=gamma))(
        step_rewards_GxN, valid_GxN)
    _, seg_M = jnp.unique(anchors_GxN.reshape(-1), size=g * n, return_inverse=True)
    step_M = _segment_normalise(step_ret_GxN.reshape(-1), valid_GxN.reshape(-1),
                                seg_M.reshape(-1), mode, eps, ddof)
    adv_GxN = episode_G[:, None] + omega * step_M.reshape(g, n)
    return jnp.where(valid_GxN, adv_GxN, 0.0)


def batch_gigpo_advantages(returns_BxG, step_rewards_BxGxN, mask_BxGxN, anchors_BxGxN, **kw):
    """vmap of `gigpo_advantages` over B groups (anchors never match across groups) -> A_BxGxN."""
    checks.arrays("batch_gigpo_advantages", [
        ("returns_BxG", returns_BxG, "BG", "number"), ("step_rewards_BxGxN", step_rewards_BxGxN, "BGN", "number"),
        ("mask_BxGxN", mask_BxGxN, "BGN", "number"), ("anchors_BxGxN", anchors_BxGxN, "BGN", "integer")])
    fn = lambda *a: gigpo_advantages(*a, **kw)  # noqa: E731
    return jax.vmap(fn)(returns_BxG, step_rewards_BxGxN, mask_BxGxN, anchors_BxGxN)


# ---------------------------------------------------------------------------- oracle process reward
def process_advantages(outcomes_G, process_rewards_GxN, mask_GxN, *, weight=1.0,
                       mode="mean_std", eps=1e-6, ddof=1):
    """Outcome group advantage plus a weighted oracle process term, per step -> A_GxN.

    A(i,t) = norm_{group}(R)_i + weight * r^proc(i,t)   on valid steps, 0 on masked ones,
    with r^proc(s_t, a_t) = Q*(s_t, a_t) - V*(s_t) (jaxagent's definition, docs/study.md). The process
    term is used raw, not discounted or group-normalised: Q* - V* is already an advantage (of the
    optimal policy, <= 0, zero exactly for optimal actions, in units of the outcome reward), and as
    the expected potential-based shaping term with potential V* it leaves the optimal policy
    unchanged (Ng, Harada & Russell 1999, Theorem 1). norm as in `gigpo_advantages` (GRPO outcome
    advantage, Shao et al. 2024, for 'mean_std').
    """
    checks.arrays("process_advantages", [
        ("outcomes_G", outcomes_G, "G", "number"), ("process_rewards_GxN", process_rewards_GxN, "GN", "number"),
        ("mask_GxN", mask_GxN, "GN", "number")])
    mode = _check_norm(mode, ddof, "process_advantages")
    mask_GxN = jnp.asarray(mask_GxN)
    adv_GxN = (_normalise(_float(outcomes_G), mode, eps, ddof)[:, None]
               + weight * _float(process_rewards_GxN))
    return jnp.where(mask_GxN.astype(bool), adv_GxN, 0.0)


def process_shaped_rewards(process_rewards_N, mask_N, outcome, *, weight=1.0):
    """Per-step rewards r_t = R * 1[t = last valid step] + weight * r^proc_t (0 on masked steps).

    The reward form of `process_advantages`, for GAE or GiGPO step returns ("process reward added
    to the outcome reward", docs/study.md). All-masked trajectories get all zeros.
    """
    checks.arrays("process_shaped_rewards", [
        ("process_rewards_N", process_rewards_N, "N", "number"), ("mask_N", mask_N, "N", "number"),
        ("outcome", outcome, "", "number")])
    mask_N = jnp.asarray(mask_N)
    n = mask_N.shape[0]
    valid_N = mask_N.astype(bool)
    last = n - 1 - jnp.argmax(valid_N[::-1])
    terminal_N = (jnp.arange(n) == last) & valid_N
    r_N = jnp.where(terminal_N, _float(outcome), 0.0) + weight * _float(process_rewards_N)
    return jnp.where(valid_N, r_N, 0.0)


# ----------------------------------------------------------------------------- onto tokens
def broadcast_to_tokens(adv, turn_idx_T, loss_mask_T):
    """Spread per-turn advantages adv_N (or one per-episode scalar) onto the T tokens.

    adv_T[t] = adv_N[turn_idx_T[t]] (or the scalar) where turn_idx_T[t] >= 0 and loss_mask_T[t],
    else 0. turn_idx_T is -1 on non-policy tokens (prompt, observations, padding); an index >= N
    also gives 0 (jit cannot raise on it).
    """
    checks.arrays("broadcast_to_tokens", [("turn_idx_T", turn_idx_T, "T", "integer"),
                                          ("loss_mask_T", loss_mask_T, "T", "number")])
    turn_idx_T, loss_mask_T = jnp.asarray(turn_idx_T), jnp.asarray(loss_mask_T)
    adv = _float(adv)
    if adv.ndim not in (0, 1):
        raise ValueError(f"broadcast_to_tokens: adv must be a per-episode scalar or per-turn [N], got shape "
                         f"{list(adv.shape)}")
    valid_T = (turn_idx_T >= 0) & loss_mask_T.astype(bool)
    if adv.ndim == 0:
        vals_T = jnp.broadcast_to(adv, turn_idx_T.shape)
    else:
        vals_T = jnp.take(adv, jnp.maximum(turn_idx_T, 0), mode="fill", fill_value=0.0)
    return jnp.where(valid_T, vals_T, 0.0)


def batch_broadcast_to_tokens(adv_B_or_BxN, turn_idx_BxT, loss_mask_BxT):
    """vmap of `broadcast_to_tokens` over B sequences -> adv_BxT."""
    checks.arrays("batch_broadcast_to_tokens", [("turn_idx_BxT", turn_idx_BxT, "BT", "integer"),
                                                ("loss_mask_BxT", loss_mask_BxT, "BT", "number")])
    return jax.vmap(broadcast_to_tokens)(adv_B_or_BxN, turn_idx_BxT, loss_mask_BxT)
