"""AOT compile for a TPU topology on this CPU host (experiments/aot_check.py): a tiny Qwen3 train step on
v5p:2x2x1 with mesh (1, 2, 2) has no foreign custom calls, fits HBM and shows the FSDP pattern (weight
all-gathers, gradient reduce-scatters, no all-to-all of activations); a tiny `generate` decodes without
gathering weights per step (the rollout layout); the HLO helpers on hand-written text; a tiny host preset's
programs (experiments/aot_host.py: their arguments against a real HostPolicy's, their list, their compile).
Skipped only when libtpu (the tpu-aot extra) is not installed.
"""
import importlib.util
import os

import jax.numpy as jnp
import numpy as np
import pytest

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

from experiments import aot_check as A  # noqa: E402
from jaxagent.models.config import Qwen3Config  # noqa: E402

HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAVE_LIBTPU, reason="libtpu is not installed (pip install -e '.[tpu-aot]')")

# wide enough that every projection is sharded (D, F, H, K all divisible by 2)
CFG = Qwen3Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32)

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
    h = A.hlo_summary(HLO)
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
    h = A.hlo_summary(WINDOWED_HLO)
    assert h["loops"][0]["trips"] == 4                  # ceil((8 - 0) / 2), not 8 (the bound) nor 1 (no s32)
    assert h["flops"] == 4 * 2 * (2 * 8 * 16 * 16)


def test_analytic_flops_six_n_per_token():
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    n_layers = cfg.num_params() - 64 * 32 - 32
    attn = 2 * 2 * 1 * 2 * 16 * 3 * 8 * 8  # dense: every (query, key) pair
    fwd = 2 * n_layers * 24 + attn + 2 * 32 * 64 * 24
    assert A.analytic_flops(cfg, 3, 8, backward=False) == pytest.approx(fwd)
    assert A.analytic_flops(cfg, 3, 8, backward=True) == pytest.approx(3 * fwd)
    assert A.analytic_flops(cfg, 3, 8, backward=True, remat="full") == pytest.approx(
        3 * fwd + 2 * n_layers * 24 + attn)


def test_foreign_calls_are_the_programs_own():
    """A call the compiler inserted (absent from the lowered module) is XLA:TPU's; one the program brings is
    foreign unless XLA:TPU's own; a jaxagent kernel always is."""
    compiled = {"AllocateBuffer": 3, "PrepareAsyncCallStart": 1, "jaxagent_attention": 1, "lapack_sgetrf": 1}
    lowered = 'stablehlo.custom_call @lapack_sgetrf(%a)\n stablehlo.custom_call @AllocateBuffer()'
    assert A.foreign_calls(compiled, lowered) == ["jaxagent_attention", "lapack_sgetrf"]
    assert A.foreign_calls(compiled) == ["PrepareAsyncCallStart", "jaxagent_attention", "lapack_sgetrf"]


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
    progs = A.train_step_programs(CFG, mesh, None, arms, seq=64, name=lambda a: "ppo" if a.name == "ppo" else "step")
    assert [p.name for p in progs] == ["step", "step", "ppo"]
    assert progs[0].note.startswith("arms grpo, budgetmix: 8 rows") and progs[1].note.startswith("arms kl: 4 rows")
    assert "reference in the state" in progs[1].note
    plain = A.analytic_flops(CFG, 4, 64, backward=True)
    assert progs[1].analytic_flops == pytest.approx(plain + A.analytic_flops(CFG, 4, 64, backward=False))
    assert progs[0].analytic_flops == pytest.approx(2 * plain)   # 8 rows, no reference
    text = progs[1].lower().as_text()
    assert text.count("tensor<4x64xi32>") >= 1                   # the minibatch's rows
    assert "tensor<8x64xf32>" in progs[2].lower().as_text()     # PPO: the critic's returns and old values too


