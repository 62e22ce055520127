"""The FrozenLake (toy) study as a library: presets (`presets`), the run directory and its checks (`run`), the
training stages (`train`), the eval stage (`evaluate`: `measure` caches each policy's measurements, the
`*_rows` modules write the findings through an `context.EvalContext`, `estimates` the seed-aware estimates),
the figures and report (`figures`, `report`), recipe sweeps (`sweep`) and the seed-set comparison
(`seed_sets`). The command lines are experiments/reproduce.py, base.py, rl.py, eval.py, sweep.py and
compare_seed_sets.py."""
