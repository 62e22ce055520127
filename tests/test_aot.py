"""The AOT analysis library (`jaxagent.aot`): the HLO accounting on hand-written text (trip counts, FLOPs,
collectives), the analytic FLOPs, the verdict and the resident memory; `analyze` on a tiny jitted function; a
tiny Qwen3 train step compiled for v5p:2x2x1 on mesh (1, 2, 2) has no foreign custom calls, fits HBM and shows
the FSDP pattern (weight all-gathers, gradient reduce-scatters, no all-to-all of activations); a tiny `generate`
decodes without gathering weights per step (the rollout layout). The compiles are skipped only when libtpu
(the tpu-aot extra) is not installed.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import aot
from jaxagent.aot import hlo, programs
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.models.config import Qwen3Config
from tests.aot_common import CFG, needs_libtpu

HLO = """HloModule m

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %w = f32[16,16]{1,0} constant({...})
  %d = f32[8,16]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ag = f32[32,16]{1,0} all-gather(%d), channel_id=1, dimensions={0}
  ROOT %t = (s32[], f32[8,16]{1,0}) tuple(%i, %d)
}

%cond (p: (s32[], f32[8,16])) -> pred[] {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  %c = s32[] constant(6)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  %w = (s32[], f32[8,16]{1,0}) while(%t0), condition=%cond, body=%body
  %cc = f32[8,16]{1,0} custom-call(%a), custom_call_target="jaxagent_attention"
  ROOT %r = f32[8,16]{1,0} all-to-all(%a), channel_id=2, dimensions={0}
}
"""


def test_hlo_summary_applies_trip_counts():
    h = aot.hlo_summary(HLO)
    assert h["flops"] == 6 * 2 * 8 * 16 * 16           # the loop body's dot, 6 trips
    assert h["collectives"]["all-gather"]["count"] == 6 and h["collectives"]["all-gather"]["static_count"] == 1
    assert h["collectives"]["all-gather"]["gib"] == round(6 * 32 * 16 * 4 / 2 ** 30, 3)
    assert h["collectives"]["all-to-all"]["count"] == 1
    assert h["custom_calls"] == {"jaxagent_attention": 1}
    assert h["loops"][0]["trips"] == 6


# XLA:TPU's bidirectional windowed matmul: a u32 counter from 0 in steps of 2 below 8 (4 trips, two dots each)
WINDOWED_HLO = """HloModule w

%wbody (p: (u32[], f32[8,16])) -> (u32[], f32[8,16]) {
  %p = (u32[], f32[8,16]{1,0}) parameter(0)
  %i = u32[] get-tuple-element(%p), index=0
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %d1 = f32[8,16]{1,0} dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  %d2 = f32[8,16]{1,0} dot(%d1, %x), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  %two = u32[] constant(2)
  %next = u32[] add(%i, %two)
  ROOT %t = (u32[], f32[8,16]{1,0}) tuple(%next, %d2)
}

%wcond (q: (u32[], f32[8,16])) -> pred[] {
  %q = (u32[], f32[8,16]{1,0}) parameter(0)
  %lim = u32[] constant(8)
  %j = u32[] get-tuple-element(%q), index=0
  ROOT %lt = pred[] compare(%j, %lim), direction=LT
}

ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  %zero = u32[] constant(0)
  %t0 = (u32[], f32[8,16]{1,0}) tuple(%zero, %a)
  %w = (u32[], f32[8,16]{1,0}) while(%t0), condition=%wcond, body=%wbody
  ROOT %r = f32[8,16]{1,0} get-tuple-element(%w), index=1
}
"""


def test_trip_count_reads_step_and_unsigned_counters():
    h = aot.hlo_summary(WINDOWED_HLO)
    assert h["loops"][0]["trips"] == 4                  # ceil((8 - 0) / 2), not 8 (the bound) nor 1 (no s32)
    assert h["flops"] == 4 * 2 * (2 * 8 * 16 * 16)


def test_analytic_flops_six_n_per_token():
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    n_layers = cfg.num_params() - 64 * 32 - 32
    attn = 2 * 2 * 1 * 2 * 16 * 3 * 8 * 8  # dense: every (query, key) pair
    fwd = 2 * n_layers * 24 + attn + 2 * 32 * 64 * 24
    assert aot.analytic_flops(cfg, 3, 8, backward=False) == pytest.approx(fwd)
    assert aot.analytic_flops(cfg, 3, 8, backward=True) == pytest.approx(3 * fwd)
    assert aot.analytic_flops(cfg, 3, 8, backward=True, remat="full") == pytest.approx(
        3 * fwd + 2 * n_layers * 24 + attn)


def test_foreign_calls_are_the_programs_own():
    """A call the compiler inserted (absent from the lowered module) is XLA:TPU's; one the program brings is
    foreign unless XLA:TPU's own; a jaxagent kernel always is."""
    compiled = {"AllocateBuffer": 3, "PrepareAsyncCallStart": 1, "jaxagent_attention": 1, "lapack_sgetrf": 1}
    lowered = 'stablehlo.custom_call @lapack_sgetrf(%a)\n stablehlo.custom_call @AllocateBuffer()'
    assert aot.foreign_calls(compiled, lowered) == ["jaxagent_attention", "lapack_sgetrf"]
    assert aot.foreign_calls(compiled) == ["PrepareAsyncCallStart", "jaxagent_attention", "lapack_sgetrf"]


