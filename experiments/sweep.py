"""Sweep RL recipes on a toy preset: each setting x seed trained from the preset's base, then scored on
held-out maps at full budget. Prints one JSON line per (setting, seed) and a markdown table.

  python -m experiments.sweep --preset quick --grid recipe --iterations 20 --seeds 0 1 2

`--grid base` sweeps the base SFT instead (steps, learning rate): each setting trains a base from the
run's SFT key and reports its held-out Pass@1 and valid-action rate (no RL).

A seed "collapses" when its training valid-action rate drops below 0.5; the table reports the minimum
valid-action rate over all iterations, so a setting can be read for stability and for gain at once.
The grids and the sweep itself: `jaxagent.study.frozenlake.sweep`.
"""
from __future__ import annotations

import functools
import json

from experiments import cli, progress
from jaxagent.study import preset_names

say = functools.partial(print, flush=True)


def main(argv=None):
    p = cli.parser(cli.summary(__doc__), prog="experiments.sweep", run_options=True)
    p.add_argument("--grid", default="recipe", choices=preset_names.SWEEP_GRIDS)
    p.add_argument("--only", nargs="*", default=None, help="settings of the grid to run (default: all)")
    p.add_argument("--arm", default="grpo", choices=sorted(preset_names.ARMS))
    p.add_argument("--heldout-tasks", type=cli.positive_int, default=64, help="held-out maps per setting")
    p.add_argument("--heldout-samples", type=cli.positive_int, default=4, help="rollouts per held-out map")
    p.add_argument("--out", default=None, help="append JSON lines here")
    args = p.parse_args(argv)
    with cli.clear_errors():
        return sweep(args)


def record_to(out):
    """A sweep record printed as a JSON line, and appended to `out` when given."""
    def record(rec: dict) -> None:
        say(json.dumps(rec))
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(rec) + "\n")
    return record


def sweep(args) -> None:
    """The sweep of `args.grid` (main's command line)."""
    from jaxagent.study.frozenlake import sweep as sweep_lib
    run = cli.make_run(args)
    common = dict(arm=args.arm, only=args.only, heldout_tasks=args.heldout_tasks,
                  heldout_samples=args.heldout_samples, record=record_to(args.out))
    if args.grid in sweep_lib.BASE_GRIDS:
        print(sweep_lib.base_table(sweep_lib.sweep_base(run, args.grid, **common)))
        return
    rows = sweep_lib.sweep_recipe(run, args.grid, iterations=args.iterations or 20, seeds=args.seeds or [0, 1, 2],
                                  log=say, progress=progress.bars(), **common)
    print(sweep_lib.recipe_table(rows))


if __name__ == "__main__":
    main()
