"""The host-domain presets' programs (`jaxagent.aot.host`): their arguments against a real HostPolicy's calls on
a CPU mesh, their list (batches folded when equal, named widths, finding 5's scoring, what the run holds
beside each), and a tiny host preset's compile for v5p:2x2x1 (skipped only when libtpu is not installed).
"""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.study.host.run import host_arm_settings
from jaxagent import aot
from jaxagent.aot import arms
from jaxagent.aot import host as AH
from jaxagent.aot import programs
from jaxagent.models.config import Qwen3Config
from tests.aot_common import CFG, needs_libtpu


def _arms(preset) -> list:
    """The preset's arms as the host study makes them (`HostRun.arm_settings`)."""
    return [host_arm_settings(preset, a) for a in preset.arms]


def _tiny_host_preset(eval_batch: int = 8):
    """ci-sql's settings on CFG, mesh (1, 2, 2): 2 tasks x 4 rollouts (8 rows, 2 micro-batches of 4 = 2 per
    fsdp shard), 128 context slots, 8-token replies, bf16 forward passes, full remat."""
    from jaxagent.study.host.presets import HOST_PRESETS
    base = HOST_PRESETS["ci-sql"]
    return dataclasses.replace(base, name="tiny-host", tiny_model=CFG, mesh=(1, 2, 2), n_tasks=2, group_size=4,
                               micro_batches=2, remat="full", compute_dtype="bfloat16", compiler_options=(),
                               policy_positions=False,  # packed positions need one batch shard (`HostRun`)
                               task=dataclasses.replace(base.task, max_context=128, max_action_tokens=8),
                               eval=dataclasses.replace(base.eval, batch_size=eval_batch))


def test_host_policy_calls_match_the_aot_arguments(monkeypatch):
    """`aot_host.append_args` / `decode_args` are what a HostPolicy on a mesh hands `append_jit` / `decode_jit`
    at every call (first append of a rollout, a chunk's second piece, decode, later append): shapes, dtypes
    and shardings (8 CPU devices, mesh (2, 2, 2))."""
    import jax
    import jax.numpy as jnp
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

    import jax
    from jaxagent import sharding
    mesh = sharding.make_mesh(1, 2, 2, devices=jax.devices()[:4])
    pre = _tiny_host_preset(eval_batch=8)
    assert AH.widest_width(pre.task) == 128                     # bucket(128 - 8)
    progs = AH.host_programs(pre, CFG, mesh, _arms(pre))
    assert [p.name for p in progs] == ["init_params", "train_state_init", "params_finite", "params_cast",
                                       "host_train_step", "host_append", "host_decode"]
    assert all("also the evaluation rollout's (8 rows per group)" in p.note for p in progs[5:])
    # the narrower appends are the widest's family (the coverage test's), each the program at that width
    assert [c.args[2].shape for c in progs[5].calls] == [(8, 128), (8, 16), (8, 32), (8, 64)]
    assert progs[6].calls[0].kwargs.get("compact_rows") is None  # on a mesh the decode does not compact
    assert [p.resident_bytes > 0 for p in progs[:3]] == [False, False, True]  # made from the base / beside it
    # the rollouts' bf16 copy of the base's and a policy's f32 params (`rollout_params`): one call each
    cast = progs[3]
    assert [c.kwargs["dtype"] for c in cast.calls] == [jnp.dtype(jnp.bfloat16)] * 2
    assert {x.dtype for c in cast.calls for x in jax.tree.leaves(c.args)} == {jnp.dtype(jnp.float32)}
    named = AH.host_programs(pre, CFG, mesh, _arms(pre), only=["host_append_w16", "host_append_w256", "host_decode_eval"])
    assert [p.name for p in named] == ["host_append_w16", "host_decode_eval"]  # 256 > the widest; eval on request
    pre4 = _tiny_host_preset(eval_batch=4)
    progs = AH.host_programs(pre4, CFG, mesh, _arms(pre4), only=["host_decode", "host_decode_eval"])
    assert [p.name for p in progs] == ["host_decode", "host_decode_eval"] and "4 rows" in progs[1].note
    assert set(AH.PROGRAM_NAMES) & set(programs.PROGRAM_NAMES) == set(arms.SHARED)  # the arms' own programs
    # BFCL: finding 4's continuations (eval.batch_size rows, one group: here the training's) and finding 5's scoring
    bfcl = dataclasses.replace(pre, task=dataclasses.replace(pre.task, domain="bfcl"))
    progs = AH.host_programs(bfcl, CFG, mesh, _arms(bfcl), only=["host_append", "host_decode", "host_f5_logprobs"])
    assert [p.name for p in progs] == ["host_append", "host_decode", "host_f5_logprobs"]
    assert "also the finding 4 continuation's (8 rows per group)" in progs[1].note
    assert "4 rows x 128 tokens, 64 policy positions" in progs[2].note  # 8 episodes / 2 micro-batches, max_context
    assert progs[2].lower().out_info.shape == (4, 64)           # policy_logprobs at the policy positions
    assert {c.args[1].shape for c in progs[2].calls} == {(4, 128)}  # 128 slots: one width (multiples of 256)
    # what the run holds beside each program: the base params beside the train step; the base and the arm's
    # TrainState beside a rollout call; with two episode groups the other group's cache and logits too
    res = AH.resident(pre, CFG, mesh, mesh, _arms(pre))
    params = aot.per_chip_bytes(programs.params_abstract(CFG, mesh))
    assert res.base == params and res.state == pytest.approx(3 * params, rel=1e-3)  # + Adam moments, counters
    one, two = (AH.host_programs(dataclasses.replace(pre, task=dataclasses.replace(pre.task, overlap_groups=g)),
                                 CFG, mesh, _arms(pre), only=["host_train_step", "host_decode"]) for g in (1, 2))
    assert one[0].resident_bytes == params and one[1].resident_bytes == res.base + res.state
    group = aot.per_chip_bytes(AH.policy_state(CFG, mesh, 4, 128, jnp.bfloat16))
    assert two[1].resident_bytes == pytest.approx(res.base + res.state + group) and "4 rows" in two[1].note