def test_train_step_programs_follow_the_arms_settings():
    """One program per distinct step, built by the study's own `stages.make_arm_step`: arms with equal settings
    share one; a KL arm's state carries the reference params (and its analytic count the reference's forward);
    PPO's batch has the critic's keys; each update's rows are n_tasks x group_size / minibatches."""
    import dataclasses

    import jax
    from jaxagent import sharding
    from jaxagent.rl.loop import RLSettings
    from jaxagent.study.stages import ARMS, ArmSettings
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    rl = RLSettings(estimator="grpo", n_tasks=2, group_size=4)
    arms = [ArmSettings(name="grpo", rl=rl),
            ArmSettings(name="budgetmix", rl=dataclasses.replace(ARMS["budgetmix"], n_tasks=2, group_size=4)),
            ArmSettings(name="kl", rl=dataclasses.replace(rl, minibatches=2), kl_coef=0.1, kl_estimator="k2"),
            ArmSettings(name="ppo", rl=dataclasses.replace(rl, estimator="ppo"))]
    progs = programs.train_step_programs(CFG, mesh, None, arms, seq=64, name=lambda a: "ppo" if a.name == "ppo" else "step")
    assert [p.name for p in progs] == ["step", "step", "ppo"]
    assert progs[0].note.startswith("arms grpo, budgetmix: 8 rows") and progs[1].note.startswith("arms kl: 4 rows")
    assert "reference in the state" in progs[1].note
    plain = aot.analytic_flops(CFG, 4, 64, backward=True)
    assert progs[1].analytic_flops == pytest.approx(plain + aot.analytic_flops(CFG, 4, 64, backward=False))
    assert progs[0].analytic_flops == pytest.approx(2 * plain)   # 8 rows, no reference
    text = progs[1].lower().as_text()
    assert text.count("tensor<4x64xi32>") >= 1                   # the minibatch's rows
    assert "tensor<8x64xf32>" in progs[2].lower().as_text()     # PPO: the critic's returns and old values too


@pytest.fixture(scope="module")
def tiny_train_step():
    from jaxagent import sharding
    devices = aot.topology_devices("v5p:2x2x1")
    mesh = sharding.make_mesh(1, 2, 2, devices=devices)
    from jaxagent.rl.loop import RLSettings
    from jaxagent.study.stages import ArmSettings
    arm = ArmSettings(name="grpo", rl=RLSettings(estimator="grpo", n_tasks=2, group_size=4), lr=1e-6)
    (prog,) = programs.train_step_programs(CFG, mesh, mesh, [arm], seq=256, name=lambda a: "train_step",
                                           memory=MemoryPlan(micro_batches=2, remat="full", logits_chunk=64))
    recs = []
    ok = aot.run_programs([prog], preset="tiny", topology="v5p:2x2x1", chips=4, spec=aot.chip_specs("v5p:2x2x1"),
                          hbm_limit=aot.CHIPS["v5p"]["hbm"], fraction=0.85, proxy=None, emit=recs.append)
    return ok, recs[0]


@needs_libtpu
@pytest.mark.slow
def test_tiny_train_step_compiles_for_v5p_as_fsdp(tiny_train_step):
    ok, rec = tiny_train_step
    assert rec["status"] == "ok" and ok, rec.get("error", rec)
    assert rec["foreign_custom_calls"] == []
    assert 0 < rec["memory_gib"]["total"] and rec["hbm_fraction"] < 0.85
    coll = rec["collectives"]
    # FSDP: weights gathered for use, gradients reduce-scattered back to their shards (per micro-batch)
    assert coll["all-gather"]["count"] >= 2 * 2 * CFG.num_hidden_layers
    assert coll["reduce-scatter"]["count"] >= 2 * CFG.num_hidden_layers
    # no all-to-all in the layers; the embedding lookup's (the model's gather of rows of the table and its
    # transpose) is the one tolerated until the model gathers the table instead (docs/aot.md)
    for op in coll.get("all-to-all", {"ops": []})["ops"]:
        assert "_take" in op, op
    loops = sorted(lp["trips"] for lp in rec["loops"])
    assert 2 in loops and 4 in loops          # the micro-batch scan and the logits-chunk scan (256 / 64)
    assert rec["flops_per_chip"] > rec["flops_per_chip_xla"]  # XLA counted the loop bodies once


