"""Shared argparse options and error handling of the study scripts.

Every user error ends the script with one line on stderr and exit code 2, no traceback: argparse's usage
errors (numbers are bounded: `--iterations -3` or `--seeds 2**70` are refused before any work), and, through
`clear_errors`, a run directory in use, not writable or made with other settings, a bad preset field or mesh, a
garbage DONE marker, and a checkpoint that is missing or not what it claims (all checked before the run
directory is written). A diverged RL stage ends with one line and exit code 1. `run_options=True` adds
`--seed-offset` and `--force`, which `make_run` applies.
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import sys
import threading

# Only names here: --help and usage errors answer without importing JAX or the study (the functions that run
# something import it where they need it).
from jaxagent.study import preset_names
from jaxagent.study.preset_names import BASE_SEED, MAX_ITERATIONS, MAX_SEED as MAX_PRNG_SEED

MAX_SEED = MAX_PRNG_SEED - BASE_SEED   # a seed or offset whose sum with BASE_SEED is still an int32
MAX_COUNT = MAX_ITERATIONS             # iterations, micro-batches, processes


class UserExit(SystemExit):
    """The end of a script on a user error: exit status `code`; str() is the message (already printed)."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = message

    def __str__(self):
        return self.message


def emit(text: str, out: str | None = None) -> None:
    """Prints a script's result text and, with `out` (its --out), also writes it there."""
    if out:
        with open(out, "w") as fh:
            fh.write(text)
    print(text, end="")


def fail(message: str, code: int = 2):
    """Ends the script: `error: message` as one line on stderr, exit code `code` (2: a user error)."""
    line = " ".join(str(message).split())
    print("error: " + line, file=sys.stderr)
    raise UserExit(line, code)


class Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (`prog: error: ...; --help lists the options`), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (--help lists the options)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default only when it has one worth showing (not None/False, not said in its help)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in h or action.required:
            return h
        return super()._get_help_string(action)


def int_in(lo: int, hi: int, what: str):
    """An argparse `type`: an integer in [lo, hi], else a usage error saying so."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer ({what}), got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be {what} (>= {lo}), got {v}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"must be {what} (at most {hi}), got {text}")
        return v
    parse.__name__ = what
    return parse


positive_int = int_in(1, MAX_COUNT, "a positive integer")
non_negative_int = int_in(0, MAX_COUNT, "a non-negative integer")
seed_int = int_in(0, MAX_SEED, "a non-negative integer")


class _Distinct(argparse.Action):
    """nargs='+' values that must all differ (a seed given twice would be trained once, counted twice)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if len(set(values)) != len(values):
            parser.error(f"argument {option_string}: values must be distinct, got {' '.join(map(str, values))}")
        setattr(namespace, self.dest, values)


def preset_help(host: bool) -> str:
    """--preset's help: every preset with its one-line description (`preset_names`)."""
    text = "study scale: " + preset_names.describe(preset_names.FROZENLAKE)
    if host:
        text += ("; the host-domain study (experiments.host_study; --seed-offset, --config, --set and --dump-config "
                 "work alike): " + preset_names.describe(preset_names.HOST))
    return text


