"""A sequence program partitioned over a mesh of host CPU devices: the RL train step compiled with the decoding
programs' XLA options (what jaxagent runs there) and with the one-device sequence programs' options; step time and
peak memory of each (`jaxagent.bench.mesh_options`).

  python -m experiments.bench_mesh_options --json      # ci-sql's tiny Qwen3, 8 x 448 tokens, a (2, 2, 2) mesh
"""
from __future__ import annotations

import os


def main(argv=None):
    from experiments import cli
    p = cli.Parser(prog=cli.script_prog("experiments.bench_mesh_options"), description=cli.summary(__doc__),
                   formatter_class=cli.HelpFormatter)
    p.add_argument("--preset", default="ci-sql", help="host preset whose model and train-step options are used "
                                                      "(default ci-sql: the tiny random Qwen3 over Qwen3's vocabulary)")
    p.add_argument("--mesh", default="2,2,2", help="data,fsdp,tensor over that many host devices (default 2,2,2)")
    p.add_argument("--batch", type=cli.positive_int, default=8, help="rows (default 8)")
    p.add_argument("--seq", type=cli.positive_int, default=448, help="tokens per row (default 448)")
    p.add_argument("--prompt", type=int, default=64, help="leading tokens per row outside the loss (default 64)")
    p.add_argument("--micro-batches", type=cli.positive_int, default=2, help="(default 2)")
    p.add_argument("--steps", type=cli.positive_int, default=3, help="timed steps per setting (median; default 3)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON line")
    args = p.parse_args(argv)
    try:
        mesh = tuple(int(x) for x in args.mesh.split(","))
        assert len(mesh) == 3 and min(mesh) >= 1
    except (ValueError, AssertionError):
        cli.fail(f"--mesh must be three positive integers data,fsdp,tensor, got {args.mesh!r}")
    # host devices for the mesh: set before jax starts its CPU backend
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={mesh[0] * mesh[1] * mesh[2]}")
    from jaxagent.bench.harness import dump
    from jaxagent.bench.mesh_options import run_bench
    from jaxagent.study.host.presets import HOST_PRESETS
    if args.preset not in HOST_PRESETS:
        cli.fail(f"unknown preset {args.preset!r}; one of {', '.join(sorted(HOST_PRESETS))}")
    preset = HOST_PRESETS[args.preset]
    with cli.clear_errors():
        out = run_bench(preset.tiny_model, mesh, batch=args.batch, seq=args.seq, prompt=args.prompt,
                        micro_batches=args.micro_batches, steps=args.steps,
                        extra_options=dict(preset.compiler_options))
    print(dump(out, args.json))


if __name__ == "__main__":
    main()
