"""Rewrite docs/aot.md's tables from the stored AOT records (docs/aot_records/*.jsonl).

    python -m experiments.aot_report [--records docs/aot_records] [--doc docs/aot.md] [--check]

The section between the doc's aot_report markers is replaced by `jaxagent.aot.report.render(records)`;
`--check` writes nothing and exits 1 when the doc's tables differ from the records.
"""
from __future__ import annotations

import sys

from experiments import cli


def main(argv=None) -> int:
    p = cli.Parser(prog="python -m experiments.aot_report", description=__doc__.split("\n")[0])
    p.add_argument("--records", default="docs/aot_records", help="directory of <preset>[.<part>].jsonl records")
    p.add_argument("--doc", default="docs/aot.md", help="the document whose tables section is rewritten")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when the tables are out of date")
    args = p.parse_args(argv)
    from jaxagent.aot import report
    with open(args.doc) as f:
        doc = f.read()
    try:
        new = report.replace_section(doc, report.render(args.records))
    except ValueError as e:
        raise SystemExit(f"{args.doc}: {e}") from None
    if args.check:
        if new != doc:
            print(f"{args.doc}: the tables differ from {args.records}: run python -m experiments.aot_report")
            return 1
        return 0
    if new != doc:
        with open(args.doc, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
