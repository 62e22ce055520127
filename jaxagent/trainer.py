"""Train a policy on any jittable env end to end, in purejaxrl's shape: `train = make_train(config, cfg,
rollout_fn=..., sample_tasks_fn=...)`, then `result = train(key, params)`.

Each iteration is `rl.rl_iteration` (rollouts, advantages, updates; `rl.loop.iterate` is the loop, shared with
the FrozenLake study's arms); every `eval_every` iterations and after the last, Pass@(K,T) of the policy on
fixed held-out tasks (`eval.pass_kt_of`); with a `directory`, an orbax checkpoint (`rl.checkpoint`) every
`checkpoint_every` iterations, and a rerun resumes from the newest one (a checkpoint of other training
settings is refused, naming them); metrics and warning lines go to a logger (`rl.loggers`: jsonl by default).
`TrainConfig` is a frozen dataclass that `config_file` writes and reads as TOML.

Not jitted as a whole (unlike purejaxrl's `train`): checkpoints, evaluation and logging run on the host between
the jitted rollout and train step. Its own layer, above `eval`: it imports rl, rollout and eval. The FrozenLake
study's arms run the same loop (`iterate`) but not `make_train`: their run directory records each arm x seed's
settings, checks every update for divergence, logs R_single alongside, and evaluates every policy in three
budget modes after training (`study.frozenlake.train`), none of which a single training run needs.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, NamedTuple, Optional

import jax

from jaxagent import config_file
from jaxagent.envs.jax.base import check_anchor_rule
from jaxagent.eval.pass_drivers import pass_kt_of
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.rl import critic as critic_lib
from jaxagent.rl.loggers import JsonlLogger, Logger
from jaxagent.rl.loop import RLSettings, iterate, iteration_warnings
from jaxagent.rl.optim import make_optimizer
from jaxagent.rl.train_state import LossSettings, TrainState, ValueSettings, init_train_state
from jaxagent.rl.train_step import build_train_step
from jaxagent.rollout.jax_loop import RolloutFn

EVAL_TASKS_KEY, EVAL_KEY = 10_001, 10_002   # the held-out tasks and the evaluation's sampling: the same every time


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What `make_train` runs (a TOML file through `config_file`). Evaluation: `eval_tasks` held-out tasks x
    `eval_samples` episodes per budget tier (`eval_tiers`, () = `budgets.budget_tiers(T_max)`), Pass@k for
    k in `eval_ks`; `eval_every` 0 evaluates only after the last iteration, -1 never."""

    iterations: int = 100
    rl: RLSettings = RLSettings()
    loss: LossSettings = LossSettings()
    lr: float = 1e-5
    max_grad_norm: float = 1.0
    critic_lr: float = 1e-4           # estimator ppo: the critic's AdamW (rl.train_state.ValueSettings())
    eval_every: int = 10
    eval_tasks: int = 16
    eval_samples: int = 4
    eval_ks: tuple[int, ...] = (1, 2, 4)
    eval_tiers: tuple[int, ...] = ()
    checkpoint_every: int = 1
    keep_checkpoints: int = 2

    def __post_init__(self):
        for name in ("iterations", "eval_tasks", "eval_samples", "checkpoint_every", "keep_checkpoints"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.eval_every, int) or self.eval_every < -1:
            raise ValueError(f"TrainConfig.eval_every must be an int >= -1, got {self.eval_every!r}")
        if not self.eval_ks or min(self.eval_ks) < 1 or max(self.eval_ks) > self.eval_samples:
            raise ValueError(f"TrainConfig.eval_ks must be k in [1, eval_samples={self.eval_samples}], "
                             f"got {self.eval_ks}")
        if not self.lr > 0 or not self.max_grad_norm > 0:
            raise ValueError(f"TrainConfig.lr and max_grad_norm must be > 0, got {self.lr}, {self.max_grad_norm}")

    def training_settings(self) -> dict:
        """What a checkpoint must have been trained with to be resumed (iteration count and evaluation may change)."""
        keep = ("rl", "loss", "lr", "max_grad_norm", "critic_lr")
        return {k: v for k, v in config_file.to_dict(self).items() if k in keep}


class TrainResult(NamedTuple):
    state: TrainState
    history: list          # the metrics of each iteration this call ran (evaluations under "eval/...")


def eval_metrics(result: dict) -> dict:
    """`eval.pass_kt_of`'s result as flat metrics: eval/pass@k/T=t per tier t and k."""
    out = {}
    for u, t in enumerate(result["tiers"]):
        for j, k in enumerate(result["ks"]):
            out[f"eval/pass@{int(k)}/T={int(t)}"] = float(result["grid"][u][j])
    return out


