"""The study's training stages on the toy world: the SFT "base" model and the RL arms.

Each stage is a function of explicit settings returning params and a history of measured metrics;
the experiments/ scripts add the CLI, progress bars, files and checkpoints through `callback`.

Device mesh: every stage takes an optional (data, fsdp, tensor) `mesh` (`sharding.make_mesh`). With
one, parameters (and optimizer state) live sharded per `sharding.RULES`, batches are split over the
rules' batch axes, and the RL train step is the sharded `build_train_step(mesh=...)`; mesh=None runs
everything on the default device.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import jax
import numpy as np
import optax
from jax.sharding import Mesh

from jaxagent import sharding
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.envs.jax.frozenlake import FrozenLakeParams, sample_tasks
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import critic as critic_lib
from jaxagent.rl.logprobs import make_logprobs_fn
from jaxagent.rl.loop import RLSettings, iterate
from jaxagent.rl.memory_plan import MemoryPlan, resolve_compute_dtype
from jaxagent.rl.optim import make_optimizer
from jaxagent.rl.sft import make_sft_step
from jaxagent.rl.train_state import (LossSettings, ValueSettings, abstract_train_state, init_train_state,
                                     state_shardings, train_state_init_fn)
from jaxagent.rl.train_step import build_train_step
from jaxagent.rollout import RolloutConfig, oracle_process_reward, rollout
from jaxagent.sampling import Sampler
from jaxagent.sampling.generate import rollout_params
from jaxagent.study import plan_mode
from jaxagent.study.toy import ToyWorld, expert_rollouts


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


BASE_BUDGET_MODES = ("full", "budgetmix")
# The first line of a rehearsal's report (`frozenlake.presets.rehearsal_preset`, `host.presets.rehearsal_preset`).
REHEARSAL_NOTE = ("a rehearsal: the preset's pipeline with its counts cut (one seed, one iteration, a few episodes "
                  "and held-out tasks, short turns); its figures check that every stage runs, they measure nothing "
                  "of the study")

# The first line of a `ci` / `ci-*` preset's report: a test of the pipeline, not a study.
PLUMBING_NOTE = ("a plumbing check: a tiny random Qwen3 runs every stage for minutes; nothing is expected to learn, "
                 "so its seeds are flagged collapsed and its verdicts measure nothing of the study")


def report_banner(preset) -> dict:
    """The report's first meta line when its figures measure nothing: a rehearsal (`REHEARSAL_NOTE`) or a `ci`
    preset (`PLUMBING_NOTE`, named ci or ci-<domain>); else {}."""
    if getattr(preset, "rehearsal", False):
        return {"rehearsal": REHEARSAL_NOTE}
    if preset.name == "ci" or preset.name.startswith("ci-"):
        return {"plumbing check": PLUMBING_NOTE}
    return {}


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


def place_params(params, cfg: Qwen3Config, mesh=None):
    """`params` on the mesh's parameter shardings (`qwen3.logical_axes` + `sharding.RULES`); a no-op
    without a mesh (or params None) and for params already placed so."""
    if mesh is None or params is None:
        return params
    return sharding.shard(params, sharding.shardings_for(qwen3.logical_axes(cfg), params, mesh))


def sft_budgets(key, n: int, t_max: int, budget_mode: str) -> np.ndarray:
    """int32[n] budgets of SFT episodes: T_max ("full") or BudgetMix draws ("budgetmix"), `BaseSettings`."""
    if budget_mode == "full":
        return np.full((n,), int(t_max), np.int32)
    if budget_mode == "budgetmix":
        return np.asarray(budgets_lib.sample_budgetmix(key, n, 1, t_max), np.int32)
    raise ValueError(f"budget_mode must be one of {BASE_BUDGET_MODES}, got {budget_mode!r}")


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


def sft_optimizer(lr: float, warmup: int, steps: int):
    """`fit_sft`'s AdamW: the learning rate warmed up linearly over min(warmup, steps // 5) steps to `lr`, then
    cosine-decayed to lr / 10 at `steps`; no weight decay."""
    warmup = min(warmup, steps // 5)
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr * 0.1)
    return optax.adamw(sched, weight_decay=0.0)


def sft_widths(world: ToyWorld, ts: TaskSettings) -> tuple[int, ...]:
    """The widths S `sft_data` can give the base's SFT rows (every multiple of 16 from the longest plan row to
    max_context, which holds every multi-turn episode): the shapes of its SFT steps, widest last."""
    low = plan_mode.plan_sft_width(world, ts.t_max)
    return tuple(range(low, max(low, int(math.ceil(ts.max_context / 16) * 16)) + 1, 16))


def fit_sft(params, cfg: Qwen3Config, toks_ExS, mask_ExS, k_batch, *, steps: int, batch_size: int, lr: float,
            warmup: int, callback: Optional[Callable[[int, dict], None]] = None, mesh=None,
            targets: Optional[int] = None, width_bucket: Optional[int] = None):
    """(params, records): `steps` AdamW updates of `rl.sft` on batches of `batch_size` rows drawn with
    replacement from the E rows (toks_ExS, mask_ExS: the targets), learning rate warmed up linearly over
    min(warmup, steps // 5) steps to `lr`, then cosine-decayed to lr / 10. `targets`: the loss's target
    positions per row (`rl.sft.make_sft_step`). With a `mesh` each batch is split over its batch axes (when they
    divide batch_size; else replicated). A record {step, loss, token_accuracy, grad_norm} per step when there is
    a `callback` (which gets each), else the last step's only. `width_bucket`: each batch is cut to the slots up to
    its rows' last target, rounded up to a multiple of width_bucket (one compile per width; the slots cut hold no
    target and, the attention being causal, change no target's logits); None: every batch at width S."""
    if width_bucket is not None and width_bucket < 1:
        raise ValueError(f"width_bucket must be >= 1 or None, got {width_bucket}")
    ends_E = (np.asarray(mask_ExS).shape[1] - np.argmax(np.asarray(mask_ExS)[:, ::-1], axis=1)
              if width_bucket is not None else None)  # one past each row's last target
    row_sh = None if mesh is None else sharding.batch_sharding(mesh, 2, batch_size=batch_size)
    opt = sft_optimizer(lr, warmup, steps)
    opt_state = opt.init(params)
    step = make_sft_step(cfg, opt, targets)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(k_batch)).ravel()[-1])
    records = []
    for i in range(steps):
        idx = rng.integers(0, len(toks_ExS), batch_size)
        tb, mb = toks_ExS[idx], mask_ExS[idx]
        if ends_E is not None:
            width = min(int(-(-ends_E[idx].max() // width_bucket) * width_bucket), tb.shape[1])
            tb, mb = tb[:, :width], mb[:, :width]
        if row_sh is not None:
            tb, mb = jax.device_put(tb, row_sh), jax.device_put(mb, row_sh)
        params, opt_state, m = step(params, opt_state, tb, mb)
        if callback is not None or i == steps - 1:
            rec = {"step": i, **{k: float(v) for k, v in m.items()}}
            records.append(rec)
            if callback is not None:
                callback(i, rec)
    return params, records


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
    kl_estimator: str = "k3"          # the KL term: sampled k1/k2/k3 (`losses.kl_penalty`) or "exact" (`losses.exact_kl`)
    entropy_coef: float = 0.0
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
    """Compiled pieces of an arm, shared by every seed (and by arms with the same settings).

    With a mesh, `train_step` (and `values_fn`, `logprobs_fn`) place their inputs on `state_shardings` /
    the batch-row sharding first (a no-op for arrays already there); `rollout_fn` runs on a copy of the
    params laid out per `sharding.ROLLOUT_RULES`, episodes split over the batch axes, under the mesh
    context, and returns replicated arrays (readable on every host).
    """

    rollout_fn: Callable
    train_step: Callable
    optimizer: object
    critic_optimizer: object
    values_fn: Optional[Callable]
    value_settings: Optional[ValueSettings]
    mesh: Optional[Mesh] = None
    state_shardings: Any = None        # a TrainState of NamedShardings when mesh is given
    with_ref_params: bool = False
    logprobs_fn: Optional[Callable] = None  # with TIS: the trainer's pre-update log-probs (`rl_iteration`)


def shared_key(arm: ArmSettings):
    """What an arm's compiled pieces (`make_arm_step`, `make_arm_runtime`) depend on: arms with equal keys share
    them (one compile). Everything but the name, the estimator's settings and the iteration count, and whether
    the estimator trains a critic."""
    return dataclasses.replace(arm, name="", rl=None, iterations=0), arm.rl.estimator == "ppo"


@dataclasses.dataclass(frozen=True)
class ArmStep:
    """An arm's jitted train step and what its TrainState holds (`make_arm_step`): the FrozenLake and host
    runtimes call `jit`, and the AOT check (experiments/aot_check.py) lowers it on `abstract_state`, so the
    program checked is the program run."""

    jit: Callable                       # (TrainState, batch) -> (TrainState, metrics), `build_train_step`
    optimizer: object
    critic_optimizer: object = None     # PPO's critic; None without one
    value_settings: Optional[ValueSettings] = None
    with_ref_params: bool = False       # the state carries the reference params (kl_coef > 0)

    def state_shardings(self, cfg: Qwen3Config, mesh: Mesh):
        return state_shardings(cfg, self.optimizer, mesh, with_ref_params=self.with_ref_params,
                               value_settings=self.value_settings, critic_optimizer=self.critic_optimizer)

    def abstract_state(self, cfg: Qwen3Config, mesh: Optional[Mesh] = None):
        """ShapeDtypeStructs of the arm's TrainState (sharded on `mesh` when given); allocates nothing."""
        return abstract_train_state(cfg, self.optimizer, mesh=mesh, with_ref_params=self.with_ref_params,
                                    value_settings=self.value_settings, critic_optimizer=self.critic_optimizer)

    def init_jit(self, cfg: Qwen3Config, mesh: Optional[Mesh] = None):
        """The jitted (key, params, critic_params) -> TrainState that `init_arm_state` runs on the run's `mesh`
        (None: one device), `train_state.train_state_init_fn`."""
        return train_state_init_fn(cfg, self.optimizer, mesh=mesh, with_ref_params=self.with_ref_params,
                                   value_settings=self.value_settings, critic_optimizer=self.critic_optimizer)


def make_arm_step(cfg: Qwen3Config, arm: ArmSettings, *, mesh: Optional[Mesh] = None,
                  memory: MemoryPlan = MemoryPlan(), tis_cap: Optional[float] = None) -> ArmStep:
    """The train step of `arm`: PPO-clip with the arm's clip / KL (`arm.kl_estimator`, the reference params in
    the state when kl_coef > 0) / entropy settings, AdamW at `arm.lr` with gradient clipping at 1.0, and with
    estimator 'ppo' a critic (`ValueSettings()`, AdamW at `arm.critic_lr`); `memory`: the step's `MemoryPlan`;
    `tis_cap`: see `make_arm_runtime` (`build_train_step`)."""
    ppo = arm.rl.estimator == "ppo"
    opt = make_optimizer(arm.lr, max_grad_norm=1.0)
    vs = ValueSettings() if ppo else None
    copt = make_optimizer(arm.critic_lr, max_grad_norm=1.0) if ppo else None
    with_ref = arm.kl_coef > 0
    jit = build_train_step(cfg, opt, LossSettings(clip_low=arm.clip_low, clip_high=arm.clip_high,
                                                  kl_coef=arm.kl_coef, kl_estimator=arm.kl_estimator,
                                                  entropy_coef=arm.entropy_coef, tis_cap=tis_cap),
                           memory, mesh, with_ref_params=with_ref, value_settings=vs, critic_optimizer=copt)
    return ArmStep(jit, opt, copt, vs, with_ref)


def make_arm_runtime(world: ToyWorld, cfg: Qwen3Config, ts: TaskSettings, arm: ArmSettings, *,
                     mesh: Optional[Mesh] = None, compute_dtype=None, micro_batches: int = 1,
                     remat: Optional[str] = None, tis_cap: Optional[float] = None) -> ArmRuntime:
    """The rollout, train step and optimizers of an arm. `mesh`: run sharded on it (module doc);
    `compute_dtype` (e.g. 'bfloat16'): the dtype of the policy's forward passes in the train step and
    in the training rollouts (the master params and Adam moments stay float32). `micro_batches`,
    `remat`: the train step's gradient accumulation and per-layer checkpointing, and the row chunks of
    PPO's critic values (memory only; same update); `tis_cap`: truncated importance sampling on the
    sampler's log-probs (`LossSettings`), with the trainer's pre-update log-probs as the ratio's
    pi_old when an iteration makes several updates (`rl_iteration(logprobs_fn=)`)."""
    env_params = ts.env_params()
    ppo = arm.rl.estimator == "ppo"
    cdt = resolve_compute_dtype(compute_dtype)
    rcfg = ts.rollout_config(sampler=Sampler(temperature=arm.temperature))
    arm_step = make_arm_step(cfg, arm, mesh=mesh, memory=MemoryPlan(micro_batches=micro_batches, remat=remat,
                                                                    compute_dtype=compute_dtype), tis_cap=tis_cap)
    step, opt, copt, vs, with_ref = (arm_step.jit, arm_step.optimizer, arm_step.critic_optimizer,
                                     arm_step.value_settings, arm_step.with_ref_params)

    st_sh = None
    if mesh is not None:
        st_sh = arm_step.state_shardings(cfg, mesh)
        row_sh = sharding.row_sharding(mesh)
        sharded_step = step

        def step(state, batch):
            return sharded_step(jax.device_put(state, st_sh), jax.device_put(batch, row_sh))

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


def init_arm_state(rt: ArmRuntime, cfg: Qwen3Config, key, base_params):
    """A fresh TrainState of the arm from the base params, on the runtime's mesh when it has one."""
    return init_train_state(cfg, rt.optimizer, key, mesh=rt.mesh, params=place_params(base_params, cfg, rt.mesh),
                            value_settings=rt.value_settings, critic_optimizer=rt.critic_optimizer,
                            with_ref_params=rt.with_ref_params)


def abstract_arm_state(rt: ArmRuntime, cfg: Qwen3Config, key, base_params):
    """ShapeDtypeStructs of `init_arm_state`'s result, with the mesh shardings when the runtime has a mesh
    (the restore target of a checkpoint: arrays come back sharded as the train step expects)."""
    shapes = jax.eval_shape(lambda: init_arm_state(rt, cfg, key, base_params))
    if rt.mesh is None:
        return shapes
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, rt.state_shardings)


def train_rl(world: ToyWorld, cfg: Qwen3Config, base_params, key, ts: TaskSettings, arm: ArmSettings,
             callback: Optional[Callable[[int, dict, object], None]] = None, state=None,
             runtime: Optional[ArmRuntime] = None, *, mesh: Optional[Mesh] = None, compute_dtype=None):
    """Returns (state, history). RL from the base params; `state` resumes a saved TrainState.

    callback(iteration, metrics, state) runs after every iteration (progress, checkpoints, R_single).
    `runtime` (from `make_arm_runtime`) lets seeds and arms share compiled functions; without one,
    a runtime is built with `mesh` and `compute_dtype` (see `make_arm_runtime`).
    """
    rt = runtime or make_arm_runtime(world, cfg, ts, arm, mesh=mesh, compute_dtype=compute_dtype)
    if state is None:
        state = init_arm_state(rt, cfg, key, base_params)
    return iterate(state, iterations=arm.iterations, rollout_fn=rt.rollout_fn, sample_tasks_fn=ts.sample,
                   train_step=rt.train_step, settings=arm.rl, t_max=ts.t_max, values_fn=rt.values_fn,
                   logprobs_fn=rt.logprobs_fn, callback=callback)
