"""The optimized per-chip HLO text of a compiled program (`compiled.as_text()`), read with loop trip counts.

XLA's own `cost_analysis()` counts every while-loop body once (XLA:GPU's gives none at all); the figures here
multiply each computation by how often it runs (`multipliers`: while bodies by their trip counts, nested loops
multiplied): matmul FLOPs (dots, the convolutions XLA:TPU writes them as, and XLA:GPU's cuBLAS and cuDNN
attention calls: `custom_call_flops`), collectives by kind with the bytes they move, custom-call targets, the
loops, the largest values and the largest dense attention scores (`hlo_summary`).
"""
from __future__ import annotations

import json
import re
from typing import Optional

import numpy as np

from jaxagent.aot.topology import GIB

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
FUSED_ATTENTION = "__cudnn$fmha"  # the prefix of cuDNN's fused attention calls (forward; "...Backward")
# A batched matmul's output with both trailing dims at least this large: attention scores over >= 1024 queries (per KV
# head) and keys, written to memory (the dense attention; the fused kernel keeps them on chip).
SCORES_MIN = 1024
HEAD_DIM_MAX = 256  # the largest contraction `dense_scores` takes for a head dim


_SHAPE = re.compile(r"\b(pred|s4|s8|s16|s32|s64|u4|u8|u16|u32|u64|f8e4m3fn|f8e5m2|bf16|f16|f32|f64|c64)"
                    r"\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
          "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8}
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\)\s+->\s+.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s+=\s+(.+?)\s+([\w\-]+)\((.*)$")


def array_shapes(type_text: str):
    """[(dtype, dims)] of every array in an HLO type (a tuple gives several)."""
    return [(m.group(1), tuple(int(d) for d in m.group(2).split(",") if d)) for m in _SHAPE.finditer(type_text)]


def nbytes(arr) -> float:
    """Bytes of one (dtype, dims) array of `array_shapes`."""
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


def trip_count(cond: list, body: Optional[list] = None, init: Optional[list] = None) -> int:
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


def while_trips(comps: dict, comp: str, ins: dict) -> int:
    """The trip count of the while instruction `ins` of computation `comp`: the one XLA proved and wrote in its
    backend config (`known_trip_count`, XLA:GPU, whose conditions compare inside a fusion), else `trip_count` of
    its condition, its body and the instructions of `comp` up to its operand tuple (where the counter's start is)."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', ins["rest"])
    if known:
        return int(known.group(1))
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
    cond_insts = comps.get(cond.group(1), []) if cond else []
    # XLA:GPU fuses a condition's compare (and its limit) into a fusion: its constants count for the fallback
    fused = [x for c in cond_insts if c["op"] == "fusion"
             for m in [re.search(r"calls=%?([\w.\-]+)", c["rest"])] if m for x in comps.get(m.group(1), [])
             if x["op"] == "constant"]
    return trip_count(cond_insts + fused, comps.get(body.group(1)) if body else None, init)


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
                n = while_trips(comps, name, ins) if cond else 1
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


def dot_flops(ins, shapes) -> float:
    """2 x output elements x contracted size of a dot / convolution (operand shapes from `shapes`)."""
    out = array_shapes(ins["type"])
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


def _backend_config(ins) -> dict:
    m = re.search(r"backend_config=(\{.*\})\s*$", ins["rest"])
    try:
        return json.loads(m.group(1)) if m else {}
    except ValueError:
        return {}


def custom_call_flops(ins, shapes) -> float:
    """FLOPs of an XLA:GPU library call: a cuBLAS GEMM (`__cublas$gemm`, `__cublas$lt$matmul`: 2 x output elements
    x contracted size, from its dot dimension numbers) or a cuDNN fused attention (`__cudnn$fmha*`: from its score
    shape [B, H, T, S] and head dim E, 4 B H T S E forward (q k^T and p v), 8 B H T S E backward (dq, dk, dv, dp);
    every score counted, the causally masked ones too, as `analytic` counts dense attention; the backward's
    recomputed q k^T is left out, as the analytic count leaves out recomputation inside a kernel). 0 otherwise."""
    m = re.search(r'custom_call_target="([^"]+)"', ins["rest"])
    target = m.group(1) if m else ""
    ops = re.findall(r"%([\w.\-]+)", ins["rest"].split(")")[0])
    cfg = _backend_config(ins) if target.startswith(("__cublas", FUSED_ATTENTION)) else {}
    if target.startswith("__cublas"):
        dims = cfg.get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
        out = array_shapes(ins["type"])
        if not out or not ops or ops[0] not in shapes:
            return 0.0
        k = float(np.prod([shapes[ops[0]][int(d)] for d in dims.get("lhs_contracting_dimensions", [])]))
        return 2.0 * float(np.prod(out[0][1])) * k
    if target.startswith(FUSED_ATTENTION):
        scores = [int(d) for d in cfg.get("cudnn_fmha_backend_config", {}).get("intermediate_tensor_shape", {})
                  .get("dimensions", [])]
        out = array_shapes(ins["type"])  # the first output: the attention output (forward) or dq (backward)
        if len(scores) != 4 or not out or not out[0][1]:
            return 0.0
        return (8.0 if "Backward" in target else 4.0) * float(np.prod(scores)) * out[0][1][-1]
    return 0.0


def dense_scores(ins, shapes, dtypes) -> Optional[tuple]:
    """(dtype, dims, operand dtype) of a batched matmul (a dot, or a cuBLAS GEMM, with batch dims) that contracts at
    most `HEAD_DIM_MAX` (a head dim: q k^T, or dO v^T in the backward) into a float output whose two trailing dims
    are both >= `SCORES_MIN`: dense attention scores in memory; None otherwise (XLA:GPU's split-K GEMMs are batched
    too, but contract thousands). `dtypes`: the computation's names -> dtypes."""
    if ins["op"] == "dot":
        m = re.search(r"lhs_batch_dims=\{([0-9,]*)\}", ins["rest"])
        batched = bool(m and m.group(1))
        c = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins["rest"])
        contract = [int(d) for d in c.group(1).split(",") if d] if c else []
    elif ins["op"] == "custom-call" and 'custom_call_target="__cublas' in ins["rest"]:
        dims = _backend_config(ins).get("gemm_backend_config", {}).get("dot_dimension_numbers", {})
        batched = bool(dims.get("lhs_batch_dimensions"))
        contract = [int(d) for d in dims.get("lhs_contracting_dimensions", [])]
    else:
        return None
    ops = re.findall(r"%([\w.\-]+)", ins["rest"].split(")")[0])
    out = array_shapes(ins["type"])
    if not batched or not ops or ops[0] not in shapes or not out or out[0][0] not in ("f32", "bf16", "f16") \
            or len(out[0][1]) < 2:
        return None
    k = int(np.prod([shapes[ops[0]][d] for d in contract])) if contract else 1
    if k > HEAD_DIM_MAX or min(out[0][1][-2:]) < SCORES_MIN:
        return None
    return out[0][0], out[0][1], dtypes.get(ops[0], "?")


