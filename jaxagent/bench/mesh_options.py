"""A sequence program partitioned over a mesh of host CPU devices under both XLA option sets: the RL train step of a
host preset's model, compiled with the decoding programs' options (`xla_options.DECODING_CPU_OPTIONS`, YNNPACK off:
what jaxagent compiles a sequence program on several CPU devices with, `xla_options.options`) and with the
one-device sequence programs' (`SEQUENCE_CPU_OPTIONS`: XLA's defaults); the command line is
`python -m experiments.bench_mesh_options`.

The step: `rl.train_step.build_train_step` on `mesh` (data, fsdp, tensor) with GRPO's loss settings, `micro_batches`
and the preset's own train-step options on top of each set, on B x T random tokens whose policy tokens follow the
first `prompt` of each row (every position unembedded: the mesh has batch shards), from the same initial state. Per
setting: `first_s` (the compile and the first step), `step_s` (the median of `steps` further steps, each from the
initial state: `bench.timing.timed`), `loss` (of that first step: the two settings agree to float rounding) and
`peak_rss_mb`, the largest resident set of this process sampled every 10 ms over the setting's calls, its compile
included (`rss_before_mb` beside it). `slowdown` = the sequence options' step time / the decoding options';
`peak_ratio` the same for the peaks."""
from __future__ import annotations

import threading

import jax
import numpy as np
import optax

from jaxagent import sharding, xla_options
from jaxagent.bench.timing import timed
from jaxagent.rl.train_state import LossSettings, init_train_state
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.rl.train_step import build_train_step

SETTINGS = ("decode_options", "sequence_options")


def resident_mb() -> float:
    """This process's resident set (Linux /proc/self/statm), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


class PeakSampler:
    """The largest `resident_mb` seen every `interval_s` while the `with` block runs."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s, self.peak, self._stop = interval_s, 0.0, threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, resident_mb())
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self.peak = resident_mb()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_mb())


def run_bench(cfg, mesh_shape: tuple, *, batch: int, seq: int, prompt: int, micro_batches: int, steps: int,
              extra_options: dict | None = None, seed: int = 0) -> dict:
    """The module doc's measurement; needs prod(mesh_shape) devices (`--xla_force_host_platform_device_count`)."""
    mesh = sharding.make_mesh(*mesh_shape, devices=jax.devices()[:int(np.prod(mesh_shape))])
    tx = optax.adam(1e-3)
    jaxagent_step = build_train_step(cfg, tx, LossSettings(),
                                     MemoryPlan(micro_batches=micro_batches, compiler_options=extra_options), mesh)
    rng = np.random.default_rng(seed)
    mask = np.broadcast_to(np.arange(seq)[None] >= prompt, (batch, seq))
    host = {"tokens": rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32),
            "policy_mask": np.ascontiguousarray(mask), "old_logprobs": np.zeros((batch, seq), np.float32),
            "advantages": rng.normal(size=(batch, seq)).astype(np.float32)}
    rows = sharding.row_sharding(mesh)
    data = {k: jax.device_put(v, rows) for k, v in host.items()}
    out = {"bench": "mesh_options", "mesh": list(mesh_shape), "devices": int(mesh.size), "batch": batch, "seq": seq,
           "prompt": prompt, "micro_batches": micro_batches, "vocab": cfg.vocab_size, "steps": steps,
           "extra_options": dict(extra_options or {}), "backend": jax.devices()[0].platform}
    for name in SETTINGS:
        base = xla_options.SEQUENCE_CPU_OPTIONS if name == "sequence_options" else xla_options.DECODING_CPU_OPTIONS
        options = {**base, **(extra_options or {})}
        # the same step function and shardings as jaxagent's, compiled with this setting's options
        step = jax.jit(jaxagent_step.__wrapped__, donate_argnums=(0,), compiler_options=options)
        out[f"{name}_rss_before_mb"] = resident_mb()
        with PeakSampler() as peak:  # every call from the same initial state (the step donates it)
            timing, (_, m) = timed(lambda state: step(state, data), repeats=steps, warmup=1,
                                   setup=lambda: init_train_state(cfg, tx, jax.random.key(seed), mesh=mesh))
        out.update({f"{name}_first_s": timing.warmup_s[0], f"{name}_step_s": timing.median_s,
                    f"{name}_loss": float(m["loss"]), f"{name}_peak_rss_mb": peak.peak})
        del step
    out["slowdown"] = out["sequence_options_step_s"] / out["decode_options_step_s"]
    out["peak_ratio"] = out["sequence_options_peak_rss_mb"] / out["decode_options_peak_rss_mb"]
    return out
