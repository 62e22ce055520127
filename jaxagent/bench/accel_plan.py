"""The accelerator benchmark's plan (`jaxagent.bench.accel` runs it): its stages and their time budgets, the --smoke
shapes, and the checks of the command line's values, each bad one a `UsageError` of one line (`python -m
experiments.bench_accel` prints it and exits 2).

Time (`stage_limits`): the run has one deadline for the JAX stages (`budget_s` minus the peer's reserve,
`peer_budget_s + PEER_GRACE_S`, when the peer runs after them). Each stage, in `PARTS` order, starts its first
measurement if the deadline less the budgets of the stages after it allows, and each further one until its own
budget (seconds from its start) is spent too: an overrun early cannot eat the time of a later stage, so the RL
iteration always gets its turn. `check` (only the peer's comparison needs it) comes last and reserves nothing. A
measurement that started runs to its end (a compile cannot be cut), so the parent process also stops the JAX side
at the deadline plus `PEER_GRACE_S` (`experiments.bench_accel`).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

PARTS = ("peaks", "decode", "prefill", "train", "rl", "check")
# Seconds per stage on one H100 or H200, compiles included (docs/performance.md: the plan behind each figure)
STAGE_BUDGETS = {"peaks": 20.0, "decode": 90.0, "prefill": 50.0, "train": 110.0, "rl": 130.0, "check": 40.0}
PEER_GRACE_S = 30.0  # the peer's last item (and the JAX side's last measurement) may run this long past a budget
TRAIN_MODELS = ("qwen3-4b", "qwen3-1.7b", "qwen3-0.6b")  # --train-model auto: the largest whose step fits
SMOKE = dict(models="tiny", decode_batches="1", decode_context="16", decode_steps="4", prefill_contexts="16",
             prefill_tokens="32", train_model="tiny", train_rows="2", train_seq="32", train_prompt="8",
             micro_batches="2", rl_preset="ci", check_model="tiny", repeats="1", peak_matmul="128",
             peak_copy_mib="1")


class UsageError(ValueError):
    """A bad argument: one line on stderr, exit status 2."""


def ints(text: str, flag: str, lo: int = 1) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if not vals or any(v < lo for v in vals):
        raise UsageError(f"{flag} {text!r}: expected comma-separated integers >= {lo}, e.g. {flag} 1,16,64")
    return vals


def names(text: str, flag: str, valid, allow_none: bool = False) -> tuple[str, ...]:
    got = tuple(x for x in text.split(",") if x)
    if allow_none and got == ("none",):
        return ()
    bad = [n for n in got if n not in valid]
    if bad or not got:
        raise UsageError(f"{flag}: unknown name {bad[0] if bad else text!r}; valid: {', '.join(valid)}"
                         + (", none" if allow_none else ""))
    if len(set(got)) != len(got):
        raise UsageError(f"{flag} {text!r}: a name is given twice")
    return got


def one(text: str, flag: str, lo: int = 1) -> int:
    vals = ints(text, flag, lo)
    if len(vals) != 1:
        raise UsageError(f"{flag} {text!r}: expected one integer >= {lo}")
    return vals[0]


def number(text, flag: str, positive: bool = True) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        v = float("nan")
    if not (v > 0 if positive else v >= 0) or v != v or v == float("inf"):
        raise UsageError(f"{flag} {text!r}: expected a {'positive' if positive else 'non-negative'} number")
    return v


def budgets(text: Optional[str]) -> dict:
    """STAGE_BUDGETS with the changes of `--stage-budgets decode=120,rl=200`."""
    out = dict(STAGE_BUDGETS)
    for item in (text or "").split(","):
        if not item:
            continue
        stage, _, val = item.partition("=")
        if stage not in out:
            raise UsageError(f"--stage-budgets: unknown stage {stage!r}; stages: {', '.join(PARTS)}")
        out[stage] = number(val, f"--stage-budgets {stage}")
    return out


@dataclasses.dataclass
class Plan:
    models: tuple
    decode_batches: tuple
    decode_context: int
    decode_steps: int
    prefill_contexts: tuple
    prefill_tokens: int
    train_model: Optional[str]  # a bench.models name, "auto" (`TRAIN_MODELS`), or None
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
    stage_budgets: dict
    peer_budget_s: float
    peer: bool
    peer_compile: bool
    peak_tflops: Optional[float]
    hbm_gbps: Optional[float]
    peak_matmul: int
    peak_copy_mib: int
    checkpoint: Optional[str]
    seed: int
    smoke: bool = False

    def jax_deadline_s(self, with_peer: bool) -> float:
        """Seconds after the run's start by which the JAX stages start their last measurement."""
        return self.budget_s - ((self.peer_budget_s + PEER_GRACE_S) if with_peer else 0.0)

    def stage_limits(self, stage: str, started_s: float, deadline_s: float) -> tuple[float, float]:
        """(own end, reserve end) on the run's clock of `stage` started at `started_s` (module doc): its first
        measurement starts before the reserve end, each other one before both."""
        later = [s for s in PARTS[PARTS.index(stage) + 1:] if s in self.parts and s != "check"]
        return started_s + self.stage_budgets[stage], deadline_s - sum(self.stage_budgets[s] for s in later)