def hlo_summary(text: str, top: int = 5) -> dict:
    """Loop-aware figures from the optimized per-chip HLO: matmul FLOPs, collectives by kind (count and
    bytes of their largest operand/result, times the executions of their computation; 'count' counts
    executions, 'static_count' HLO instructions), custom-call targets, loops, the largest values
    produced by the entry computation and the loops, and the largest dense attention scores (`dense_scores`:
    {'gib', 'shape', 'operands': the dtype they are computed from} or None)."""
    hlo = parse_hlo(text)
    mult = multipliers(hlo)
    flops, coll, custom, loops, big, scores = 0.0, {}, {}, [], [], None
    for comp, insts in hlo["comps"].items():
        k = mult.get(comp, 0)
        if not k:
            continue
        # a name is local to its computation (XLA:GPU's fusions each name their parameters parameter_0, ...)
        arrays = {ins["name"]: arr[0] for ins in insts for arr in [array_shapes(ins["type"])] if len(arr) == 1}
        shapes = {name: a[1] for name, a in arrays.items()}
        dtypes = {name: a[0] for name, a in arrays.items()}
        for ins in insts:
            op = ins["op"]
            if op in ("dot", "convolution"):
                flops += k * dot_flops(ins, shapes)
            elif op == "custom-call":
                flops += k * custom_call_flops(ins, shapes)
            sc = dense_scores(ins, shapes, dtypes)
            if sc is not None and (scores is None or nbytes(sc[:2]) > nbytes(scores[:2])):
                scores = sc
            base = op[:-6] if op.endswith("-start") else op
            if base == "all-reduce" and comp.startswith("all-reduce-scatter"):
                base = "reduce-scatter"  # XLA:TPU writes a reduce-scatter as all-reduce + slice in one fusion
            if base in COLLECTIVES and not op.endswith("-done"):
                arrs = array_shapes(ins["type"])
                size = max((nbytes(a) for a in arrs), default=0.0)
                c = coll.setdefault(base, {"count": 0, "bytes": 0.0, "static_count": 0, "ops": []})
                c["count"] += k
                c["static_count"] += 1
                c["bytes"] += k * size
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
                n = while_trips(hlo["comps"], comp, ins) if cond else 1
                meta = re.search(r'op_name="([^"]+)"', ins["rest"])
                loops.append({"trips": n, "runs": k, "op": meta.group(1)[-80:] if meta else ins["name"]})
            if op not in ("parameter", "get-tuple-element", "tuple", "bitcast") and comp == hlo["entry"] or \
                    op == "while":
                arrs = array_shapes(ins["type"])
                if arrs:
                    a = max(arrs, key=nbytes)
                    meta = re.search(r'op_name="([^"]+)"', ins["rest"])
                    big.append((nbytes(a), f"{a[0]}[{','.join(map(str, a[1]))}]",
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
    dense = None if scores is None else {"gib": round(nbytes(scores[:2]) / GIB, 3),
                                         "shape": f"{scores[0]}[{','.join(map(str, scores[1]))}]",
                                         "operands": scores[2]}
    return {"flops": flops, "collectives": coll, "custom_calls": custom, "loops": loops, "largest": largest,
            "dense_scores": dense}


def loop_collective_bytes(text: str, runs: int, op: str = "all-gather") -> float:
    """Bytes moved per program execution by the `op` collectives (their largest operand/result, sync or
    async start) of the computations that run `runs` times, e.g. a decode loop's body of `runs` trips."""
    hlo = parse_hlo(text)
    mult = multipliers(hlo)
    return sum(mult[comp] * max(nbytes(a) for a in array_shapes(ins["type"]))
               for comp, insts in hlo["comps"].items() if mult.get(comp) == runs
               for ins in insts if ins["op"] in (op, op + "-start"))
