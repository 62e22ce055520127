"""The accelerator benchmark's JAX stages on the device JAX sees (GPU, TPU, or CPU for a smoke test), each timed
against its roofline at the datasheet's peaks and at the chip's measured ones:

  device       the kind, JAX version, datasheet figures (`devices`) and the memory pool;
  peaks        a big bf16 matmul and a big device copy (`peaks`): measured FLOP/s and bytes/s;
  decode       per model and batch: ms per step of greedy decoding over a filled cache, the HBM fraction;
  prefill      per model and context: tokens/s and MFU (`roofline.prefill_flops`);
  train_step   the study's GRPO step at the largest model that fits the chip (`train_memory`) or the one named;
  rl_iteration one RL iteration of a study preset (`accel_rl`): the time split and the rollout's share;
  check        the random checkpoint, greedy tokens and first loss the PyTorch peer then compares.

Time: each stage has its own budget and the JAX side one deadline (`accel_plan`); a measurement not started for
lack of time prints a record saying which budget was spent, an error ends only its own measurement. The peer runs
after this, in its own process (`experiments.bench_accel`), and `accel_peer` sets its figures beside ours.
On a CPU host every record says `smoke_test: true`: it checks the code paths and the arithmetic only.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from jaxagent.bench.accel_peer import check_shape, model_cfg
from jaxagent.bench.accel_plan import Plan


class Stages:
    """The time limits of one JAX side (`Plan.stage_limits`), records emitted with the common fields."""

    def __init__(self, plan: Plan, emit: Callable, deadline_s: float, t0: float):
        self.plan, self.emit, self.deadline_s, self.t0 = plan, emit, deadline_s, t0
        self.common: dict = {}
        self.stage, self.own, self.reserve, self.first = None, float("inf"), float("inf"), True

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def begin(self, stage: str) -> None:
        self.stage, self.first = stage, True
        self.own, self.reserve = self.plan.stage_limits(stage, self.now(), self.deadline_s)

    def why_not(self) -> Optional[str]:
        """Why the next measurement does not start, or None."""
        now = self.now()
        if now > self.reserve:
            return (f"the JAX stages' deadline ({self.deadline_s:.0f} s into the run, less the budgets kept for the "
                    "stages after this one) is reached")
        if now > self.own and not self.first:
            return f"the {self.stage} stage's budget ({self.plan.stage_budgets[self.stage]:g} s) is spent"
        return None

    def measure(self, bench: str, fn: Callable[[], dict], fields: dict) -> dict:
        why, self.first = self.why_not(), False
        if why is not None:
            rec = {"bench": bench, **fields, "skipped": why}
        else:
            t1 = time.perf_counter()
            try:
                rec = {"bench": bench, **fields, **fn()}
            except Exception as err:  # noqa: BLE001 -- one failing measurement (OOM, a missing file) ends itself
                rec = {"bench": bench, **fields, "error": f"{type(err).__name__}: {str(err)[:500]}"}
            rec["wall_s"] = time.perf_counter() - t1
        rec.update(self.common, elapsed_s=self.now())
        self.emit(rec)
        return rec


def run_jax(plan: Plan, emit: Callable, log: Callable, *, deadline_s: float, check_dir: Optional[str],
            rl_record: Callable, t0: Optional[float] = None) -> None:
    """The JAX stages (module docstring), each record passed to `emit`, progress lines to `log`. `deadline_s`:
    seconds after `t0` (default now) by which the last measurement starts; `check_dir`: where the check writes
    its checkpoint for the peer (None: no peer runs, no check); `rl_record(plan, log)` times the RL iteration
    (`accel_rl.rl_runner`)."""
    import jax
    import jax.numpy as jnp

    from jaxagent import sharding
    from jaxagent.bench import measure, peaks
    from jaxagent.bench.devices import custom_spec, device_spec
    st = Stages(plan, emit, deadline_s, time.perf_counter() if t0 is None else t0)
    dev = jax.devices()[0]
    spec = (custom_spec(plan.peak_tflops, plan.hbm_gbps) if plan.peak_tflops is not None
            else device_spec(dev.device_kind))
    st.common = {"device_kind": dev.device_kind, "platform": dev.platform, "devices": jax.device_count(),
                 "smoke_test": dev.platform == "cpu"}
    pool = (dev.memory_stats() or {}).get("bytes_limit")
    emit({"bench": "device", **st.common, "jax": jax.__version__, "mesh": list(plan.mesh or (1, 1, 1)),
          "memory_pool_bytes": pool, "deadline_s": deadline_s, "stage_budgets_s": plan.stage_budgets,
          **(spec.fields() if spec else {"spec_name": None}),
          "roofline_note": None if spec else f"device kind {dev.device_kind!r} is not in jaxagent.bench.devices: "
          "figures without datasheet fractions (give --peak-tflops and --hbm-gbps to add them)"})
    mesh = None if not plan.mesh or tuple(plan.mesh) == (1, 1, 1) else sharding.make_mesh(*plan.mesh)
    got = {"peaks": peaks.Peaks(None, None)}

    if "peaks" in plan.parts:
        st.begin("peaks")

        def peak_record():
            rec, got["peaks"] = peaks.measure(matmul_n=plan.peak_matmul, copy_bytes=plan.peak_copy_mib << 20,
                                              spec=spec)
            return rec
        st.measure("peaks", peak_record, {})
    figures = dict(spec=spec, peaks=got["peaks"], mesh=mesh, seed=plan.seed, repeats=plan.repeats,
                   warmup=plan.warmup)
    for part, bench in (("decode", "decode"), ("prefill", "prefill")):
        if part not in plan.parts:
            continue
        st.begin(part)
        for name in plan.models:
            cfg, holder = model_cfg(plan, name), {}

            def params(cfg=cfg, holder=holder):  # made once per model and stage, when first measured
                if "p" not in holder:
                    holder["p"] = measure.decoding_params(params_for(plan, cfg, jnp.bfloat16), cfg, jnp.bfloat16,
                                                          mesh)
                return holder["p"]
            for size in (plan.decode_batches if part == "decode" else plan.prefill_contexts):
                if part == "decode":
                    fn = (lambda b=size, cfg=cfg: measure.decode_steps(
                        params(), cfg, batch=b, context=plan.decode_context, steps=plan.decode_steps, **figures))
                else:
                    fn = (lambda c=size, cfg=cfg: measure.prefill(
                        params(), cfg, batch=max(1, plan.prefill_tokens // c), context=c, **figures))
                st.measure(bench, fn, {"id": f"{part}/{name}/{size}", "model": name})
            holder.clear()
    if "train" in plan.parts and plan.train_model:
        st.begin("train")
        st.measure("train_step", lambda: train(plan, figures, pool, log), {"id": "train", "micro_batches":
                   plan.micro_batches, "remat": plan.remat, "compute_dtype": "bfloat16"})
    if "rl" in plan.parts and plan.rl_preset:
        st.begin("rl")
        st.measure("rl_iteration", lambda: rl_record(plan, log), {"id": "rl", "rl_preset": plan.rl_preset})
    if "check" in plan.parts and plan.check_model:
        st.begin("check")
        if check_dir is None:
            emit({"bench": "check", "id": "check", "model": plan.check_model, **st.common,
                  "skipped": "the PyTorch peer does not run: nothing to compare with"})
        else:
            st.measure("check", lambda: check(plan, check_dir), {"id": "check", "model": plan.check_model})


def params_for(plan: Plan, cfg, dtype):
    """The --checkpoint's weights, or random ones of `cfg` (never both in memory)."""
    import jax

    from jaxagent.models import qwen3, weights
    if plan.checkpoint is not None:
        return weights.load(plan.checkpoint, dtype=dtype)[1]
    return qwen3.init(cfg, jax.random.key(plan.seed), dtype)