def plan_from(a, defaults: Mapping, presets_fn) -> Plan:
    """The run's plan from the parsed command line `a` (strings as typed; `defaults`: the parser's defaults, for
    --smoke; `presets_fn()`: the study presets by name, for --rl-preset, called only when one is named; when the
    study does not import, the name is kept unchecked and the RL stage records the ImportError); UsageError (one
    line) for a bad argument."""
    from jaxagent.bench.models import MODELS
    if a.smoke:  # tiny shapes wherever the command line kept the default
        for k, v in SMOKE.items():
            if getattr(a, k) == defaults[k]:
                setattr(a, k, v)
    parts = names(a.only, "--only", PARTS)
    train_model = names(a.train_model, "--train-model", list(MODELS) + ["auto"], allow_none=True)
    check_model = names(a.check_model, "--check-model", list(MODELS), allow_none=True)
    rl = ()
    if a.rl_preset != "none":
        try:
            presets = presets_fn()
        except ImportError:  # a package only the study needs is missing: the RL stage's record says which
            presets = None
        rl = (a.rl_preset,) if presets is None else names(a.rl_preset, "--rl-preset", list(presets), allow_none=True)
        if a.rl_base == "sft" and presets is not None:
            p_rl = presets[rl[0]]
            if getattr(p_rl, "aot_model", None) or not hasattr(p_rl, "base") or p_rl.base.steps == 0:
                raise UsageError(f"--rl-base sft: preset {rl[0]!r} has no SFT base stage (it starts from a "
                                 "checkpoint); the toy FrozenLake presets (quick, standard, full, ci) do")
    remat = None if a.remat == "none" else a.remat
    if remat is not None:
        from jaxagent.models.qwen3 import REMAT_POLICIES
        if remat not in REMAT_POLICIES:
            raise UsageError(f"--remat: unknown policy {a.remat!r}; valid: {', '.join(sorted(REMAT_POLICIES))}, none")
    rows, seq, prompt, mb = (one(a.train_rows, "--train-rows"), one(a.train_seq, "--train-seq", 2),
                             one(a.train_prompt, "--train-prompt", 0), one(a.micro_batches, "--micro-batches"))
    if prompt >= seq:
        raise UsageError(f"--train-prompt {prompt} must be below --train-seq {seq} (no policy token is left)")
    if rows % mb:
        raise UsageError(f"--micro-batches {mb} must divide --train-rows {rows}")
    mesh = None if a.mesh is None else ints(a.mesh, "--mesh")
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
        models=names(a.models, "--models", list(MODELS)), decode_batches=ints(a.decode_batches, "--decode-batches"),
        decode_context=one(a.decode_context, "--decode-context"), decode_steps=one(a.decode_steps, "--decode-steps", 2),
        prefill_contexts=ints(a.prefill_contexts, "--prefill-contexts"),
        prefill_tokens=one(a.prefill_tokens, "--prefill-tokens"), train_model=train_model[0] if train_model else None,
        train_rows=rows, train_seq=seq, train_prompt=prompt, micro_batches=mb, remat=remat,
        rl_preset=rl[0] if rl else None, rl_iterations=one(a.rl_iterations, "--rl-iterations"), rl_world=a.rl_world,
        rl_base=a.rl_base, check_model=check_model[0] if check_model else None, parts=parts, mesh=mesh,
        repeats=one(a.repeats, "--repeats"), warmup=one(a.warmup, "--warmup", 0),
        budget_s=number(a.budget_s, "--budget-s"), stage_budgets=budgets(a.stage_budgets),
        peer_budget_s=number(a.peer_budget_s, "--peer-budget-s"), peer=not a.no_peer, peer_compile=a.peer_compile,
        peak_tflops=None if a.peak_tflops is None else number(a.peak_tflops, "--peak-tflops"),
        hbm_gbps=None if a.hbm_gbps is None else number(a.hbm_gbps, "--hbm-gbps"),
        peak_matmul=one(a.peak_matmul, "--peak-matmul"), peak_copy_mib=one(a.peak_copy_mib, "--peak-copy-mib"),
        checkpoint=a.checkpoint, seed=one(a.seed, "--seed", 0), smoke=a.smoke)