@pytest.fixture(scope="module")
def tiny_generate():
    import jax
    import jax.numpy as jnp
    from jaxagent import sharding
    from jaxagent.models import qwen3
    devices = aot.topology_devices("v5p:2x2x1")
    mesh = sharding.make_mesh(1, 2, 2, devices=devices)
    prog = programs.generate_program(CFG, mesh, rows=8, prompt_len=16, new_tokens=8, dtype=jnp.bfloat16, stop_ids=(1,),
                                     pad_id=0, run_mesh=mesh)
    compiled = prog.lower().compile()
    rec = aot.compiled_record(compiled, chips=4, spec=aot.chip_specs("v5p:2x2x1"), hbm_limit=aot.CHIPS["v5p"]["hbm"],
                               analytic=prog.analytic_flops)
    weights = sum(2 * np.prod(x.shape) for x in jax.tree.leaves(qwen3.param_shapes(CFG))) / 2  # bf16, tensor = 2
    return rec, compiled.as_text(), weights


@needs_libtpu
@pytest.mark.slow
def test_tiny_generate_gathers_no_weights_per_decode_step(tiny_generate):
    """generate decodes with the weights per ROLLOUT_RULES (whole over fsdp): its 8-step decode loop gathers
    only the sampler's few values, not the weights (with the FSDP layout: every weight, at every step)."""
    rec, text, weights_per_chip = tiny_generate
    assert rec["foreign_custom_calls"] == [] and rec["hbm_fraction"] < 0.85
    assert any(lp["trips"] == 8 for lp in rec["loops"])  # the decode loop
    assert "all-to-all" not in rec["collectives"]
    assert aot.loop_collective_bytes(text, 8) < 0.01 * 8 * weights_per_chip


def test_topology_errors_are_clear():
    with pytest.raises(ValueError, match="unknown TPU generation"):
        aot.chip_specs("v9x:2x2")
    from jaxagent.aot.topology import topology_dims
    assert topology_dims("v5p:4x4x2") == [4, 4, 2]
    for bad in ("v5p", "v5p:4x0x4", "v5p:axb"):
        with pytest.raises(ValueError, match="is not '<generation>"):
            aot.topology_devices(bad)


def test_verdict_checks_fit_calls_all_to_all_and_flops():
    rec = {"hbm_fraction": 0.5, "foreign_custom_calls": [], "collectives": {"all-gather": {}}, "flops_ratio": 1.05}
    assert aot.program_verdict(rec, fraction=0.85, flops_checked=True) == "ok"
    assert aot.program_verdict({**rec, "hbm_fraction": 0.9}, fraction=0.85, flops_checked=True) == "over_hbm"
    assert aot.program_verdict({**rec, "foreign_custom_calls": ["jaxagent_attention"]}, fraction=0.85,
                     flops_checked=True) == "custom_calls"
    assert aot.program_verdict({**rec, "collectives": {"all-to-all": {}}}, fraction=0.85, flops_checked=True) == "all_to_all"
    assert aot.program_verdict({**rec, "flops_ratio": 1.2}, fraction=0.85, flops_checked=True) == "flops_over"
    assert aot.program_verdict({**rec, "flops_ratio": 2.6}, fraction=0.85, flops_checked=False) == "ok"  # a rollout's scale


@needs_libtpu
def test_identical_programs_compile_once():
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jaxagent import sharding
    mesh = sharding.make_mesh(1, 2, 2, devices=aot.topology_devices("v5p:2x2x1"))
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, P(("data", "fsdp"))))
    f = jax.jit(lambda a: a @ a.T)
    progs = [aot.Program(name, lambda: f.lower(x)) for name in ("first", "second")]
    recs = []
    ok = aot.run_programs(progs, preset="tiny", topology="v5p:2x2x1", chips=4, spec=aot.chip_specs("v5p:2x2x1"),
                          hbm_limit=aot.CHIPS["v5p"]["hbm"], fraction=0.85, proxy=None, emit=recs.append)
    assert ok and [r["status"] for r in recs] == ["ok", "ok"]
    assert "same_program_as" not in recs[0] and recs[1]["same_program_as"] == "first"
    assert recs[1]["memory_gib"] == recs[0]["memory_gib"]