@pytest.fixture(scope="module")
def tiny_train_step():
    from jaxagent import sharding
    devices = A.topology_devices("v5p:2x2x1")
    mesh = sharding.make_mesh(1, 2, 2, devices=devices)
    from jaxagent.rl.loop import RLSettings
    from jaxagent.study.stages import ArmSettings
    arm = ArmSettings(name="grpo", rl=RLSettings(estimator="grpo", n_tasks=2, group_size=4), lr=1e-6)
    (prog,) = A.train_step_programs(CFG, mesh, mesh, [arm], seq=256, name=lambda a: "train_step", micro_batches=2,
                                    remat="full", logits_chunk=64)
    recs = []
    ok = A.run_programs([prog], preset="tiny", topology="v5p:2x2x1", chips=4, spec=A.chip_specs("v5p:2x2x1"),
                        hbm_limit=A.CHIPS["v5p"]["hbm"], fraction=0.85, proxy=None, emit=recs.append)
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


def _loop_all_gather_bytes(text: str, trips: int) -> float:
    """Bytes all-gathered per program execution by the instructions of loop bodies run `trips` times."""
    hlo = A.parse_hlo(text)
    mult = A.multipliers(hlo)
    return sum(mult[comp] * max(A._nbytes(a) for a in A._arrays(ins["type"]))
               for comp, insts in hlo["comps"].items() if mult.get(comp) == trips
               for ins in insts if ins["op"] in ("all-gather", "all-gather-start"))


@pytest.fixture(scope="module")
def tiny_generate():
    import jax
    import jax.numpy as jnp
    from jaxagent import sharding
    from jaxagent.models import qwen3
    devices = A.topology_devices("v5p:2x2x1")
    mesh = sharding.make_mesh(1, 2, 2, devices=devices)
    prog = A.generate_program(CFG, mesh, rows=8, prompt_len=16, new_tokens=8, dtype=jnp.bfloat16, stop_ids=(1,),
                              pad_id=0)
    compiled = prog.lower().compile()
    rec = A.analyse(compiled, chips=4, spec=A.chip_specs("v5p:2x2x1"), hbm_limit=A.CHIPS["v5p"]["hbm"],
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
    assert _loop_all_gather_bytes(text, 8) < 0.01 * 8 * weights_per_chip


def test_topology_errors_are_clear():
    with pytest.raises(ValueError, match="unknown TPU generation"):
        A.chip_specs("v9x:2x2")


def test_verdict_checks_fit_calls_all_to_all_and_flops():
    rec = {"hbm_fraction": 0.5, "foreign_custom_calls": [], "collectives": {"all-gather": {}}, "flops_ratio": 1.05}
    assert A.verdict(rec, fraction=0.85, flops_checked=True) == "ok"
    assert A.verdict({**rec, "hbm_fraction": 0.9}, fraction=0.85, flops_checked=True) == "over_hbm"
    assert A.verdict({**rec, "foreign_custom_calls": ["jaxagent_attention"]}, fraction=0.85,
                     flops_checked=True) == "custom_calls"
    assert A.verdict({**rec, "collectives": {"all-to-all": {}}}, fraction=0.85, flops_checked=True) == "all_to_all"
    assert A.verdict({**rec, "flops_ratio": 1.2}, fraction=0.85, flops_checked=True) == "flops_over"
    assert A.verdict({**rec, "flops_ratio": 2.6}, fraction=0.85, flops_checked=False) == "ok"  # a rollout's scale


@needs_libtpu
def test_identical_programs_compile_once():
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from jaxagent import sharding
    mesh = sharding.make_mesh(1, 2, 2, devices=A.topology_devices("v5p:2x2x1"))
    x = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, P(("data", "fsdp"))))
    f = jax.jit(lambda a: a @ a.T)
    progs = [A.Program(name, lambda: f.lower(x)) for name in ("first", "second")]
    recs = []
    ok = A.run_programs(progs, preset="tiny", topology="v5p:2x2x1", chips=4, spec=A.chip_specs("v5p:2x2x1"),
                        hbm_limit=A.CHIPS["v5p"]["hbm"], fraction=0.85, proxy=None, emit=recs.append)
    assert ok and [r["status"] for r in recs] == ["ok", "ok"]
    assert "same_program_as" not in recs[0] and recs[1]["same_program_as"] == "first"
    assert recs[1]["memory_gib"] == recs[0]["memory_gib"]


