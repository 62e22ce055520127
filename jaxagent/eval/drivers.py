"""The study's evaluation drivers on FrozenLake, in one namespace (each lives in the module that owns its reason
to change):

  driver_common   plain host results, settings checks, `run_rollouts` (rollouts in fixed chunks: one compile
                  per (batch_size, RolloutConfig) for every driver)
  pass_drivers    `pass_kt` (Pass@(K,T) in the announced / truncated / hidden modes), `upper_bound`
  scoring         the exact next-action distribution (`canonical_replies`, `reply_logprobs`,
                  `next_action_probs`, `q_outcomes`, `expected_quality`, `sample_outcomes`) and teacher-forced
                  log-probs (`teacher_forced_logprobs`, the `likelihood` diagnostics)
  state_drivers   both policies at the same states: `step_quality_matched`, `error_states` (with
                  `error_actions`), `first_move_optimality` (with `first_turn_contexts`)

Dimension legend: CONVENTIONS.md (each module lists the letters it uses).
"""
from jaxagent.eval.driver_common import run_rollouts  # noqa: F401
from jaxagent.eval.pass_drivers import MODES, pass_kt, upper_bound  # noqa: F401
from jaxagent.eval.scoring import (N_ACTIONS, canonical_replies, expected_quality, likelihood,  # noqa: F401
                                   next_action_probs, q_outcomes, reply_logprobs, sample_outcomes,
                                   teacher_forced_logprobs)
from jaxagent.eval.state_drivers import (error_actions, error_states, first_move_optimality,  # noqa: F401
                                         first_turn_contexts, state_contexts, step_quality_matched)

