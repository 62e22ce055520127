"""The RL loop: rollout -> advantages -> K epochs of minibatch updates -> metrics.

Dimension legend (CONVENTIONS.md): B episodes (= n_tasks x G), G group size, N turns (T_max), S context
slots.

`rl_iteration` is one iteration for any jittable env; research code passes its own `rollout_fn`
(params, tasks, budgets, key) -> Rollout and `sample_tasks_fn` (key, n) -> tasks. Advantages are
computed per group / per trajectory (`jaxagent.rl.advantages`) and spread onto the policy tokens of
each turn; the train step (`train_step.build_train_step`) does the sharded update.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.rl import advantages as adv_lib
from jaxagent.rl.train_state import TrainState, advance_data, split_rng
from jaxagent.rollout.episode import finished
from jaxagent.rollout.jax_loop import t_max_of
from jaxagent.rollout.types import Rollout

ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gigpo", "process", "ppo")
CRITIC_ESTIMATORS = ("ppo",)         # train a critic beside the policy (`values_fn`)
ORACLE_ESTIMATORS = ("process",)     # read the env's exact step values (`Rollout.turns.process_reward`)
# the training episodes' budgets (`sample_budgets`): T_max; BudgetMix's draw; the tightest tier (finding 7)
BUDGET_MODES = ("full", "budgetmix", "tight")


@dataclasses.dataclass(frozen=True)
class RLSettings:
    """One RL arm. estimator: grpo | dr_grpo | rloo (group outcome baselines), gigpo (+ anchor-state
    step groups), process (GRPO + oracle process reward), ppo (GAE over turns with a critic)."""

    estimator: str = "grpo"
    n_tasks: int = 8
    group_size: int = 8
    budget_mode: str = "full"          # full | budgetmix (one budget per group, finding 8) | tight (finding 7)
    epochs: int = 1
    minibatches: int = 1
    gamma: float = 0.95                # GiGPO step returns; PPO GAE discount
    gae_lambda: float = 0.95
    omega: float = 1.0                 # GiGPO: A = A_E + omega * A_S
    process_weight: float = 1.0        # process: A = A_GRPO + w * (Q* - V*)
    filter_zero_variance: bool = False  # DAPO dynamic sampling: drop groups with equal rewards

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.budget_mode not in BUDGET_MODES:
            raise ValueError(f"budget_mode must be one of {BUDGET_MODES}, got {self.budget_mode!r}")
        if self.n_tasks < 1 or self.group_size < 1 or self.epochs < 1 or self.minibatches < 1:
            raise ValueError("n_tasks, group_size, epochs and minibatches must be >= 1")
        if self.estimator in ("grpo", "rloo", "gigpo", "process") and self.group_size < 2:
            raise ValueError(f"{self.estimator} needs group_size >= 2")
        if (self.n_tasks * self.group_size) % self.minibatches:
            raise ValueError("n_tasks * group_size must be divisible by minibatches")

    @property
    def batch_size(self) -> int:
        return self.n_tasks * self.group_size


def _groups(x_B, g):
    return x_B.reshape((-1, g) + x_B.shape[1:])


def _policy_turns(ro: Rollout):
    """Turn id of each policy token, -1 elsewhere ([B, S])."""
    return jnp.where(ro.policy_mask, ro.turn_index, -1)


@jax.jit
def _ppo_turn_targets(values_BxS, ro: Rollout, gamma, lam):
    """Turn-level GAE (Schulman et al. 2016): V(s_n) read at the first reply token of turn n,
    rewards = env rewards (0 for unfinished budget/context-exhausted episodes' final turn), the
    value after the last turn is 0 (terminal or out of budget: no more turns)."""
    v_BxN = jnp.take_along_axis(values_BxS, ro.turns.span_start, axis=1) * ro.turns.active
    r_BxN = ro.turns.reward * finished(ro.status)[:, None]
    adv, ret = adv_lib.batch_gae(r_BxN, v_BxN, ro.turns.active, jnp.zeros(r_BxN.shape[0]), gamma=gamma, lam=lam)
    n = jnp.maximum(ro.turns.active.sum(), 1)
    mean = jnp.sum(adv * ro.turns.active) / n
    std = jnp.sqrt(jnp.sum(((adv - mean) * ro.turns.active) ** 2) / n) + 1e-6
    return (adv - mean) / std * ro.turns.active, ret


def compute_advantages(ro: Rollout, settings: RLSettings, values_BxS=None):
    """Per-token advantages [B, S] (0 off policy tokens) and a keep mask [B] (zero-variance filter).

    Outcome R_i = episode_return (0 for episodes that ran out of budget or context unfinished).
    """
    g = settings.group_size
    turn_ids = _policy_turns(ro)
    mask = ro.policy_mask
    R_GxG = _groups(ro.episode_return, g)
    keep = jnp.repeat(adv_lib.batch_has_reward_variance(R_GxG), g) if settings.filter_zero_variance else \
        jnp.ones(ro.episode_return.shape, bool)
    extra = {}
    if settings.estimator in ("grpo", "dr_grpo", "rloo"):
        a_B = adv_lib.batch_group_advantages(R_GxG, settings.estimator).reshape(-1)
        per_turn = jnp.broadcast_to(a_B[:, None], ro.turns.active.shape)
    elif settings.estimator == "gigpo":
        per_turn = adv_lib.batch_gigpo_advantages(
            R_GxG, _groups(ro.turns.reward, g), _groups(ro.turns.active, g), _groups(ro.turns.anchor, g),
            gamma=settings.gamma, omega=settings.omega).reshape(ro.turns.active.shape)
    elif settings.estimator == "process":
        per_turn = jax.vmap(lambda o, p, m: adv_lib.process_advantages(o, p, m, weight=settings.process_weight))(
            R_GxG, _groups(ro.turns.process_reward, g), _groups(ro.turns.active, g)).reshape(ro.turns.active.shape)
    else:  # ppo
        if values_BxS is None:
            raise ValueError("the ppo estimator needs critic values")
        per_turn, ret_BxN = _ppo_turn_targets(values_BxS, ro, settings.gamma, settings.gae_lambda)
        extra["returns"] = adv_lib.batch_broadcast_to_tokens(ret_BxN, turn_ids, mask)
        extra["old_values"] = values_BxS
    adv = adv_lib.batch_broadcast_to_tokens(per_turn, turn_ids, mask) * keep[:, None]
    return adv, keep, extra


def tight_budget(t_max: int) -> int:
    """The training budget of budget_mode 'tight': the tightest evaluation tier, max(1, ceil(T_max / 4))."""
    return budgets_lib.budget_tiers(t_max)[0]


def sample_budgets(key, settings: RLSettings, t_max: int):
    """int32[B]: each training episode's budget. 'full': T_max; 'budgetmix': one draw per group of
    `budgets.budgetmix_candidates(T_max)`; 'tight': the tightest evaluation tier, `budgets.budget_tiers(T_max)[0]`
    = max(1, ceil(T_max / 4)) (`tight_budget`), the budget at which the paper trains its tight-budget arms
    (finding 7)."""
    if settings.budget_mode == "budgetmix":
        return budgets_lib.sample_budgetmix(key, settings.n_tasks, settings.group_size, t_max)
    if settings.budget_mode == "tight":
        return budgets_lib.full_budget(settings.batch_size, tight_budget(t_max))
    return budgets_lib.full_budget(settings.batch_size, t_max)


def rl_iteration(state: TrainState, *, rollout_fn: Callable[..., Rollout], sample_tasks_fn: Callable,
                 train_step: Callable, settings: RLSettings, t_max: Optional[int] = None,
                 values_fn: Optional[Callable] = None,
                 logprobs_fn: Optional[Callable] = None) -> tuple[TrainState, dict, Rollout]:
    """One RL iteration: sample n_tasks tasks, G rollouts each (budgets full or BudgetMix), compute
    advantages, then `epochs` passes of `minibatches` updates over the shuffled episodes.

    `rollout_fn(params, tasks, budgets, key) -> Rollout`; `t_max` (the budgets' ceiling) is read from the
    rollout_fn's RolloutConfig when it holds one (`rollout.make_rollout_fn`, `rollout.t_max_of`).
    `sample_tasks_fn(key, n) -> tasks`: a pytree whose leaves have n rows, one per task (task i is row i of
    every leaf); each row is repeated G times for its group, and `budget_mode` 'full' gives every episode
    T_max turns, 'budgetmix' one budget per group drawn from `budgets.budgetmix_candidates(T_max)`, 'tight' the
    tightest tier's.

    Returns the new state, metrics (rollout statistics + the mean of the train-step metrics, and
    `zero_advantage_groups` / `zero_gradient_updates`, see `iteration_warnings`) and the rollout.
    `values_fn(critic_params, tokens) -> [B, S]` is needed for PPO.

    `logprobs_fn(params, tokens) -> [B, S]` (the trainer's log-probs, e.g. `logprobs.make_logprobs_fn`;
    given with a truncated-IS train step, `LossSettings.tis_cap`): when the iteration makes more than
    one update (epochs x minibatches > 1), the trainer's log-probs under the pre-update params are
    computed once, before the first update, and every update gets them as `old_logprobs` (the PPO
    ratio's pi_old) with the sampler's as `sampler_logprobs` (the TIS weight's denominator):
      L = -E_t[ min(pi_old(a_t) / pi_sampler(a_t), C) *
                min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t) ],   r_t = pi_theta(a_t) / pi_old(a_t),
    the decoupled PPO objective (behaviour policy pi_sampler, proximal policy pi_old: Hilton et al.
    2022, "Batch size-invariance for policy optimization") with the truncated importance-sampling
    weight of Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (TIS; `losses.truncated_is_weights`). With one update the train step's own first
    forward is pi_old (exact, no extra forward) and `logprobs_fn` is not called; without it the
    sampler's log-probs are pi_old in every update.
    """
    t_max = t_max_of(rollout_fn, t_max)
    state, key = split_rng(state)
    k_task, k_budget, k_roll, k_shuffle = jax.random.split(key, 4)
    tasks = sample_tasks_fn(k_task, settings.n_tasks)
    tasks = jax.tree.map(lambda x: jnp.repeat(x, settings.group_size, axis=0), tasks)
    budgets = sample_budgets(k_budget, settings, t_max)
    ro = rollout_fn(state.params, tasks, budgets, k_roll)  # budgets stay on device
    values = None if settings.estimator != "ppo" else values_fn(state.critic_params, ro.tokens)
    adv, keep, extra = compute_advantages(ro, settings, values)
    batch = {"tokens": ro.tokens, "policy_mask": ro.policy_mask & keep[:, None], "advantages": adv,
             "old_logprobs": ro.logprobs, **extra}
    if logprobs_fn is not None and settings.epochs * settings.minibatches > 1:  # pi_old once, pre-update
        batch["old_logprobs"] = logprobs_fn(state.params, ro.tokens)
        batch["sampler_logprobs"] = ro.logprobs
    b = settings.batch_size
    mb = b // settings.minibatches
    train_metrics = []
    for epoch in range(settings.epochs):
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(k_shuffle, epoch), b))
        for i in range(settings.minibatches):
            idx = perm[i * mb:(i + 1) * mb]
            state, m = train_step(state, jax.tree.map(lambda x: x[idx], batch))
            train_metrics.append(m)
    state = advance_data(state, settings.n_tasks)
    metrics = {k: float(np.mean([float(m[k]) for m in train_metrics])) for k in train_metrics[0]}
    # the sampler/trainer mismatch is defined before any update: the first step's figures
    for k in ("mismatch_mean", "mismatch_max"):
        if k in train_metrics[0]:
            metrics[k] = float(train_metrics[0][k])
    metrics.update(rollout_metrics(ro))
    metrics["kept_fraction"] = float(np.mean(np.asarray(keep)))
    r_PxG = np.asarray(ro.episode_return).reshape(-1, settings.group_size)
    metrics["zero_advantage_groups"] = float(np.mean((r_PxG == r_PxG[:, :1]).all(axis=1)))
    if "grad_norm" in train_metrics[0]:
        metrics["zero_gradient_updates"] = float(np.mean([float(m["grad_norm"]) == 0.0 for m in train_metrics]))
    return state, metrics, ro


def iterate(state: TrainState, *, iterations: int, rollout_fn: Callable[..., Rollout], sample_tasks_fn: Callable,
            train_step: Callable, settings: RLSettings, t_max: Optional[int] = None,
            values_fn: Optional[Callable] = None, logprobs_fn: Optional[Callable] = None,
            callback: Optional[Callable[[int, dict, TrainState], None]] = None) -> tuple[TrainState, list[dict]]:
    """`rl_iteration` from the state's iteration (data_pos // n_tasks: 0 when fresh, the next one when restored)
    up to `iterations`; each metrics dict gets its "iteration" and goes to `callback(iteration, metrics, state)`
    (which may add to it: logging, evaluation, checkpoints). Returns the last state and the metrics of the
    iterations run here. The loop of `jaxagent.trainer.make_train` and of the FrozenLake study's arms."""
    history = []
    for it in range(int(state.data_pos) // settings.n_tasks, iterations):
        state, m, _ = rl_iteration(state, rollout_fn=rollout_fn, sample_tasks_fn=sample_tasks_fn,
                                   train_step=train_step, settings=settings, t_max=t_max, values_fn=values_fn,
                                   logprobs_fn=logprobs_fn)
        m["iteration"] = it
        history.append(m)
        if callback is not None:
            callback(it, m, state)
    return state, history


def iteration_warnings(metrics: dict, settings: RLSettings) -> list[str]:
    """One line per sign that an iteration learned nothing, from `rl_iteration`'s metrics:
      zero_advantage_groups = (1/P) sum_p 1[R_p1 = ... = R_pG], the share of groups whose G outcome rewards are
        all equal; GRPO, Dr.GRPO and RLOO give such a group zero advantage (Shao et al. 2024, eq. 3: A_i =
        (R_i - mean R) / std R; DAPO's dynamic sampling, Yu et al. 2025, drops them for that reason). 1.0 with
        an outcome estimator: no policy-gradient signal at all (an env where every episode succeeds or fails);
      zero_gradient_updates = the share of this iteration's updates whose gradient norm was exactly 0.
    The library prints nothing: `rl.trainer` hands these lines to its logger."""
    out = []
    if metrics.get("zero_gradient_updates", 0.0) >= 1.0:
        out.append(f"every update had a zero gradient (grad_norm 0.0): nothing was learned; zero_advantage_groups "
                   f"{metrics.get('zero_advantage_groups', float('nan')):.2f}, success_rate "
                   f"{metrics.get('success_rate', float('nan')):.2f}")
    elif metrics.get("zero_advantage_groups", 0.0) >= 1.0 and settings.estimator in ("grpo", "dr_grpo", "rloo"):
        out.append(f"every group's {settings.group_size} rewards were equal (zero_advantage_groups 1.00, "
                   f"success_rate {metrics.get('success_rate', float('nan')):.2f}): {settings.estimator} has no "
                   "policy-gradient signal this iteration")
    return out


def rollout_metrics(ro: Rollout) -> dict:
    """Batch statistics of a rollout; success_rate is R_multi (docs/study.md)."""
    return {"success_rate": float(np.mean(np.asarray(ro.success))),
            "mean_return": float(np.mean(np.asarray(ro.episode_return))),
            "mean_turns": float(np.mean(np.asarray(ro.turns_used))),
            "valid_action_rate": float(np.asarray(ro.turns.valid).sum() / max(1, np.asarray(ro.turns.active).sum())),
            "mean_generated_tokens": float(np.mean(np.asarray(ro.generated_tokens)))}
