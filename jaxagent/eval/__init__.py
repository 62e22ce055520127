"""Evaluation: Pass@(K,T) and its structural bound, costs, step quality, error states, likelihood, training
dynamics, seed-aware statistics, and the FrozenLake drivers that run a policy for each.

Pass@ arrays share one axis order, tier then k then task then sample (`passk`'s module docstring):
successes [U, P, Z], per-task Pass@ [U, J, P], grids [U, J], p* [U, P].

    grid_UxJ = pass_at_k_grid(success_UxPxZ, ks_J).mean(-1)     # your own success matrix

`plots` and `report` (matplotlib) are imported on first use.
"""
from jaxagent.eval import bounds, costs, dynamics, likelihood, passk, stats, step_quality
from jaxagent.eval.bounds import pass_at_k_bound, pass_at_k_bound_per_task, success_prob_from_min_turns
from jaxagent.eval.costs import cost_curves, cost_summary, status_histogram, turns_to_success
from jaxagent.eval.driver_common import run_rollouts
from jaxagent.eval.dynamics import r_multi
from jaxagent.eval.likelihood import action_nll, cumulative_llr, length_matched_pairs, matched_difference
from jaxagent.eval.pass_drivers import pass_kt, pass_kt_of, upper_bound
from jaxagent.eval.passk import (CI, bootstrap_ci, pass_at_k, pass_at_k_curve, pass_at_k_grid, pass_at_k_per_task,
                                 pass_at_t_curve, truncated_success)
from jaxagent.eval.state_drivers import error_states, first_move_optimality, step_quality_matched
from jaxagent.eval.stats import Estimate, seed_estimate, t_interval


def __getattr__(name):
    if name in ("plots", "report"):
        import importlib
        return importlib.import_module(f"jaxagent.eval.{name}")
    raise AttributeError(f"module 'jaxagent.eval' has no attribute {name!r}")


__all__ = ["passk", "bounds", "costs", "dynamics", "likelihood", "stats", "step_quality", "plots", "report",
           # Pass@(K,T)
           "pass_at_k", "pass_at_k_per_task", "pass_at_k_grid", "pass_at_k_curve", "pass_at_t_curve",
           "truncated_success", "bootstrap_ci", "CI", "success_prob_from_min_turns", "pass_at_k_bound",
           "pass_at_k_bound_per_task",
           # other metrics
           "turns_to_success", "cost_summary", "cost_curves", "status_histogram", "r_multi", "action_nll",
           "cumulative_llr", "length_matched_pairs", "matched_difference", "Estimate", "t_interval", "seed_estimate",
           # drivers: any env (pass_kt_of), FrozenLake (the others)
           "pass_kt_of", "pass_kt", "upper_bound", "step_quality_matched", "error_states", "first_move_optimality",
           "run_rollouts"]
