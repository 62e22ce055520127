"""The study's training stages on the toy world: the SFT "base" model and the RL arms.

Each stage is a function of explicit settings returning params and a history of measured metrics;
the experiments/ scripts add the CLI, progress bars, files and checkpoints through `callback`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent.envs import budgets as budgets_lib
from jaxagent.envs.frozenlake import FrozenLakeParams, sample_tasks
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import critic as critic_lib
from jaxagent.rl.loop import RLSettings, rl_iteration
from jaxagent.rl.optim import make_optimizer
from jaxagent.rl.sft import make_sft_step
from jaxagent.rl.train_step import LossSettings, ValueSettings, init_train_state, make_train_step
from jaxagent.rollout import RolloutConfig, oracle_process_reward, rollout
from jaxagent.study.toy import ToyWorld, expert_rollouts


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """The FrozenLake task distribution and interaction limits shared by every stage."""

    size: int = 4
    frozen_prob: float = 0.8
    random_start: bool = True
    success_rate: float = 1.0        # 1.0 deterministic; 1/3 gymnasium's slippery ice
    t_max: int = 8
    max_action_tokens: int = 4
    max_context: int = 384

    def env_params(self) -> FrozenLakeParams:
        return FrozenLakeParams(success_rate=self.success_rate, frozen_prob=self.frozen_prob, horizon=self.t_max)

    def sample(self, key, n):
        return sample_tasks(key, n, self.size, self.frozen_prob, random_start=self.random_start)

    def rollout_config(self, **kw) -> RolloutConfig:
        """The study's one RolloutConfig: the oracle process reward is always recorded and forced actions
        always compiled in, so training, every arm and every evaluation share a single rollout compile."""
        kw.setdefault("process_reward_fn", oracle_process_reward)
        kw.setdefault("allow_forced", True)
        return RolloutConfig(t_max=self.t_max, max_action_tokens=self.max_action_tokens,
                             max_context=self.max_context, **kw)


@dataclasses.dataclass(frozen=True)
class BaseSettings:
    """SFT of a from-scratch tiny Qwen3 on the epsilon-noisy budget-aware expert (BudgetMix budgets,
    so the base sees every budget level)."""

    n_episodes: int = 2048
    epsilon: float = 0.25
    steps: int = 400
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 20


def train_base(world: ToyWorld, cfg: Qwen3Config, key, ts: TaskSettings, bs: BaseSettings,
               callback: Optional[Callable[[int, dict], None]] = None):
    """Returns (params, history): SFT on expert trajectories, loss on the expert's reply tokens only."""
    k_task, k_budget, k_roll, k_init, k_batch = jax.random.split(key, 5)
    tasks = ts.sample(k_task, bs.n_episodes)
    budgets = np.asarray(budgets_lib.sample_budgetmix(k_budget, bs.n_episodes, 1, ts.t_max))
    data = expert_rollouts(world, tasks, budgets, k_roll, ts.env_params(), epsilon=bs.epsilon, t_max=ts.t_max,
                           max_action_tokens=ts.max_action_tokens, max_context=ts.max_context)
    width = int(math.ceil(int(np.max(np.asarray(data.length))) / 16) * 16)
    toks, mask = np.asarray(data.tokens[:, :width]), np.asarray(data.policy_mask[:, :width])
    params = qwen3.init(cfg, k_init)
    warmup = min(bs.warmup, bs.steps // 5)
    sched = optax.warmup_cosine_decay_schedule(0.0, bs.lr, warmup, max(bs.steps, warmup + 1), bs.lr * 0.1)
    opt = optax.adamw(sched, weight_decay=0.0)
    opt_state = opt.init(params)
    step = make_sft_step(cfg, opt)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(k_batch)).ravel()[-1])
    history = [{"expert_success_rate": float(np.mean(np.asarray(data.success))), "sft_sequence_width": width}]
    for i in range(bs.steps):
        idx = rng.integers(0, bs.n_episodes, bs.batch_size)
        params, opt_state, m = step(params, opt_state, toks[idx], mask[idx])
        if callback is not None or i == bs.steps - 1:
            rec = {"step": i, **{k: float(v) for k, v in m.items()}}
            history.append(rec)
            if callback is not None:
                callback(i, rec)
    return params, history


