"""The pure-JAX world: jittable envs (the interface `Env` and its check in `base`), FrozenLake and its exact
solver, interaction budgets, the text codec and scripted experts. Everything here runs inside `jax.jit`.
A new env: docs/custom_env.md."""
from jaxagent.envs.jax.base import INFO_KEYS, Env, EnvStep, Obs, check_anchor_rule, check_env
from jaxagent.envs.jax.budgets import (BUDGET_TEMPLATE, BudgetFormat, budget_text, budget_tiers, budgetmix_candidates,
                                       full_budget, sample_budgetmix, validate_budgets)
from jaxagent.envs.jax.frozenlake import FrozenLake, FrozenLakeParams, FrozenLakeState, sample_tasks
from jaxagent.envs.jax.text_codec import TextCodec, compact, concat, make_codec, parse_action, phrase_table, render

__all__ = ["Env", "EnvStep", "Obs", "INFO_KEYS", "check_env", "check_anchor_rule", "TextCodec", "make_codec",
           "parse_action",
           "phrase_table", "render", "concat", "compact", "BUDGET_TEMPLATE", "BudgetFormat", "budget_text", "budget_tiers",
           "budgetmix_candidates", "sample_budgetmix", "full_budget", "validate_budgets", "FrozenLake",
           "FrozenLakeParams", "FrozenLakeState", "sample_tasks"]
