"""Multi-turn rollouts: the jitted loop for pure-JAX envs (`rollout`) and the host loop for Python envs
(`host_rollout`); `episode` holds the rules both share (settings, contexts, budget text, truncated replies,
status, `finished`); `layout` the chat layout and the text pieces of an env (`env_text`)."""
from jaxagent.rollout.episode import EpisodeConfig, episode_return, finished, reply_closed
from jaxagent.rollout.jax_loop import (RolloutConfig, RolloutFn, make_rollout_fn, oracle_process_reward, rollout,
                                       t_max_of)
from jaxagent.rollout.layout import ChatLayout, EnvText, budget_format, chat_layout, env_codec, env_text
from jaxagent.rollout.types import (BUDGET_EXHAUSTED, CONTEXT_EXHAUSTED, FAILED, RUNNING, STATUS_NAMES, SUCCESS,
                                    Rollout, Turns)
from jaxagent.rollout.host_loop import HostRollout, HostRolloutConfig, HostTrace, host_rollout

__all__ = ["rollout", "RolloutConfig", "RolloutFn", "make_rollout_fn", "t_max_of", "oracle_process_reward",
           "host_rollout", "HostRolloutConfig", "HostRollout",
           "HostTrace", "EpisodeConfig", "finished", "episode_return", "reply_closed", "env_text", "EnvText",
           "env_codec", "chat_layout", "budget_format", "ChatLayout", "Rollout", "Turns", "RUNNING", "SUCCESS",
           "FAILED", "BUDGET_EXHAUSTED", "CONTEXT_EXHAUSTED", "STATUS_NAMES"]
