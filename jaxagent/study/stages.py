"""The FrozenLake study's training stages on the toy world: the SFT "base" model (`train_base`) and the runtime of
its RL arms (`make_arm_runtime`: the jitted rollout beside the arm's train step).

Each stage is a function of explicit settings returning params and a history of measured metrics;
the experiments/ scripts add the CLI, progress bars, files and checkpoints through `callback`.

What both studies share (the arms' settings, train step and state, `train_rl`, the SFT fit, the report banner) is
in `jaxagent.study.common`; its names are also reachable here, where the FrozenLake study and its tools read them.

Device mesh: every stage takes an optional (data, fsdp, tensor) `mesh` (`sharding.make_mesh`), as
`common.arms` describes; mesh=None runs everything on the default device.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import jax
import numpy as np
from jax.sharding import Mesh

from jaxagent import sharding
from jaxagent.envs.jax.frozenlake import FrozenLakeParams, sample_tasks
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import critic as critic_lib
from jaxagent.rl.logprobs import make_logprobs_fn
from jaxagent.rl.memory_plan import MemoryPlan, resolve_compute_dtype
from jaxagent.rollout import RolloutConfig, oracle_process_reward, rollout
from jaxagent.sampling import Sampler
from jaxagent.sampling.generate import rollout_params
from jaxagent.study import plan_mode
from jaxagent.study.common.arms import (ARMS, ArmRuntime, ArmSettings, ArmStep, abstract_arm_state,
                                        init_arm_state, make_arm_step, place_params, placed_step, shared_key,
                                        train_rl)
from jaxagent.study.common.banner import PLUMBING_NOTE, REHEARSAL_NOTE, report_banner
from jaxagent.study.common.sft import BASE_BUDGET_MODES, fit_sft, sft_budgets, sft_optimizer
from jaxagent.study.toy import ToyWorld, expert_rollouts

# this module's own stages, then the shared names (`jaxagent.study.common`) its callers read from here
__all__ = ["TaskSettings", "BaseSettings", "sft_data", "train_base", "sft_widths", "make_arm_runtime",
           "ARMS", "ArmRuntime", "ArmSettings", "ArmStep", "abstract_arm_state", "init_arm_state", "make_arm_step",
           "place_params", "placed_step", "resolve_compute_dtype", "shared_key", "train_rl", "PLUMBING_NOTE",
           "REHEARSAL_NOTE", "report_banner", "BASE_BUDGET_MODES", "fit_sft", "sft_budgets", "sft_optimizer"]


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """The FrozenLake task distribution and interaction limits shared by every stage."""

    size: int = 4
    frozen_prob: float = 0.8
    random_start: bool = True
    success_rate: float = 1.0        # 1.0 deterministic; 1/3 gymnasium's slippery ice
    format_penalty: float = 0.0      # reward -format_penalty for an invalid reply (the turn is spent, no move)
    t_max: int = 8
    max_action_tokens: int = 4
    max_context: int = 384

    def env_params(self) -> FrozenLakeParams:
        return FrozenLakeParams(success_rate=self.success_rate, frozen_prob=self.frozen_prob,
                                format_penalty=self.format_penalty, horizon=self.t_max)

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
    """SFT of a from-scratch tiny Qwen3 on the epsilon-noisy budget-aware expert.

    budget_mode: the budgets of the SFT episodes (announced in every prompt as in RL).
      "full"      every episode at T_max (the default). Finding 8 compares BudgetMix RL with full-budget RL
                  from the same base; a base trained on BudgetMix budgets would already be budget-aware, so
                  full-budget GRPO would start with what BudgetMix RL is meant to add and the gain would
                  shrink by construction. At "full" the base has only seen T_max announced.
      "budgetmix" the BudgetMix budgets (`budgets.sample_budgetmix`, the same draw as the BudgetMix arm).
    plan_fraction: share of the SFT episodes in plan mode (`plan_mode`): the prompt asks for every move at
      once and the target reply is the expert episode's whole move sequence, so the base can answer the plan
      prompts R_single is measured on (without them its plan success would be 0 and could only rise).
    """

    n_episodes: int = 2048
    epsilon: float = 0.25
    steps: int = 400
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 20
    budget_mode: str = "full"
    plan_fraction: float = 0.25

    def __post_init__(self):
        if self.budget_mode not in BASE_BUDGET_MODES:
            raise ValueError(f"BaseSettings.budget_mode must be one of {BASE_BUDGET_MODES}, got "
                             f"{self.budget_mode!r}")
        f = self.plan_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f < 1.0:
            raise ValueError(f"BaseSettings.plan_fraction must be a number in [0, 1), got {f!r}")

    def n_plan(self) -> int:
        """Plan-mode episodes among the n_episodes: round(plan_fraction * n_episodes)."""
        return int(round(self.plan_fraction * self.n_episodes))




def sft_data(world: ToyWorld, key, ts: TaskSettings, bs: BaseSettings) -> dict:
    """The base's SFT rows: n_episodes - n_plan multi-turn episodes of the noisy expert, then n_plan plan-mode
    rows (`plan_mode.plan_sft_rows`: the same expert's episode on another task, its whole move sequence as ONE
    reply to the plan prompt). Budgets per `bs.budget_mode`, tasks from `ts`. Returns tokens int32[E, S],
    mask bool[E, S] (the expert's reply tokens), is_plan bool[E], expert_success bool[E] (of the episode the
    row was made from) and width S (a multiple of 16)."""
    k_task, k_budget, k_roll = jax.random.split(key, 3)
    n, n_plan = bs.n_episodes, bs.n_plan()
    tasks = ts.sample(k_task, n)
    budgets = sft_budgets(k_budget, n, ts.t_max, bs.budget_mode)
    data = expert_rollouts(world, tasks, budgets, k_roll, ts.env_params(), epsilon=bs.epsilon, t_max=ts.t_max,
                           max_action_tokens=ts.max_action_tokens, max_context=ts.max_context)
    n_multi = n - n_plan
    lengths = np.asarray(data.length)
    width = max(int(np.max(lengths[:n_multi])) if n_multi else 0, plan_mode.plan_sft_width(world, ts.t_max))
    width = int(math.ceil(width / 16) * 16)
    pad = ((0, 0), (0, max(0, width - int(data.tokens.shape[1]))))  # plan rows wider than max_context
    toks = np.pad(np.asarray(data.tokens), pad, constant_values=world.layout.pad_id)[:, :width]
    mask = np.pad(np.asarray(data.policy_mask), pad)[:, :width]
    if n_plan:
        # every expert action is valid, so the active turns' actions are the episode's moves in order
        ptoks, pmask, _ = plan_mode.plan_sft_rows(world, tasks[n_multi:], budgets[n_multi:],
                                                  np.asarray(data.turns.action)[n_multi:],
                                                  np.asarray(data.turns_used)[n_multi:], ts.env_params(),
                                                  width=width)
        toks = np.concatenate([toks[:n_multi], np.asarray(ptoks)])
        mask = np.concatenate([mask[:n_multi], np.asarray(pmask)])
    is_plan = np.arange(n) >= n_multi
    return {"tokens": toks, "mask": mask, "is_plan": is_plan, "expert_success": np.asarray(data.success),
            "width": width}


def train_base(world: ToyWorld, cfg: Qwen3Config, key, ts: TaskSettings, bs: BaseSettings,
               callback: Optional[Callable[[int, dict], None]] = None, mesh=None):
    """Returns (params, history): SFT on `sft_data` (multi-turn and plan-mode expert episodes), loss on the
    expert's reply tokens only.

    With a `mesh` the params are sharded on it and each SFT batch is split over its batch axes (when
    they divide bs.batch_size; else the batch is replicated)."""
    k_data, k_init, k_batch = jax.random.split(key, 3)
    data = sft_data(world, k_data, ts, bs)
    toks, mask, width = data["tokens"], data["mask"], data["width"]
    multi = ~data["is_plan"]
    params = place_params(qwen3.init(cfg, k_init), cfg, mesh)
    success = data["expert_success"]
    history = [{"expert_success_rate": float(np.mean(success[multi])) if multi.any() else None,
                "expert_plan_success_rate": float(np.mean(success[~multi])) if (~multi).any() else None,
                "plan_episodes": int((~multi).sum()), "sft_sequence_width": width}]
    params, records = fit_sft(params, cfg, toks, mask, k_batch, steps=bs.steps, batch_size=bs.batch_size,
                              lr=bs.lr, warmup=bs.warmup, callback=callback, mesh=mesh)
    return params, history + records



def sft_widths(world: ToyWorld, ts: TaskSettings) -> tuple[int, ...]:
    """The widths S `sft_data` can give the base's SFT rows (every multiple of 16 from the longest plan row to
    max_context, which holds every multi-turn episode): the shapes of its SFT steps, widest last."""
    low = plan_mode.plan_sft_width(world, ts.t_max)
    return tuple(range(low, max(low, int(math.ceil(ts.max_context / 16) * 16)) + 1, 16))



def make_arm_runtime(world: ToyWorld, cfg: Qwen3Config, ts: TaskSettings, arm: ArmSettings, *,
                     mesh: Optional[Mesh] = None, compute_dtype=None, micro_batches: int = 1,
                     remat: Optional[str] = None, tis_cap: Optional[float] = None,
                     scan_layers: bool = False) -> ArmRuntime:
    """The rollout, train step and optimizers of an arm. `mesh`: run sharded on it (module doc);
    `compute_dtype` (e.g. 'bfloat16'): the dtype of the policy's forward passes in the train step and
    in the training rollouts (the master params and Adam moments stay float32). `micro_batches`,
    `remat`, `scan_layers`: the train step's gradient accumulation, per-layer checkpointing and layer loop, and
    the row chunks of PPO's critic values (memory only; same update); `tis_cap`: truncated importance sampling on the
    sampler's log-probs (`LossSettings`), with the trainer's pre-update log-probs as the ratio's
    pi_old when an iteration makes several updates (`rl_iteration(logprobs_fn=)`)."""
    env_params = ts.env_params()
    ppo = arm.rl.estimator == "ppo"
    cdt = resolve_compute_dtype(compute_dtype)
    rcfg = ts.rollout_config(sampler=Sampler(temperature=arm.temperature))
    arm_step = make_arm_step(cfg, arm, mesh=mesh, memory=MemoryPlan(micro_batches=micro_batches, remat=remat,
                                                                    compute_dtype=compute_dtype,
                                                                    scan_layers=scan_layers), tis_cap=tis_cap)
    opt, copt, vs, with_ref = (arm_step.optimizer, arm_step.critic_optimizer, arm_step.value_settings,
                               arm_step.with_ref_params)
    step, st_sh = placed_step(arm_step, cfg, mesh=mesh)  # state and batch rows on the mesh first
    if mesh is not None:
        row_sh = sharding.row_sharding(mesh)
        # rollouts come back fully replicated: readable on every process, whatever the compiler chose
        replicate = jax.jit(lambda tree: tree, out_shardings=sharding.replicated(mesh))

    def rollout_fn(params, tasks, budgets, k):
        # the decoding copy of the params: in the compute dtype and, on a mesh, laid out per
        # `sharding.ROLLOUT_RULES` (split over tensor, replicated over the batch axes; `rollout_params`)
        params = rollout_params(params, cfg, mesh=mesh, compute_dtype=cdt)
        if mesh is None:
            return rollout(params, cfg, world.env, world.layout, world.fmt, tasks, budgets, k, env_params, rcfg)
        # episodes split over the batch axes (where they divide the batch); under the mesh context the model
        # pins its activations (and so the KV cache) to the batch axes (`qwen3` module doc)
        n = np.shape(budgets)[0]
        tasks = jax.tree.map(lambda x: jax.device_put(x, sharding.batch_sharding(mesh, x.ndim, batch_size=n))
                             if np.ndim(x) and x.shape[0] == n else x, tasks)
        with jax.set_mesh(mesh):
            ro = rollout(params, cfg, world.env, world.layout, world.fmt, tasks, budgets, k, env_params, rcfg)
        return replicate(ro)

    values_fn = None
    if ppo:  # the critic's old values in the compute dtype too, as the train step computes the new ones;
        # rows over the mesh's batch axes and `micro_batches` row chunks (`critic.make_values_fn`)
        values_jit = critic_lib.make_values_fn(cfg, mesh=mesh, micro_batches=micro_batches, remat=remat,
                                               compute_dtype=cdt)

        def placed_values(cp, toks):
            return values_jit(jax.device_put(cp, st_sh.critic_params), jax.device_put(toks, row_sh))
        values_fn = values_jit if mesh is None else placed_values
    logprobs_fn = None
    if tis_cap is not None:  # decoupled PPO + TIS over several updates (`rl_iteration`): pi_old from the trainer
        logprobs_jit = make_logprobs_fn(cfg, mesh=mesh, micro_batches=micro_batches, remat=remat, compute_dtype=cdt)

        def placed_logprobs(params, toks):
            return logprobs_jit(jax.device_put(params, st_sh.params), jax.device_put(toks, row_sh))
        logprobs_fn = logprobs_jit if mesh is None else placed_logprobs
    return ArmRuntime(rollout_fn, step, opt, copt, values_fn, vs, mesh, st_sh, with_ref, logprobs_fn)
