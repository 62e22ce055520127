"""The study on a host-env domain (SQL, BFCL multi-turn, multi-turn coding; the preset names it): base checkpoint ->
RL arms x seeds -> held-out Pass@(K,T) with the structural bound -> runs/<name>/report.md. Also
`python -m experiments.reproduce --preset <host preset> [--checkpoint DIR]` (docs/host_study.md).

The stages and the run directory's layout: `jaxagent.study.host.pipeline` (this script parses the command line and
calls `pipeline.run_study`).
"""
from __future__ import annotations

import argparse
import dataclasses
import tomllib

from experiments import cli
from jaxagent.study.preset_names import HOST, HOST_ARMS, describe


def parser(prog: str = "experiments.host_study") -> argparse.ArgumentParser:
    p = cli.Parser(prog=cli.script_prog(prog), description=cli.summary(__doc__), formatter_class=cli.HelpFormatter)
    p.add_argument("--preset", default=None, choices=sorted(HOST), metavar="PRESET",
                   help="domain and scale (or --config): " + describe(HOST))
    cli.add_config_options(p, "a host preset as a TOML file")
    p.add_argument("--seed-offset", type=cli.seed_int, default=0, metavar="N",
                   help="run the preset on seeds shifted by N (RL seed k -> k+N, the base's SFT seed and the tiny "
                        "model's init seed); files go to <root>/<preset>-s<N> unless --name is given")
    p.add_argument("--name", default=None, help="run name (default: the preset's, -s<N> with --seed-offset N)")
    p.add_argument("--root", default="runs", help="directory holding run directories")
    p.add_argument("--checkpoint", default=None, help="local Hugging Face Qwen3 directory (with its tokenizer)")
    p.add_argument("--data", default=None, help="sql / code: a local Spider or InterCode-SQL directory, or "
                   "DeepCoder-style JSON / JSONL problems (default: the built-in tasks; docs/host_study.md, Data)")
    p.add_argument("--data-format", default=None, choices=("spider", "intercode", "deepcoder", "apps"),
                   help="the layout of --data (default: detected from its files; a directory holding both Spider's and "
                        "InterCode-SQL's files is refused without it)")
    p.add_argument("--grading", default=None, choices=("exact", "spider", "intercode"),
                   help="sql: how a submitted query is scored (default: exact on the built-in tasks, the data's own "
                        "benchmark's on --data; jaxagent/envs/host/sql_grading.py)")
    p.add_argument("--keep-distinct", action="store_true",
                   help="sql, --grading spider: keep DISTINCT (the official evaluation removes it by default)")
    p.add_argument("--no-schema", action="store_true",
                   help="sql: leave the schema out of the system prompt, as InterCode's prompt does (the reference "
                        "then reads it with one query: 2 turns)")
    p.add_argument("--require-reference", default=None, action=argparse.BooleanOptionalAction,
                   help="code, --data: keep only problems with a solution that passes their tests (default: only "
                        "when the preset fine-tunes on references; RL from a checkpoint keeps the others)")
    p.add_argument("--iterations", type=cli.positive_int, default=None, help="override the RL iterations per arm")
    p.add_argument("--seeds", type=cli.seed_int, nargs="+", default=None, help="override the RL seeds")
    p.add_argument("--arms", nargs="+", default=None, choices=HOST_ARMS, metavar="ARM",
                   help=f"override the preset's RL arms (of {', '.join(HOST_ARMS)}); a finding that compares an arm "
                        "left out is reported as not measured")
    p.add_argument("--rehearsal", action="store_true",
                   help="run the preset's whole pipeline with its counts cut (one seed, one iteration, a few episodes "
                        "and held-out tasks, short turns) to check it end to end on this machine before booking "
                        "accelerators; files go to <root>/<preset>-rehearsal unless --name is given")
    p.add_argument("--force", action="store_true", help="empty a run directory made with other settings")
    cli.add_scan_layers(p)
    cli.add_distributed(p)
    return p


