"""RL: advantages (one group / one trajectory, then vmapped), losses, GRPO's loss in one call (`grpo_loss`),
the critic, the optimizer, the sharded train step, one RL iteration (`rl_iteration`) and its loop (`iterate`),
loggers and checkpoints. A whole training run on any env (evaluation, checkpoints, logs): `jaxagent.trainer`.

String options take enum members that are static under `jax.jit` (`AggMode`, `KLEstimator`,
`GroupEstimator`, `NormMode`) or their strings. `checkpoint` (orbax) is imported lazily: `jaxagent.rl.checkpoint`
loads it on first use.
"""
from jaxagent.rl import (advantages, critic, grpo, loggers, logits_plan, logprobs, loop, losses, memory_plan, optim,
                         train_loss, train_state, train_step)
from jaxagent.rl.advantages import (GroupEstimator, NormMode, batch_broadcast_to_tokens, batch_gae,
                                    batch_gigpo_advantages, batch_group_advantages, broadcast_to_tokens,
                                    dr_grpo_advantages, gae, gigpo_advantages, grpo_advantages, process_advantages,
                                    rloo_advantages)
from jaxagent.rl.grpo import grpo_loss
from jaxagent.rl.logprobs import token_logprobs
from jaxagent.rl.loop import RLSettings, compute_advantages, iterate, iteration_warnings, rl_iteration
from jaxagent.rl.losses import (AggMode, KLEstimator, aggregate, entropy_from_logits, exact_kl, kl_penalty,
                                policy_loss, ppo_clip_objective, value_loss)
from jaxagent.rl.optim import make_optimizer, make_schedule, nonfinite_count
from jaxagent.rl.train_state import (LossSettings, TrainState, ValueSettings, abstract_train_state, advance_data,
                                     init_train_state, split_rng, state_shardings)
from jaxagent.rl.logits_plan import LogitsPlan
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.rl.train_loss import make_policy_loss, with_value_loss
from jaxagent.rl.train_step import build_train_step, make_ppo_train_step, make_train_step


def __getattr__(name):
    if name == "checkpoint":
        import importlib
        return importlib.import_module("jaxagent.rl.checkpoint")
    raise AttributeError(f"module 'jaxagent.rl' has no attribute {name!r}")


__all__ = ["advantages", "losses", "grpo", "critic", "loggers", "logprobs", "loop", "optim", "train_state",
           "train_step", "checkpoint", "logits_plan", "memory_plan", "train_loss",
           # advantages
           "grpo_advantages", "dr_grpo_advantages", "rloo_advantages", "batch_group_advantages", "gae", "batch_gae",
           "gigpo_advantages", "batch_gigpo_advantages", "process_advantages", "broadcast_to_tokens",
           "batch_broadcast_to_tokens", "GroupEstimator", "NormMode",
           # losses
           "grpo_loss", "policy_loss", "value_loss", "aggregate", "ppo_clip_objective", "kl_penalty", "exact_kl",
           "entropy_from_logits", "AggMode", "KLEstimator", "token_logprobs",
           # training
           "make_optimizer", "make_schedule", "nonfinite_count", "LossSettings", "ValueSettings", "TrainState",
           "init_train_state", "abstract_train_state", "state_shardings", "make_train_step", "make_ppo_train_step",
           "build_train_step", "make_policy_loss", "with_value_loss", "LogitsPlan", "MemoryPlan",
           "split_rng", "advance_data", "RLSettings", "rl_iteration", "iterate", "iteration_warnings",
           "compute_advantages"]
