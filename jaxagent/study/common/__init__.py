"""The core both studies (FrozenLake, `study.frozenlake`; the host domains, `study.host`) share:

  run_checks   the checks of a preset before its run directory is made (counts, seeds, mesh, batch split) and of
               each RL update (non-finite gradients or params)
  arms         the RL arms: their settings (`arm_settings` from a preset), the compiled train step and its
               placement (`make_arm_step`, `placed_step`), the train state, and `train_rl`
  sft          supervised fine-tuning of a base (`fit_sft`) and the budgets of its episodes
  policies     the trained policies, saved by process 0 and read back one at a time (`SavedPolicies`)
  estimates    the seed-aware estimate writer (`put_estimate`) and the seeds' health lines
  banner       the report's first line when its figures measure nothing (rehearsal, plumbing check)
"""