def wants(argv, prog: str | None = None) -> bool:
    """Whether a command line (e.g. reproduce's, `prog`) names a host preset, or a --config file of one (a TOML
    file whose `task` table has a `domain`; a file that cannot be read is left to the FrozenLake study to report)."""
    pre = cli.Parser(prog=cli.script_prog(prog), add_help=False)
    pre.add_argument("--preset", default=None)
    pre.add_argument("--config", default=None)
    args, _ = pre.parse_known_args(argv)
    if args.config:
        try:
            with open(args.config, "rb") as f:
                task = tomllib.load(f).get("task")
        except (OSError, tomllib.TOMLDecodeError):
            return False
        return isinstance(task, dict) and "domain" in task
    return args.preset in HOST


def configured(args):
    """The preset of --preset or --config, with --set applied (`config_file.load`); one line and exit code 2 when
    neither is given, or for a file that cannot be read, an unknown key or a value of the wrong type."""
    from jaxagent import config_file
    from jaxagent.study.host.presets import HOST_PRESETS, HostPreset
    if not (args.preset or getattr(args, "config", None)):
        cli.fail("give --preset NAME or --config FILE (--help lists the presets)")
    if not (getattr(args, "config", None) or getattr(args, "set", None)):
        return HOST_PRESETS[args.preset]
    try:
        return config_file.load(HostPreset, args.config or config_file.to_dict(HOST_PRESETS[args.preset]), args.set)
    except ValueError as e:
        cli.fail(str(e))


def preset_from(args):
    """The named (or --config) preset with the command line's overrides and --seed-offset (`with_seed_offset`);
    exits with the reason when it cannot run; --dump-config prints it and exits 0."""
    from jaxagent import config_file
    from jaxagent.study.host.presets import preset_problem, rehearsal_preset, with_seed_offset
    from jaxagent.study.run_dir import InvalidSettings
    base = configured(args)
    changes = {k: v for k, v in (("checkpoint", args.checkpoint), ("data", args.data), ("iterations", args.iterations),
                                 ("seeds", tuple(args.seeds) if args.seeds else None),
                                 ("data_format", getattr(args, "data_format", None)),
                                 ("arms", tuple(args.arms) if getattr(args, "arms", None) else None),
                                 ("scan_layers", getattr(args, "scan_layers", False) or None)) if v is not None}
    opt = lambda name: getattr(args, name, None)  # noqa: E731  (other scripts' parsers, e.g. mistakes', lack them)
    options = tuple((k, v) for k, v in (("grading", opt("grading")), ("keep_distinct", opt("keep_distinct") or None),
                                        ("schema_in_prompt", False if opt("no_schema") else None),
                                        ("require_reference", opt("require_reference"))) if v is not None)
    if options:
        changes["env_options"] = base.env_options + options
    for name in ("seeds", "arms"):
        if len(set(changes.get(name, ()))) != len(changes.get(name, ())):
            cli.fail(f"--{name} must be distinct, got {' '.join(map(str, getattr(args, name)))}")
    try:
        p = dataclasses.replace(rehearsal_preset(base) if opt("rehearsal") else base, **changes)
        p = with_seed_offset(p, opt("seed_offset") or 0)
    except (InvalidSettings, ValueError) as e:
        cli.fail(str(e))
    if opt("dump_config"):
        cli.emit(config_file.dumps(p, header=f"the host study preset {p.name}: python -m experiments.reproduce "
                                             "--config FILE [--set KEY=VALUE ...]"))
        raise SystemExit(0)
    if preset_problem(p) is not None:
        cli.fail(preset_problem(p))
    return p


def main(argv=None, prog: str = "experiments.host_study"):
    args = parser(prog).parse_args(argv)
    if args.dump_config:
        preset_from(args)  # prints the preset and exits, before anything touches the devices
    cli.init_distributed(args)  # before anything touches the devices
    from experiments import progress
    from jaxagent.study import run_dir
    from jaxagent.study.host import pipeline
    with cli.clear_errors():
        preset = preset_from(args)
        clock = progress.Pipeline(progress.host_stages(preset))  # the ETA over base, RL and eval
        path, verdicts, timing = pipeline.run_study(preset, args.root, args.name, force=args.force, log=print,
                                                    progress_for=clock.bars)
    if not run_dir.is_main_process():
        return
    print(f"report: {path}")
    print("verdicts: " + ", ".join(f"{k}={v}" for k, v in verdicts.items()))
    print("wall time (s): " + ", ".join(f"{k}={v:.0f}" for k, v in timing.items()))


if __name__ == "__main__":
    main()
