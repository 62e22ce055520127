"""The host-domain study (SQL, BFCL multi-turn, multi-turn coding) as library stages over a run directory.

  presets         `HostPreset` and `HOST_PRESETS`: one per domain and scale
  domains         the study's domains (env, splits, the structural bound's turns); `uses_env`
  stages          the host world, the RL arms' runtime and training on host envs, Pass episodes
  sft             the toy presets' base: SFT on reference solutions, the noisy expert (`train_sft_base`)
  experts         the noisy experts the toy bases imitate, per env: slips, checking first, mistake kinds
  run             `HostRun` (the run directory), stage 'base' (`run_base`), stage 'rl' (`run_arms`, resumable)
  evaluate        stage 'eval': Pass@(K,T) per policy, the bound, the findings' per-seed records (cached in eval/)
  metrics         Pass@(K,T), the structural bound, the seed-aware estimates of findings 1, 2, 7 (3-6: below)
  step_quality    finding 3 (coding): step quality on matched states; `error_recovery`: finding 4 (BFCL)
  likelihood      finding 5 (BFCL): likelihood of RL's and base's trajectories; `dynamics`: finding 6 (coding)
  report          the Markdown report's text
  pipeline        stage 'report' (`write_report`) and the whole study in order (`run_study`)
  mistakes        what RL changed in a toy run's held-out submissions (`mistake_table`; experiments.mistakes)
The design, every finding's measurement and the run directory's files: docs/host_study.md.
"""
