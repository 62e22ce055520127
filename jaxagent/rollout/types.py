"""What a rollout returns, and the episode status codes.

Dimension legend (CONVENTIONS.md): B episodes, S context slots (token buffer = KV-cache slots), N turns
(T_max), M action tokens.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

RUNNING, SUCCESS, FAILED, BUDGET_EXHAUSTED, CONTEXT_EXHAUSTED = 0, 1, 2, 3, 4
STATUS_NAMES = ("running", "success", "failed", "budget_exhausted", "context_exhausted")


class Turns(NamedTuple):
    """Per-turn records, [B, N]; entries of turns not taken (active False) are zeros / -1."""

    active: jax.Array          # bool: the episode took this turn
    reward: jax.Array          # f32 env reward of the turn
    process_reward: jax.Array  # f32 process-reward hook (0 without a hook)
    valid: jax.Array           # bool: the action parsed and was legal
    action: jax.Array          # int32 parsed action, -1 invalid or inactive
    anchor: jax.Array          # int32 env-state id before the step (GiGPO step groups)
    span_start: jax.Array      # int32 first slot of the turn's generated tokens
    span_len: jax.Array        # int32 number of generated tokens (incl. the stop token)
    stopped: jax.Array         # bool: the reply ended on a stop token (not the token limit)
    remaining: jax.Array       # int32 turns left before this turn (budget - t)
    forced: jax.Array          # bool: the reply was a forced/scripted action, not sampled


class Rollout(NamedTuple):
    """Everything RL and the diagnostics need, as arrays (a pytree)."""

    tokens: jax.Array          # int32 [B, S] whole multi-turn context (system, observations, actions)
    policy_mask: jax.Array     # bool [B, S] tokens the policy generated: the only ones trained on
    turn_index: jax.Array      # int32 [B, S] turn of each token, -1 for the shared system prefix
    logprobs: jax.Array        # f32 [B, S] sampler log pi of policy tokens, 0 elsewhere
    length: jax.Array          # int32 [B] used context slots
    turns: Turns               # per-turn records [B, N]
    env_states: Any            # env state before each turn, leaves [B, N, ...]
    final_state: Any           # env state after the last turn, leaves [B, ...]
    episode_return: jax.Array  # f32 [B] sum of rewards; 0 if the budget or context ran out unfinished
    success: jax.Array         # bool [B]
    turns_used: jax.Array      # int32 [B]
    budget: jax.Array          # int32 [B]
    status: jax.Array          # int32 [B] one of the status codes above
    generated_tokens: jax.Array  # int32 [B] policy tokens over all turns