# ----------------------------------------------------------------------------- host presets (experiments/aot_host.py)
def _tiny_host_preset(eval_batch: int = 8):
    """ci-sql's settings on CFG, mesh (1, 2, 2): 2 tasks x 4 rollouts (8 rows, 2 micro-batches of 4 = 2 per
    fsdp shard), 128 context slots, 8-token replies, bf16 forward passes, full remat."""
    import dataclasses
    from experiments.host_presets import HOST_PRESETS
    base = HOST_PRESETS["ci-sql"]
    return dataclasses.replace(base, name="tiny-host", tiny_model=CFG, mesh=(1, 2, 2), n_tasks=2, group_size=4,
                               micro_batches=2, remat="full", compute_dtype="bfloat16", compiler_options=(),
                               task=dataclasses.replace(base.task, max_context=128, max_action_tokens=8),
                               eval=dataclasses.replace(base.eval, batch_size=eval_batch))


def test_host_policy_calls_match_the_aot_arguments(monkeypatch):
    """`aot_host.append_args` / `decode_args` are what a HostPolicy on a mesh hands `append_jit` / `decode_jit`
    at every call (first append of a rollout, a chunk's second piece, decode, later append): shapes, dtypes
    and shardings (8 CPU devices, mesh (2, 2, 2))."""
    import jax
    import jax.numpy as jnp
    from experiments import aot_host as AH
    from jaxagent import sharding
    from jaxagent.models import qwen3
    from jaxagent.rollout import host_policy
    from jaxagent.rollout.host_loop import HostRolloutConfig
    from jaxagent.sampling import Sampler
    from jaxagent.sampling.generate import rollout_params
    cfg = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    mesh = sharding.make_mesh(2, 2, 2)
    params = rollout_params(qwen3.init(cfg, jax.random.key(0)), cfg, mesh=mesh, compute_dtype=jnp.bfloat16)
    hcfg = HostRolloutConfig(t_max=2, max_action_tokens=4, max_context=64, sampler=Sampler())
    calls = []
    compiled = {name: getattr(host_policy, name)._cache_size for name in ("append_jit", "decode_jit")}
    for name in ("append_jit", "decode_jit"):
        real = getattr(host_policy, name)
        monkeypatch.setattr(host_policy, name, lambda *a, _real=real, _name=name, **kw: (
            calls.append((_name, a)), _real(*a, **kw))[1])
    before = {name: size() for name, size in compiled.items()}
    with jax.set_mesh(mesh):
        pol = host_policy.HostPolicy(params, cfg, hcfg, (1,), 0, 16, jax.random.key(1))
        pol.start(8)
        pol.append([[3] * 20] * 8)            # two pieces of 16
        pol.sample(np.ones(8, bool))
        pol.append([[3, 4]] * 8)
        pol.sample(np.ones(8, bool))
    assert [n for n, _ in calls] == ["append_jit"] * 2 + ["decode_jit", "append_jit", "decode_jit"]
    # one program each: the fresh cache and logits are born in the shardings the calls return (`canonical`)
    assert {name: size() - before[name] for name, size in compiled.items()} == {"append_jit": 1, "decode_jit": 1}
    for name, args in calls:
        want = (AH.append_args(cfg, mesh, rows=8, slots=64, width=16, dtype=jnp.bfloat16) if name == "append_jit"
                else AH.decode_args(cfg, mesh, rows=8, slots=64, dtype=jnp.bfloat16))
        got_l, want_l = jax.tree.leaves(args), jax.tree.leaves(want)
        assert len(got_l) == len(want_l)
        for got, exp in zip(got_l, want_l):
            assert got.shape == exp.shape and got.dtype == exp.dtype, (name, got.shape, exp.shape)
            assert got.sharding.is_equivalent_to(exp.sharding, got.ndim), (name, got.shape, got.sharding, exp.sharding)