def summary(doc: str) -> str:
    """A script's --help description: its docstring's first paragraph as one line (its first line alone may stop
    mid-sentence)."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def module_doc(module: str) -> str:
    """The docstring of `module`, read from its source without importing it (which would load JAX)."""
    import ast
    import importlib.util
    with open(importlib.util.find_spec(module).origin) as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def script_prog(module: str | None = None) -> str:
    """`python -m experiments.<script>` for the usage line: of `module`, or of the script being run."""
    if module is None:
        path = os.path.abspath(sys.argv[0])
        if os.path.dirname(path) != os.path.dirname(os.path.abspath(__file__)) or not path.endswith(".py"):
            return os.path.basename(sys.argv[0])
        module = "experiments." + os.path.basename(path)[:-3]
    return f"python -m {module}"


def parser(description: str, *, prog: str | None = None, run_options: bool = False,
           host_presets: bool = False) -> Parser:
    """The shared options of the script `python -m <prog>` (default: the script being run); `run_options` adds
    --seed-offset and --force (scripts that build the run with `make_run`); `host_presets` lets --preset name a
    host-domain preset too (experiments.reproduce hands those to experiments.host_study)."""
    names = sorted(preset_names.FROZENLAKE) + (sorted(preset_names.HOST) if host_presets else [])
    p = Parser(prog=script_prog(prog), description=description, formatter_class=HelpFormatter)
    p.add_argument("--preset", default="quick", choices=names, metavar="PRESET", help=preset_help(host_presets))
    add_config_options(p, "a preset as a TOML file, FrozenLake or host")
    p.add_argument("--name", default=None, help="run name: files go to <root>/<name> (default: the preset name)")
    p.add_argument("--root", default="runs", help="directory holding run directories")
    p.add_argument("--checkpoint", default=None,
                   help="local Hugging Face Qwen3 directory used as the base policy (skips the toy SFT)")
    p.add_argument("--iterations", type=positive_int, default=None,
                   help="override the preset's RL iterations per arm")
    p.add_argument("--seeds", type=seed_int, nargs="+", action=_Distinct, default=None,
                   help="override the preset's RL seeds")
    arms = sorted(preset_names.ARMS)
    p.add_argument("--arms", nargs="+", action=_Distinct, default=None, choices=arms, metavar="ARM",
                   help=f"override the preset's RL arms (of {', '.join(arms)}); a finding that compares "
                        "an arm left out is reported as not measured")
    if run_options:
        p.add_argument("--seed-offset", type=seed_int, default=0, metavar="N",
                       help="run the preset on seeds shifted by N (RL seed k -> k+N, and the base SFT seed); "
                            "files go to <root>/<preset>-s<N> unless --name is given")
        p.add_argument("--rehearsal", action="store_true",
                       help="run the preset's whole pipeline with its counts cut (one seed, one iteration, a few "
                            "episodes and held-out tasks, short turns) to check it end to end on this machine before "
                            "booking accelerators; files go to <root>/<preset>-rehearsal unless --name is given")
        p.add_argument("--force", action="store_true",
                       help="reuse a run directory made with other settings: redo every stage whose recorded "
                            "settings differ or were not recorded (older versions); default: refuse, naming them")
    p.add_argument("--mesh", type=positive_int, nargs=3, default=None, metavar=("DATA", "FSDP", "TENSOR"),
                   help="override the preset's device mesh (data, fsdp, tensor); the product must equal the "
                        "number of devices (all hosts together), 1 1 1 = the default device only")
    p.add_argument("--compute-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="override the preset's dtype of the RL forward passes (params stay float32)")
    p.add_argument("--micro-batches", type=positive_int, default=None,
                   help="override the preset's gradient-accumulation micro-batches per RL update (memory)")
    p.add_argument("--remat", default=None, choices=("none", "full", "dots", "dots_no_batch"),
                   help="override the preset's per-layer activation checkpointing policy (none: keep all)")
    add_scan_layers(p)
    add_distributed(p)
    return p


def add_scan_layers(p: argparse.ArgumentParser) -> None:
    """--scan-layers (`MemoryPlan.scan_layers`), for the run scripts and the AOT check alike."""
    p.add_argument("--scan-layers", action="store_true",
                   help="run the RL train step's layers as one lax.scan: one layer compiled instead of all, and its "
                        "memory flat in depth on a CPU host (same update to float rounding)")


def add_config_options(p: argparse.ArgumentParser, what: str) -> None:
    """--config FILE (`what`), --set KEY=VALUE and --dump-config (`jaxagent.config_file`)."""
    p.add_argument("--config", default=None, metavar="FILE",
                   help=f"{what} (instead of --preset; --dump-config writes one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the preset or --config file, e.g. --set lr=3e-5 --set task.t_max=6 "
                        "(TOML values; repeatable; none: the null of a field whose default is a number)")
    p.add_argument("--dump-config", action="store_true",
                   help="print the preset, with every override applied, as TOML (a --config file) and exit")


_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")


def coordinator_address(text: str) -> str:
    """An argparse `type`: host:port with a host name, an IPv4 address or an IPv6 address in brackets
    ([::1]:1234), and a port in 1..65535; else a usage error saying which part is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected host:port (an IPv6 address in brackets: [::1]:1234), got {text!r}")
    bracketed = host.startswith("[") and host.endswith("]")
    if ":" in host and not bracketed:
        raise argparse.ArgumentTypeError(f"expected host:port, an IPv6 address in brackets ([::1]:1234); got {text!r}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"the port must be an integer in 1..65535, got {port!r} in {text!r}")
    if bracketed:
        try:
            ipaddress.IPv6Address(host[1:-1].split("%", 1)[0])
        except ValueError:
            raise argparse.ArgumentTypeError(f"{host} is not an IPv6 address (in {text!r})") from None
    elif len(host) > 253 or not _HOSTNAME.fullmatch(host):
        raise argparse.ArgumentTypeError(f"{host!r} is not a host name or IPv4 address (in {text!r})")
    return text


coordinator_address.__name__ = "host:port"


def add_distributed(p: argparse.ArgumentParser) -> None:
    """The multi-host options, and --compile-cache (`init_distributed` applies both)."""
    p.add_argument("--compile-cache", default=None, metavar="DIR",
                   help="keep compiled programs in DIR (jax's persistent compilation cache) so that a resumed or "
                        "repeated run skips their compiles: minutes per program for a real Qwen3 on a GPU or TPU "
                        "host; a directory shared by the hosts of a pod, or one per host")
    g = p.add_argument_group("multi-host (one process per host, the same command on every host, a shared --root)")
    g.add_argument("--distributed", action="store_true",
                   help="call jax.distributed.initialize() before anything touches the devices, so the "
                        "preset's mesh spans the devices of every host; without the three options below JAX "
                        "detects the cluster itself (Cloud TPU, SLURM, Open MPI)")
    g.add_argument("--coordinator-address", type=coordinator_address, default=None,
                   help="host:port of process 0, an IPv6 address in brackets ([::1]:1234) (with --distributed)")
    g.add_argument("--num-processes", type=positive_int, default=None,
                   help="number of processes (with --distributed)")
    g.add_argument("--process-id", type=non_negative_int, default=None,
                   help="this process's index (with --distributed)")
    g.add_argument("--connect-timeout", type=int_in(1, 86_400, "seconds"), default=300,
                   help="seconds for every process of the job to connect to the coordinator; then the script ends "
                        "with one line, exit code 2 (with --distributed)")


def init_distributed(args):
    """jax.distributed.initialize() when --distributed is given; must run before any device is touched. The job's
    processes get `--connect-timeout` seconds to connect (JAX's initialization_timeout); when they do not, XLA
    aborts the process with a stack trace, so a watchdog ends it first (JAX's deadline is a second later) with one
    line. With --compile-cache, jax's persistent compilation cache is set first (compiles over 1 s are kept)."""
    given = {k: getattr(args, k, None) for k in ("coordinator_address", "num_processes", "process_id")}
    extra = [k for k, v in given.items() if v is not None]
    if extra and not getattr(args, "distributed", False):
        fail(f"--{extra[0].replace('_', '-')} needs --distributed")
    import jax
    if getattr(args, "compile_cache", None):
        jax.config.update("jax_compilation_cache_dir", os.path.abspath(args.compile_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    if not getattr(args, "distributed", False):
        return
    n, i = given["num_processes"], given["process_id"]
    if n is not None and i is not None and i >= n:
        fail(f"--process-id {i} must be below --num-processes {n}")
    timeout = int(getattr(args, "connect_timeout", 300))
    where = given["coordinator_address"] or "the coordinator JAX detects"
    who = f"process {i} of {n}" if i is not None and n is not None else "this process"

    def give_up():
        print(f"error: --distributed: {who} and the job's other processes did not all connect to {where} within "
              f"{timeout} s (--connect-timeout); check that every process runs with the same --coordinator-address "
              "and --num-processes and that process 0's host and port are reachable", file=sys.stderr, flush=True)
        os._exit(2)

    watchdog = threading.Timer(timeout, give_up)
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(**{k: v for k, v in given.items() if v is not None},
                                   initialization_timeout=timeout + 1)
    except (RuntimeError, ValueError) as e:  # e.g. a port in use or a host that does not resolve
        fail(f"--distributed: could not connect {who} to {where}: {' '.join(str(e).split())[:300]}")
    finally:
        watchdog.cancel()


def preset_from(args):
    """The preset with the command line's overrides (`presets.with_overrides`); calls `init_distributed` (call
    this before anything touches the devices)."""
    from jaxagent import config_file
    from jaxagent.study.frozenlake import presets as presets_lib
    from jaxagent.study.run_dir import RunError
    try:
        preset = args.preset
        if getattr(args, "config", None) or getattr(args, "set", None):
            source = args.config or config_file.to_dict(presets_lib.PRESETS[args.preset])
            preset = config_file.load(presets_lib.Preset, source, args.set)
        preset = presets_lib.with_overrides(
            preset, checkpoint=args.checkpoint, iterations=args.iterations, seeds=args.seeds,
            arms=getattr(args, "arms", None),
            mesh=getattr(args, "mesh", None), compute_dtype=getattr(args, "compute_dtype", None),
            micro_batches=getattr(args, "micro_batches", None), remat=getattr(args, "remat", None),
            rehearsal=getattr(args, "rehearsal", False), scan_layers=getattr(args, "scan_layers", False))
    except (RunError, ValueError) as e:
        fail(str(e))
    if getattr(args, "dump_config", False):
        emit(config_file.dumps(preset, header=f"the study preset {preset.name}: python -m experiments.reproduce "
                                              "--config FILE [--set KEY=VALUE ...]"))
        raise SystemExit(0)
    init_distributed(args)
    return preset


def make_run(args):
    """The `Run` of the command line: preset_from(args) with --seed-offset and --force applied."""
    from jaxagent.study.frozenlake.run import Run
    return Run(preset_from(args), args.root, args.name, seed_offset=getattr(args, "seed_offset", 0),
               force=getattr(args, "force", False))


def toy_base_parser(module: str, description: str) -> Parser:
    """The options of a benchmark that reads a finished toy host run's base: --preset (a preset with an SFT base,
    default bfcl-toy), --name, --root, --json; `toy_base_run` opens the run."""
    p = Parser(prog=script_prog(module), description=description, formatter_class=HelpFormatter)
    p.add_argument("--preset", default="bfcl-toy", choices=sorted(preset_names.HOST_SFT),
                   metavar="PRESET", help="a toy preset whose run has finished its base stage (default bfcl-toy)")
    p.add_argument("--name", default=None, help="run name (default: the preset's)")
    p.add_argument("--root", default="runs", help="directory holding run directories")
    p.add_argument("--json", action="store_true", help="print exactly one JSON line")
    return p


def toy_base_run(args):
    """The `HostRun` of `toy_base_parser`'s arguments; one line and exit code 2 when its base stage has not
    finished (checked before `HostRun`, which would make the run directory)."""
    from jaxagent.study import run_dir
    from jaxagent.study.host.presets import HOST_PRESETS
    from jaxagent.study.host.run import HostRun
    base = os.path.join(args.root, args.name or args.preset, "base")
    if not run_dir.done(base):
        fail(f"{base}: no finished base stage; run python -m experiments.reproduce --preset {args.preset} first")
    with clear_errors():
        return HostRun(HOST_PRESETS[args.preset], args.root, args.name)


@contextlib.contextmanager
def clear_errors():
    """A user error (`RunError`, `CheckpointError`: a run directory in use or made with other settings, a bad setting or
    checkpoint) and a program this host's memory cannot hold (`xla_options.HostMemoryError`) end the script with its
    one-line message and exit code 2; a diverged RL stage with its message
    and exit code 1; neither with a traceback."""
    from jaxagent.models.config import CheckpointError
    from jaxagent.study.common.run_checks import NonFiniteError
    from jaxagent.study.run_dir import RunError
    from jaxagent.xla_options import HostMemoryError
    try:
        yield
    except HostMemoryError as e:  # a program this host cannot hold; a train step's layers may run one at a time
        fail(str(e) + (" (a train step: --scan-layers holds one layer's work at a time)" if e.program == "step"
                       else ""), 2)
    except (RunError, CheckpointError) as e:  # the user errors
        fail(str(e), 2)
    except NonFiniteError as e:
        fail(str(e), 1)