def train(plan: Plan, figures: dict, pool_bytes: Optional[int], log: Callable) -> dict:
    """The study's GRPO arm step at `plan.train_model` (auto: `train_memory.pick`). The state is built in place
    (random f32 weights made inside the state's own jit, or the checkpoint's dropped once copied into the state):
    no second f32 copy of the params stays beside it."""
    import jax

    from jaxagent.bench import measure, train_memory
    from jaxagent.rl.memory_plan import MemoryPlan
    from jaxagent.rl.train_state import init_train_state
    from jaxagent.study import stages
    name, fit = train_memory.pick(plan.train_model, pool_bytes, rows=plan.train_rows, seq=plan.train_seq,
                                  micro_batches=plan.micro_batches)
    log(f"train: {name} ({fit['why']})")
    cfg = model_cfg(plan, name)
    arm = stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], lr=1e-6)
    arm_step = stages.make_arm_step(cfg, arm, mesh=figures["mesh"], memory=MemoryPlan(
        compute_dtype="bfloat16", micro_batches=plan.micro_batches, remat=plan.remat))
    kw = dict(mesh=figures["mesh"], with_ref_params=arm_step.with_ref_params, value_settings=arm_step.value_settings,
              critic_optimizer=arm_step.critic_optimizer)
    key = jax.random.key(plan.seed)
    if plan.checkpoint is not None:
        state = init_train_state(cfg, arm_step.optimizer, key, params=params_for(plan, cfg, jax.numpy.float32), **kw)
    else:
        state = init_train_state(cfg, arm_step.optimizer, key, **kw)
    rec = measure.train_step(cfg, state, arm_step, rows=plan.train_rows, seq=plan.train_seq, prompt=plan.train_prompt,
                             **figures)
    return {"model": name, **{f"fit_{k}": v for k, v in fit.items()}, **rec}


def check(plan: Plan, check_dir: str) -> dict:
    """A random f32 checkpoint of `plan.check_model` written to `check_dir` (HF layout) for the peer, our greedy
    tokens on it (bf16 decoding) and our first train-step loss (bf16 compute)."""
    import jax
    import jax.numpy as jnp

    from jaxagent.bench import measure
    from jaxagent.bench.data import prompts
    from jaxagent.models import qwen3, weights
    from jaxagent.rl.memory_plan import MemoryPlan
    from jaxagent.rl.train_state import init_train_state
    from jaxagent.study import stages
    cfg = model_cfg(plan, plan.check_model)
    params = qwen3.init(cfg, jax.random.key(plan.seed), jnp.float32)
    weights.save(check_dir, cfg, params)
    shape = check_shape(plan)
    toks = measure.greedy_tokens(measure.decoding_params(params, cfg, jnp.bfloat16), cfg,
                                 prompts(cfg.vocab_size, shape["prompt_rows"], shape["prompt_len"], plan.seed),
                                 shape["new_tokens"])
    arm_step = stages.make_arm_step(cfg, stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], lr=1e-6),
                                    memory=MemoryPlan(compute_dtype="bfloat16", micro_batches=shape["micro_batches"]))
    state = init_train_state(cfg, arm_step.optimizer, jax.random.key(plan.seed), params=params)
    loss = measure.train_step(cfg, state, arm_step, rows=shape["rows"], seq=shape["seq"], prompt=shape["prompt"],
                              repeats=1, warmup=0, seed=plan.seed)["first_loss"]
    return {"dir": check_dir, "greedy_tokens": toks.tolist(), "first_loss": loss}