@pytest.mark.slow
def test_host_program_names_and_batches():
    """The default programs (train step, append at the widest width, decode; an evaluation batch with the
    training's rows adds none), the named widths and the evaluation's own programs when its rows differ."""
    import dataclasses

    import jax
    from experiments import aot_host as AH
    from jaxagent import sharding
    mesh = sharding.make_mesh(1, 2, 2, devices=jax.devices()[:4])
    pre = _tiny_host_preset(eval_batch=8)
    assert AH.widest_width(pre.task) == 128                     # bucket(128 - 8)
    progs = AH.host_programs(pre, CFG, mesh)
    assert [p.name for p in progs] == ["host_train_step", "host_append", "host_decode"]
    assert all("also the evaluation rollout's (8 rows per group)" in p.note for p in progs[1:])
    named = AH.host_programs(pre, CFG, mesh, only=["host_append_w16", "host_append_w256", "host_decode_eval"])
    assert [p.name for p in named] == ["host_append_w16", "host_decode_eval"]  # 256 > the widest; eval on request
    progs = AH.host_programs(_tiny_host_preset(eval_batch=4), CFG, mesh, only=["host_decode", "host_decode_eval"])
    assert [p.name for p in progs] == ["host_decode", "host_decode_eval"] and "4 rows" in progs[1].note
    assert set(AH.PROGRAM_NAMES).isdisjoint(A.PROGRAM_NAMES)
    # BFCL: finding 4's continuations (eval.batch_size rows, one group: here the training's) and finding 5's scoring
    bfcl = dataclasses.replace(pre, task=dataclasses.replace(pre.task, domain="bfcl"))
    progs = AH.host_programs(bfcl, CFG, mesh, only=["host_append", "host_decode", "host_f5_logprobs"])
    assert [p.name for p in progs] == ["host_append", "host_decode", "host_f5_logprobs"]
    assert "also the finding 4 continuation's (8 rows per group)" in progs[1].note
    assert "4 rows x 128 tokens" in progs[2].note                # 8 episodes / 2 micro-batches, max_context
    assert progs[2].lower().out_info.shape == (4, 128)
    # what the run holds beside each program: the base params beside the train step; the base and the arm's
    # TrainState beside a rollout call; with two episode groups the other group's cache and logits too
    res = AH.resident(pre, CFG, mesh, mesh)
    params = A.per_chip_bytes(A._params_abstract(CFG, mesh))
    assert res.base == params and res.state == pytest.approx(3 * params, rel=1e-3)  # + Adam moments, counters
    one, two = (AH.host_programs(dataclasses.replace(pre, task=dataclasses.replace(pre.task, overlap_groups=g)),
                                 CFG, mesh, only=["host_train_step", "host_decode"]) for g in (1, 2))
    assert one[0].resident_bytes == params and one[1].resident_bytes == res.base + res.state
    group = A.per_chip_bytes(AH.policy_state(CFG, mesh, 4, 128, jnp.bfloat16))
    assert two[1].resident_bytes == pytest.approx(res.base + res.state + group) and "4 rows" in two[1].note


@pytest.fixture(scope="module")
def tiny_host(tmp_path_factory):
    from experiments import aot_host as AH
    from jaxagent import sharding
    mesh = sharding.make_mesh(1, 2, 2, devices=A.topology_devices("v5p:2x2x1"))
    hlo = str(tmp_path_factory.mktemp("hlo"))
    recs = []
    ok = A.run_programs(AH.host_programs(_tiny_host_preset(), CFG, mesh), preset="tiny-host", topology="v5p:2x2x1",
                        chips=4, spec=A.chip_specs("v5p:2x2x1"), hbm_limit=A.CHIPS["v5p"]["hbm"], fraction=0.85,
                        proxy=None, emit=recs.append, hlo_dir=hlo)
    return ok, recs, hlo


