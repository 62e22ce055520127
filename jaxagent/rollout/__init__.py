"""Multi-turn rollouts: the jitted loop for pure-JAX envs and the host loop for Python envs; `episode`
holds the rules both share (settings, contexts, budget text, status, `finished`)."""
from jaxagent.rollout.episode import EpisodeConfig, finished
from jaxagent.rollout.jax_loop import RolloutConfig, oracle_process_reward, rollout
from jaxagent.rollout.layout import ChatLayout, budget_format, chat_layout, env_codec
from jaxagent.rollout.types import (BUDGET_EXHAUSTED, CONTEXT_EXHAUSTED, FAILED, RUNNING, STATUS_NAMES, SUCCESS,
                                    Rollout, Turns)
from jaxagent.rollout.host_loop import HostRollout, HostRolloutConfig, HostTrace, host_rollout