@dataclasses.dataclass(frozen=True)
class ArmSettings:
    """One RL arm: the estimator settings plus optimisation."""

    name: str
    rl: RLSettings
    iterations: int = 30
    lr: float = 1e-4
    temperature: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    critic_lr: float = 1e-3


ARMS = {
    "grpo": RLSettings(estimator="grpo"),
    "budgetmix": RLSettings(estimator="grpo", budget_mode="budgetmix"),
    "gigpo": RLSettings(estimator="gigpo"),
    "ppo": RLSettings(estimator="ppo", group_size=8),
    "grpo_oracle": RLSettings(estimator="process"),
}


@dataclasses.dataclass(frozen=True)
class ArmRuntime:
    """Compiled pieces of an arm, shared by every seed (and by arms with the same settings)."""

    rollout_fn: Callable
    train_step: Callable
    optimizer: object
    critic_optimizer: object
    values_fn: Optional[Callable]
    value_settings: Optional[ValueSettings]


def make_arm_runtime(world: ToyWorld, cfg: Qwen3Config, ts: TaskSettings, arm: ArmSettings) -> ArmRuntime:
    from jaxagent.sampling import Sampler

    env_params = ts.env_params()
    ppo = arm.rl.estimator == "ppo"
    rcfg = ts.rollout_config(sampler=Sampler(temperature=arm.temperature))
    opt = make_optimizer(arm.lr, max_grad_norm=1.0)
    vs = ValueSettings() if ppo else None
    copt = make_optimizer(arm.critic_lr, max_grad_norm=1.0) if ppo else None
    step = make_train_step(cfg, opt, LossSettings(clip_low=arm.clip_low, clip_high=arm.clip_high,
                                                  kl_coef=arm.kl_coef),
                           with_ref_params=arm.kl_coef > 0, value_settings=vs, critic_optimizer=copt)

    def rollout_fn(params, tasks, budgets, k):
        return rollout(params, cfg, world.env, world.layout, world.fmt, tasks, budgets, k, env_params, rcfg)

    values_fn = jax.jit(lambda cp, toks: critic_lib.values(cp, cfg, toks)) if ppo else None
    return ArmRuntime(rollout_fn, step, opt, copt, values_fn, vs)


def train_rl(world: ToyWorld, cfg: Qwen3Config, base_params, key, ts: TaskSettings, arm: ArmSettings,
             callback: Optional[Callable[[int, dict, object], None]] = None, state=None,
             runtime: Optional[ArmRuntime] = None):
    """Returns (state, history). RL from the base params; `state` resumes a saved TrainState.

    callback(iteration, metrics, state) runs after every iteration (progress, checkpoints, R_single).
    `runtime` (from `make_arm_runtime`) lets seeds and arms share compiled functions.
    """
    rt = runtime or make_arm_runtime(world, cfg, ts, arm)
    if state is None:
        state = init_train_state(cfg, rt.optimizer, key, params=base_params, value_settings=rt.value_settings,
                                 critic_optimizer=rt.critic_optimizer, with_ref_params=arm.kl_coef > 0)
    history = []
    start = int(state.data_pos) // arm.rl.n_tasks
    for it in range(start, arm.iterations):
        state, m, _ = rl_iteration(state, rollout_fn=rt.rollout_fn, sample_tasks_fn=ts.sample,
                                   train_step=rt.train_step, settings=arm.rl, t_max=ts.t_max,
                                   values_fn=rt.values_fn)
        m["iteration"] = it
        history.append(m)
        if callback is not None:
            callback(it, m, state)
    return state, history