@needs_libtpu
@pytest.mark.slow
def test_tiny_host_programs_compile_for_v5p(tiny_host):
    """A tiny host preset's train step and rollout calls compile for v5p:2x2x1: no foreign custom call, no
    all-to-all, FLOPs as the analytic count (appends, decodes: within 10%), and the 8-step decode loop gathers
    no weights (the rollout's params per ROLLOUT_RULES)."""
    import jax
    from jaxagent.models import qwen3
    ok, recs, hlo = tiny_host
    assert ok, [(r["program"], r["status"], r.get("error")) for r in recs]
    for rec in recs:
        assert rec["status"] == "ok" and rec["foreign_custom_calls"] == [] and rec["hbm_fraction"] < 0.85
        assert "all-to-all" not in rec["collectives"], rec["program"]
        if rec["program"] != "host_train_step":
            assert 0.9 <= rec["flops_ratio"] <= 1.1, (rec["program"], rec["flops_ratio"])
    train = recs[0]
    assert train["program"] == "host_train_step" and 0.8 <= train["flops_ratio"] <= 1.1
    assert train["collectives"]["reduce-scatter"]["count"] >= 2 * CFG.num_hidden_layers  # FSDP gradients
    weights = sum(2 * np.prod(x.shape) for x in jax.tree.leaves(qwen3.param_shapes(CFG))) / 2  # bf16, tensor = 2
    assert [r["program"] for r in recs] == ["host_train_step", "host_append", "host_decode"]
    rec = recs[2]
    assert any(lp["trips"] == 8 for lp in rec["loops"])  # the decode loop
    with open(os.path.join(hlo, "tiny-host.host_decode.hlo.txt")) as f:
        assert _loop_all_gather_bytes(f.read(), 8) < 0.01 * 8 * weights


@needs_libtpu
def test_aot_check_cli_takes_host_presets():
    with pytest.raises(SystemExit, match="unknown programs"):
        A.main(["--preset", "qwen3-0.6b-1gpu-sql", "--programs", "host_nope"])


@needs_libtpu
def test_aot_check_cli_mesh_and_recheck(tmp_path):
    """--mesh overrides the preset's mesh (and must fit the topology); --recheck refuses records of another preset."""
    with pytest.raises(SystemExit, match="three positive"):
        A.main(["--preset", "qwen3-4b-8gpu", "--mesh", "0", "4", "2"])
    with pytest.raises(SystemExit, match="does not match topology"):
        A.main(["--preset", "qwen3-4b-8gpu", "--mesh", "1", "16", "1"])
    rec = tmp_path / "r.jsonl"
    rec.write_text('{"program": "train_step_grpo", "preset": "qwen3-8b-v5p"}\n')
    with pytest.raises(SystemExit, match="not of --preset qwen3-4b-8gpu"):
        A.main(["--preset", "qwen3-4b-8gpu", "--recheck", str(rec)])


def test_add_resident_counts_what_the_run_holds_beside_the_program():
    gib = A.GIB
    rec = {"memory_gib": {"total": 40.0}, "hbm_fraction": 0.5}
    A.add_resident(rec, 8 * gib, "the base params", 80 * gib)
    assert rec["memory_gib"] == {"total": 48.0, "program": 40.0, "resident": 8.0} and rec["hbm_fraction"] == 0.6
    A.add_resident(rec, 30 * gib, "", 80 * gib)      # a recheck starts again from the program's own figure
    assert rec["memory_gib"]["total"] == 70.0 and rec["resident"] == "the base params"
    assert A.verdict({**rec, "foreign_custom_calls": [], "collectives": {}, "flops_ratio": 1.0}, fraction=0.85,
                     flops_checked=True) == "over_hbm"