def make_train(config: TrainConfig, cfg: Qwen3Config, *, rollout_fn: Callable, sample_tasks_fn: Callable,
               eval_tasks: Any = None, directory: Optional[str | os.PathLike] = None,
               logger: Optional[Logger] = None) -> Callable[..., TrainResult]:
    """`train(key, params=None) -> TrainResult`: `config.iterations` RL iterations from `params` (default: a
    random `qwen3.init(cfg, key)`) or from the newest checkpoint in `directory`/ckpt.

    rollout_fn(params, tasks, budgets, key) -> Rollout (`rollout.make_rollout_fn`: it holds T_max), and
    sample_tasks_fn(key, n) -> tasks: see `rl.rl_iteration`. eval_tasks: the held-out tasks (default
    sample_tasks_fn(key EVAL_TASKS_KEY, config.eval_tasks)). logger: default a `JsonlLogger` of
    `directory`/metrics.jsonl with a directory, else none (the result's history only). With a `RolloutFn`, the
    env's anchor rule is checked first on one task (`envs.jax.check_anchor_rule`)."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"make_train: config must be a TrainConfig; got {type(config).__name__}")
    if not isinstance(cfg, Qwen3Config):
        raise TypeError(f"make_train: cfg must be a Qwen3Config; got {type(cfg).__name__}")
    ppo = config.rl.estimator == "ppo"
    opt = make_optimizer(config.lr, max_grad_norm=config.max_grad_norm)
    vs = ValueSettings() if ppo else None
    copt = make_optimizer(config.critic_lr, max_grad_norm=config.max_grad_norm) if ppo else None
    with_ref = config.loss.kl_coef > 0
    step = build_train_step(cfg, opt, config.loss, with_ref_params=with_ref, value_settings=vs, critic_optimizer=copt)
    values_fn = critic_lib.make_values_fn(cfg) if ppo else None
    if logger is None and directory is not None:
        logger = JsonlLogger(os.path.join(os.fspath(directory), "metrics.jsonl"))
    held_out = eval_tasks

    def evaluate(params) -> dict:
        tiers = config.eval_tiers or None
        res = pass_kt_of(rollout_fn, params, held_out, jax.random.key(EVAL_KEY), n_samples=config.eval_samples,
                         ks=config.eval_ks, tiers=tiers, n_boot=100)
        return eval_metrics(res)

    def train(key, params=None) -> TrainResult:
        nonlocal held_out
        k_params, k_state = jax.random.split(key)
        if isinstance(rollout_fn, RolloutFn):
            first = jax.tree.map(lambda x: x[0], sample_tasks_fn(jax.random.key(EVAL_TASKS_KEY), 1))
            check_anchor_rule(rollout_fn.env, first, rollout_fn.env_params, where="make_train")
        if held_out is None and config.eval_every >= 0:
            held_out = sample_tasks_fn(jax.random.key(EVAL_TASKS_KEY), config.eval_tasks)
        params = qwen3.init(cfg, k_params) if params is None else params
        state = init_train_state(cfg, opt, k_state, params=params, with_ref_params=with_ref, value_settings=vs,
                                 critic_optimizer=copt)
        manager, recorded = None, {"training": config.training_settings()}
        if directory is not None:
            manager = ckpt_lib.make_manager(os.path.join(os.fspath(directory), "ckpt"),
                                            max_to_keep=config.keep_checkpoints)
            restored = ckpt_lib.restore_latest(manager, state, cfg=cfg, expect_extra=recorded)
            state = state if restored is None else restored
        if hasattr(logger, "resume"):  # lines of iterations after the checkpoint (or of an earlier run) go
            logger.resume(int(state.data_pos) // config.rl.n_tasks)

        def after(it: int, m: dict, st: TrainState) -> None:
            last = it == config.iterations - 1
            if config.eval_every >= 0 and (last or (config.eval_every and (it + 1) % config.eval_every == 0)):
                m.update(evaluate(st.params))
            if logger is not None:
                for line in iteration_warnings(m, config.rl):
                    logger.warning(it, line)
                logger.log(it, m)
            if manager is not None and (last or (it + 1) % config.checkpoint_every == 0):
                ckpt_lib.save(manager, st, cfg, step=it, force=True, extra=recorded)

        try:
            state, history = iterate(state, iterations=config.iterations, rollout_fn=rollout_fn,
                                     sample_tasks_fn=sample_tasks_fn, train_step=step, settings=config.rl,
                                     values_fn=values_fn, callback=after)
        finally:  # a run stopped by an exception (a logger, an interrupt) leaves its last checkpoint whole
            if manager is not None:
                ckpt_lib.wait_until_finished(manager)
        return TrainResult(state, history)

    return train