@needs_libtpu
def test_a_compacted_decode_counts_each_level_as_the_flop_counter_does():
    """On one device the decode compacts (8 rows, then 2): the HLO counter applies each level's loop at its trip
    count (max_steps), and the analytic figure counts the same, so the program is judged 'ok', not 'flops_over'."""
    from jaxagent import sharding
    mesh = sharding.make_mesh(1, 1, 1, devices=aot.topology_devices("v5p:1x1x1"))
    pre = dataclasses.replace(_tiny_host_preset(), mesh=(1, 1, 1), micro_batches=1)
    (prog,) = AH.host_programs(pre, CFG, mesh, _arms(pre), only=["host_decode"])
    assert prog.calls[0].kwargs["compact_rows"] == (2,) and "compacted to (2,) rows" in prog.note
    recs = []
    aot.run_programs([prog], preset="tiny-host", topology="v5p:1x1x1", chips=1, spec=aot.chip_specs("v5p:1x1x1"),
                     hbm_limit=aot.CHIPS["v5p"]["hbm"], emit=recs.append)
    assert recs[0]["status"] == "ok" and 0.9 <= recs[0]["flops_ratio"] <= 1.1, recs[0]["flops_ratio"]
    one_level = 8 * AH.cached_forward_flops(CFG, 8, 1, 128)  # the figure before: 8 rows x 8 steps only
    assert recs[0]["flops_per_chip"] / one_level > 1.2        # the 2-row loop's steps on top


@pytest.fixture(scope="module")
def tiny_host():
    from jaxagent import sharding
    mesh = sharding.make_mesh(1, 2, 2, devices=aot.topology_devices("v5p:2x2x1"))
    hlo, recs = {}, []
    pre = _tiny_host_preset()
    progs = AH.host_programs(pre, CFG, mesh, _arms(pre), only=["host_train_step", "host_append", "host_decode"])
    ok = aot.run_programs(progs, preset="tiny-host", topology="v5p:2x2x1",
                          chips=4, spec=aot.chip_specs("v5p:2x2x1"), hbm_limit=aot.CHIPS["v5p"]["hbm"],
                          emit=recs.append, on_compiled=lambda name, text: hlo.__setitem__(name, text))
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
    assert set(hlo) == {"host_train_step", "host_append", "host_decode"}   # each compiled program's HLO text
    assert aot.loop_collective_bytes(hlo["host_decode"], 8) < 0.01 * 8 * weights
