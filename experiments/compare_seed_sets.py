"""Verdicts of one preset run on several seed sets, side by side: a verdict should not depend on the seed set.
One markdown row per finding, a column per run directory, and whether the verdicts agree
(`jaxagent.study.frozenlake.seed_sets`).

  python -m experiments.compare_seed_sets runs/standard runs/standard-s5 --out runs/standard-seed-sets.md
"""
from __future__ import annotations


from experiments import cli


def main(argv=None):
    p = cli.Parser(prog="python -m experiments.compare_seed_sets", description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", help="run directories of the same preset (e.g. runs/standard runs/standard-s5)")
    p.add_argument("--out", default=None, help="also write the table here")
    args = p.parse_args(argv)
    from jaxagent.study.frozenlake import seed_sets
    text = seed_sets.table(args.run_dirs)
    cli.emit(text, args.out)


if __name__ == "__main__":
    main()