def test_add_resident_counts_what_the_run_holds_beside_the_program():
    gib = aot.GIB
    rec = {"memory_gib": {"total": 40.0}, "hbm_fraction": 0.5}
    aot.add_resident(rec, 8 * gib, "the base params", 80 * gib)
    assert rec["memory_gib"] == {"total": 48.0, "program": 40.0, "resident": 8.0} and rec["hbm_fraction"] == 0.6
    aot.add_resident(rec, 30 * gib, "", 80 * gib)      # a recheck starts again from the program's own figure
    assert rec["memory_gib"]["total"] == 70.0 and rec["resident"] == "the base params"
    assert aot.program_verdict({**rec, "foreign_custom_calls": [], "collectives": {}, "flops_ratio": 1.0}, fraction=0.85,
                     flops_checked=True) == "over_hbm"


def test_loop_collective_bytes_counts_the_loop_bodies_only():
    """The all-gather inside the 6-trip loop: 6 executions x f32[32, 16]; nothing runs 1 time in a loop body."""
    assert aot.loop_collective_bytes(HLO, 6) == 6 * 32 * 16 * 4
    assert aot.loop_collective_bytes(HLO, 6, op="all-reduce") == 0
    assert hlo.nbytes(("bf16", (3, 5))) == 30 and hlo.array_shapes("(s32[], f32[8,16]{1,0})") == [
        ("s32", ()), ("f32", (8, 16))]


def test_recheck_reapplies_resident_and_verdict():
    """`check.recheck` adds each program's resident bytes as built now to stored records and re-judges them; a
    failed compile's record stays as it is; a record of a program not built is refused."""
    from jaxagent.aot.check import recheck
    gib = aot.GIB
    recs = [{"program": "a", "memory_gib": {"total": 40.0}, "hbm_fraction": 0.5, "foreign_custom_calls": [],
             "collectives": {}, "flops_ratio": 1.0, "status": "ok"},
            {"program": "b", "status": "compile_error", "error": "x"}]
    progs = [aot.Program("a", None, resident_bytes=30 * gib, resident_note="the base"), aot.Program("b", None)]
    assert not recheck(recs, progs, hbm_limit=80 * gib)
    assert recs[0]["memory_gib"] == {"total": 70.0, "program": 40.0, "resident": 30.0}
    assert recs[0]["status"] == "over_hbm" and recs[0]["resident"] == "the base"
    assert recs[1] == {"program": "b", "status": "compile_error", "error": "x"}
    with pytest.raises(ValueError, match="not built"):
        recheck([{"program": "c"}], progs, hbm_limit=80 * gib)


@needs_libtpu
def test_analyze_a_tiny_jitted_function():
    """`analyze`'s docstring example: a row- and column-sharded matmul over a 2 x 2 mesh of v5p chips computes
    its analytic FLOPs (2 M K N / 4 chips), all-reduces the partial products over the contraction axis once,
    holds its operands and result per chip, and no foreign custom call; a function that is not jitted is
    jitted; a 50 MiB HBM budget fails the fit."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(aot.topology_devices("v5p:2x2x1")).reshape(2, 2), ("data", "model"))
    m, k, n = 4096, 8192, 8192
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=NamedSharding(mesh, P("data", "model")))
    w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16, sharding=NamedSharding(mesh, P("model", None)))
    rec = aot.analyze(jax.jit(lambda x, w: x @ w), x, w, topology="v5p:2x2x1", analytic_flops=2 * m * k * n)
    assert rec["status"] == "ok", rec
    assert rec["chips"] == 4 and "preset" not in rec
    assert rec["flops_per_chip"] == 2 * m * k * n / 4 and rec["flops_ratio"] == 1.0
    assert rec["collectives"]["all-reduce"]["count"] == 1
    per_chip = (m * k / 4 + k * n / 2 + m * n / 2) * 2 / aot.GIB           # x, w and the bf16 result (rows over data)
    assert rec["foreign_custom_calls"] == [] and rec["memory_gib"]["argument"] + rec["memory_gib"]["output"] == \
        pytest.approx(per_chip, abs=2e-3)
    plain = aot.analyze(lambda x, w: x @ w, x, w, topology="v5p:2x2x1", hbm_gib=0.05, name="matmul")
    assert plain["program"] == "matmul" and plain["status"] == "over_hbm"
    assert plain["flops_per_chip"] == rec["flops_per_chip"] and plain["flops_ratio"] is None
