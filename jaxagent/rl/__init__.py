"""RL: advantages, losses, critic, optimizer, the sharded train step and checkpoints.

`checkpoint` (orbax) is imported lazily: `jaxagent.rl.checkpoint` loads it on first use.
"""
from jaxagent.rl import advantages, critic, logprobs, losses, optim, train_state, train_step
from jaxagent.rl.optim import make_optimizer, make_schedule, nonfinite_count
from jaxagent.rl.train_step import (LossSettings, TrainState, ValueSettings, abstract_train_state,
                                    advance_data, init_train_state, make_ppo_train_step,
                                    make_train_step, split_rng, state_shardings, token_logprobs)


def __getattr__(name):
    if name == "checkpoint":
        import importlib
        return importlib.import_module("jaxagent.rl.checkpoint")
    raise AttributeError(f"module 'jaxagent.rl' has no attribute {name!r}")


__all__ = ["advantages", "losses", "critic", "logprobs", "optim", "train_state", "train_step", "checkpoint", "make_optimizer",
           "make_schedule", "nonfinite_count", "LossSettings", "ValueSettings", "TrainState",
           "init_train_state", "abstract_train_state", "state_shardings", "make_train_step",
           "make_ppo_train_step", "token_logprobs", "split_rng", "advance_data"]
