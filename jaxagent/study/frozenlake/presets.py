"""The FrozenLake study's presets: frozen dataclasses, one per scale (`PRESETS`). `quick` is the README's
default (a 2-core CPU). `with_overrides` gives a preset with a command line's changes applied."""
from __future__ import annotations

import dataclasses
from typing import Optional

from jaxagent.models.config import Qwen3Config
from jaxagent.study import preset_names
from jaxagent.study.run_dir import InvalidSettings
from jaxagent.study.stages import BaseSettings, TaskSettings


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    n_tasks: int = 16                 # held-out maps per policy
    n_samples: int = 8                # rollouts per task and budget tier (n of the pass@k estimator)
    ks: tuple[int, ...] = (1, 2, 4, 8)
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    n_states: int = 32                # matched states per policy for step quality
    n_error_states: int = 32
    n_sampled: int = 16               # G: next actions sampled per policy and matched state (finding 3)
    n_continuations: int = 4          # rollouts per policy from each error state, and from its control (finding 4)
    n_boot: int = 500
    hidden_budget: bool = True        # also evaluate with the budget hidden (beyond the paper)
    n_plan_tasks: int = 64            # held-out maps of R_single (plan-mode success, `study.plan_mode`)
    n_plan_samples: int = 8           # plan replies sampled per map (R_single's Z)
    # The headline evaluation (finding 1, full budget, `measure.headline_eval`): maps and samples of its own per
    # policy, so finding 1's interval is not set by the Pass@ grid's sampling noise; 0: finding 1 from the grid
    headline_tasks: int = 0
    headline_samples: int = 0         # >= the largest K (the unbiased Pass@K estimator needs n >= K)


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    model: Qwen3Config
    task: TaskSettings
    base: BaseSettings
    arms: tuple[str, ...] = ("grpo", "budgetmix", "gigpo", "ppo", "grpo_oracle", "grpo_tight", "grpo_oracle_tight")
    seeds: tuple[int, ...] = (0, 1, 2)
    iterations: int = 10
    n_tasks: int = 4                  # tasks per RL iteration
    group_size: int = 8               # rollouts per task (GRPO group)
    lr: float = 1e-3
    epochs: int = 1                   # passes over each iteration's episodes (PPO-style reuse)
    minibatches: int = 1              # updates per pass; with epochs > 1 the clip becomes active
    kl_coef: float = 0.0              # KL(policy || base) penalty
    kl_estimator: str = "k3"          # the KL in the loss: sampled k1, k2, k3 (losses.kl_penalty) or "exact" (losses.exact_kl)
    entropy_coef: float = 0.0
    dynamics_every: int = 2           # R_multi / R_single logging period (iterations)
    eval: EvalSettings = EvalSettings()
    checkpoint: Optional[str] = None  # a local HF Qwen3 directory: the base model (skips SFT)
    mesh: tuple[int, int, int] = (1, 1, 1)   # (data, fsdp, tensor)
    compute_dtype: str = "float32"
    # Memory of the RL train step (`python -m experiments.aot_check` checks the fit):
    micro_batches: int = 1            # gradient-accumulation micro-batches per update
    remat: Optional[str] = None       # per-layer activation checkpointing (qwen3.REMAT_POLICIES)
    scan_layers: bool = False         # the train step's forwards as one lax.scan over layers (`MemoryPlan.scan_layers`)
    tis_cap: Optional[float] = None   # truncated importance sampling cap on the sampler's log-probs
    # The AOT check (experiments/aot_check.py): the checkpoint's architecture (a models.config.PRESETS
    # name), the topology compiled for (TPU 'v5p:4x4x4', GPUs 'h100:1x1x8'), and a GPU preset's HBM, checked
    # where a TPU topology stands in for its GPUs (`--topology v5p:...`).
    aot_model: Optional[str] = None
    aot_topology: Optional[str] = None
    aot_hbm_gib: Optional[float] = None
    rehearsal: bool = False           # counts cut by `rehearsal_preset`: the report says its figures test the pipeline

    @property
    def rollout_batch(self) -> int:
        """n_tasks x group_size: the episodes of one RL iteration, and the rows of each evaluation rollout chunk
        and of each R_single plan-generation call, so each of those programs fits where the training rollout does."""
        return self.n_tasks * self.group_size

    @property
    def scoring_batch(self) -> int:
        """rollout_batch / micro_batches: the rows of each teacher-forced likelihood scoring call (finding 5), the
        train step's micro-batch, so a forward over whole episodes on the f32 params fits where the train step's
        forward and backward do (the dense f32 attention scores of 128 rows x 2,048 tokens alone are 32 GiB)."""
        return self.rollout_batch // self.micro_batches


def _toy_model(vocab: int = 128) -> Qwen3Config:
    # vocab is replaced by the toy tokenizer's size at run time
    return Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=32)


def _accelerator(name: str, *, n_tasks: int, mesh: tuple[int, int, int], eval_tasks: int = 256,
                 micro_batches: int, aot_model: str, aot_topology: str, aot_hbm_gib: Optional[float] = None,
                 remat: Optional[str] = "full") -> Preset:
    """A real-checkpoint preset: no SFT (the checkpoint is the base), bf16 compute, longer replies; the train
    step's micro-batches and remat sized so every program fits the chip (docs/aot.md)."""
    return Preset(name=name, model=Qwen3Config(),
                  task=TaskSettings(size=4, t_max=10, max_action_tokens=64, max_context=2048),
                  base=BaseSettings(steps=0), iterations=200, n_tasks=n_tasks, group_size=8, lr=1e-6, mesh=mesh,
                  compute_dtype="bfloat16", micro_batches=micro_batches, remat=remat, aot_model=aot_model,
                  aot_topology=aot_topology, aot_hbm_gib=aot_hbm_gib,
                  eval=EvalSettings(n_tasks=eval_tasks, n_samples=16, ks=(1, 2, 4, 8, 16), n_states=512,
                                    n_error_states=512))


PRESETS: dict[str, Preset] = {
    # The toy recipe (docs/study.md, from `python -m experiments.sweep`): a base SFT at 6e-3 (valid-action
    # rate 0.999), RL at lr 1.5e-4, 64 episodes per iteration (8 groups of 8), 2 epochs x 2 minibatches (so
    # the clip is active), KL 0.05 to the base computed exactly over the toy vocabulary at every state of
    # the batch (a sampled estimate sees only the sampled token, and the valid-action dips came from invalid
    # replies absent from the batch), reward -0.3 for an invalid reply. The low rate, the larger batch and the
    # active clip keep every seed from collapsing, which one seed in three did at lr 1e-3 with 32 episodes and 1
    # update (docs/study.md, "Learning rate, batch and KL coefficient"). quick runs 12 iterations (not standard's 20)
    # so the default study fits a laptop session; docs/study.md reports the run times. quick trains only the
    # arms a FrozenLake verdict reads (GRPO: findings 1-6; BudgetMix: 8; GRPO and the oracle arm at the tightest
    # tier: 7; the oracle arm at full budget: 7's reported row), on 5
    # seeds, and decides finding 1 on a headline evaluation of 256 maps x 8 samples per policy: on the Pass@
    # grid's 32 x 4 the per-seed sd was about 6 points, 5.4 of them sampling noise (docs/study.md, Power).
    # T_max 8: the budget tiers 2/4/6/8 are exactly 25/50/75/100% of it. max_context 400 holds every 8-turn
    # episode: system turn 39 tokens, first turn at most 3 + 9 + 19 + 5 + 4 = 40 (opener, budget text, map,
    # assistant opener, a 4-token reply), each later turn at most 5 + 9 + 22 + 5 + 4 = 45 (after a truncated
    # reply, with "Invalid action ."), so 39 + 40 + 7 x 45 = 394 (the noisy expert's longest of 512: 350).
    # The base: SFT at the full budget T_max (no BudgetMix budgets, finding 8) with a quarter of its episodes
    # in plan mode (R_single, `study.plan_mode`).
    "quick": Preset(
        name="quick", model=_toy_model(),
        task=TaskSettings(size=4, t_max=8, max_context=400, format_penalty=0.3),
        base=BaseSettings(n_episodes=1024, steps=200, batch_size=32, lr=6e-3, budget_mode="full",
                          plan_fraction=0.25),
        arms=("grpo", "budgetmix", "grpo_oracle", "grpo_tight", "grpo_oracle_tight"), seeds=(0, 1, 2, 3, 4),
        iterations=12, n_tasks=8, group_size=8, lr=1.5e-4, epochs=2, minibatches=2, kl_coef=0.05,
        kl_estimator="exact",
        eval=EvalSettings(n_tasks=32, n_samples=4, ks=(1, 2, 4), n_states=24, n_error_states=24, n_sampled=8,
                          n_boot=300, n_plan_tasks=32, n_plan_samples=4, headline_tasks=256, headline_samples=8)),
    # Sized for power: 5 seeds, K up to 8, 64 held-out maps (17 of them, 27%, solvable at the tightest tier,
    # T=2 of 8), 64 matched and error states per policy with G=16.
    "standard": Preset(
        name="standard", model=_toy_model(),
        task=TaskSettings(size=4, t_max=8, max_context=400, format_penalty=0.3),
        base=BaseSettings(n_episodes=1024, steps=200, batch_size=32, lr=6e-3, budget_mode="full",
                          plan_fraction=0.25),
        seeds=(0, 1, 2, 3, 4), iterations=20, n_tasks=8, group_size=8, lr=1.5e-4, epochs=2, minibatches=2,
        kl_coef=0.05, kl_estimator="exact",
        eval=EvalSettings(n_tasks=64, n_samples=8, ks=(1, 2, 4, 8), n_states=64, n_error_states=64,
                          n_sampled=16, n_boot=1000, headline_tasks=256, headline_samples=8)),
    # T_max 12: tiers 3/6/9/12. max_context 704 holds every 12-turn episode on a 5x5 map (at most 694 tokens,
    # counted as for quick; the noisy expert's longest of 512: 644).
    "full": Preset(
        name="full", model=Qwen3Config(vocab_size=128, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=32),
        task=TaskSettings(size=5, t_max=12, max_context=704),
        base=BaseSettings(n_episodes=8192, steps=3000, batch_size=64, lr=2e-3, budget_mode="full",
                          plan_fraction=0.25),
        seeds=(0, 1, 2, 3, 4), iterations=200, n_tasks=8, group_size=8,
        eval=EvalSettings(n_tasks=64, n_samples=16, ks=(1, 2, 4, 8, 16), n_states=256, n_error_states=256,
                          n_boot=1000)),
    # Accelerator presets: a real Qwen3 checkpoint directory is required (--checkpoint); the FrozenLake
    # text goes through the real Qwen3 tokenizer (BPE) and the chat template of the checkpoint.
    # GPU presets: 80 GB GPUs (H100/A100); AOT-checked for H100s (`--target h200` for H200s).
    # 16 tasks x 8: the rollout's KV cache of 256 episodes x 2048 slots did not fit 80 GB (docs/aot.md)
    "qwen3-0.6b-1gpu": _accelerator("qwen3-0.6b-1gpu", n_tasks=16, mesh=(1, 1, 1), eval_tasks=128,
                                    micro_batches=16, aot_model="qwen3_0_6b", aot_topology="h100:1x1x1",
                                    aot_hbm_gib=80.0),
    # 32 micro-batches: at 16 the PPO step (policy + separate critic) needs 74.0 GiB per chip, 0.93 of 80 GB
    # (docs/aot.md); at 32, 51.9 GiB (0.65)
    "qwen3-4b-8gpu": _accelerator("qwen3-4b-8gpu", n_tasks=64, mesh=(1, 8, 1), micro_batches=32,
                                  aot_model="qwen3_4b", aot_topology="h100:1x1x8", aot_hbm_gib=80.0),
    "qwen3-8b-v5p": _accelerator("qwen3-8b-v5p", n_tasks=128, mesh=(4, 8, 2), micro_batches=8,
                                 aot_model="qwen3_8b", aot_topology="v5p:4x4x4"),
    # The end-to-end CI test's settings (tests/test_study_e2e.py): minutes, not seconds. `/usr/bin/time python -m
    # experiments.reproduce --preset ci`: 70 s of CPU time, 4:01 wall on a 2-core machine shared with other jobs.
    "ci": Preset(
        name="ci", model=Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16),
        # T_max 4, tiers 2/4 (50/100%); 192 slots: an episode takes at most 39 + 32 + 3 x 37 = 182 (counted as quick's)
        task=TaskSettings(size=3, t_max=4, max_context=192),
        base=BaseSettings(n_episodes=64, steps=4, batch_size=8, budget_mode="full", plan_fraction=0.25),
        arms=("grpo", "budgetmix", "grpo_tight", "grpo_oracle_tight"), seeds=(0, 1), iterations=2, n_tasks=2,
        group_size=4, dynamics_every=1,
        kl_coef=0.05, kl_estimator="exact",   # the toy recipe's KL path end to end
        eval=EvalSettings(n_tasks=4, n_samples=2, ks=(1, 2), fractions=(0.5, 1.0), n_states=4, n_error_states=4,
                          n_boot=50, n_plan_tasks=4, n_plan_samples=2, headline_tasks=4, headline_samples=2)),
}


# Each preset's one-line description, as --help shows it (`preset_names.FROZENLAKE`, read without importing this module).
PRESET_NOTES = preset_names.FROZENLAKE

# `rehearsal_preset`'s interaction limits: 4 turns of 16-token replies in 512 slots hold an episode in the real Qwen3
# tokenizer (system turn and 4 turns of a 4x4 map and a 16-token reply: about 420 tokens).
REHEARSAL_TASK = dict(t_max=4, max_action_tokens=16, max_context=512)


def rehearsal_preset(preset: Preset) -> Preset:
    """`preset` with its counts cut so that its whole pipeline (base, every arm, every diagnostic, report.md) runs on a
    2-core CPU in minutes: the model, tokenizer, chat format, compute dtype, arms, remat and learning rates stay;
    one seed, one iteration of one task x 2 rollouts in one micro-batch (on a mesh: the least even multiple of its
    data x fsdp batch shards, so the batch splits over them), `REHEARSAL_TASK`'s turns and slots, 2
    held-out maps x 1 sample at 2 budget tiers (K = 1), 2 matched and 2 error states with 2 sampled actions and 1 continuation, 2 plan
    maps x 1 reply. Every program runs at these counts, not the preset's (its fit at the preset's counts is the AOT
    check's, experiments.aot_check). `rehearsal=True` makes the report say so."""
    task = dataclasses.replace(preset.task, **REHEARSAL_TASK)
    base = dataclasses.replace(preset.base, n_episodes=min(preset.base.n_episodes, 16), steps=min(preset.base.steps, 2),
                               batch_size=min(preset.base.batch_size, 2))
    ev = dataclasses.replace(preset.eval, n_tasks=2, n_samples=1, ks=(1,), fractions=(0.5, 1.0), n_states=2,
                             n_error_states=2, n_sampled=2, n_continuations=1, n_boot=20, n_plan_tasks=2, n_plan_samples=1,
                             headline_tasks=min(preset.eval.headline_tasks, 2),
                             headline_samples=min(preset.eval.headline_samples, 1))
    return dataclasses.replace(preset, task=task, base=base, eval=ev, seeds=preset.seeds[:1], iterations=1, n_tasks=1,
                               group_size=preset_names.rehearsal_group(preset.mesh), minibatches=1, micro_batches=1,
                               dynamics_every=1, rehearsal=True)


def needs_checkpoint(preset: Preset) -> bool:
    """Whether the preset runs a real Qwen3 (the accelerator presets) and so needs a checkpoint directory."""
    return preset.name.startswith("qwen3") and not preset.checkpoint


def with_overrides(preset: Preset | str, *, checkpoint: Optional[str] = None, iterations: Optional[int] = None,
                   seeds=None, arms=None, mesh=None, compute_dtype: Optional[str] = None, micro_batches: Optional[int] = None,
                   remat: Optional[str] = None, rehearsal: bool = False, scan_layers: bool = False) -> Preset:
    """`preset` (or `PRESETS[preset]`) with the given fields replaced; a None (or empty) argument keeps the
    preset's value, and remat "none" means no activation checkpointing; `scan_layers` True sets it. `rehearsal`:
    the counts cut first (`rehearsal_preset`), the other arguments then applied. InvalidSettings when an
    accelerator preset is left without a checkpoint directory, or the name is unknown."""
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise InvalidSettings(f"unknown preset {preset!r}; the presets: {', '.join(sorted(PRESETS))}")
        preset = PRESETS[preset]
    if rehearsal:  # cut for the mesh the run will use
        preset = rehearsal_preset(dataclasses.replace(preset, mesh=tuple(mesh)) if mesh else preset)
    changes = {}
    if checkpoint:
        changes["checkpoint"] = checkpoint
    if iterations is not None:
        changes["iterations"] = iterations
    if seeds:
        changes["seeds"] = tuple(seeds)
    if arms:
        changes["arms"] = tuple(arms)
    if mesh:
        changes["mesh"] = tuple(mesh)
    if compute_dtype:
        changes["compute_dtype"] = compute_dtype
    if micro_batches:
        changes["micro_batches"] = micro_batches
    if remat:
        changes["remat"] = None if remat == "none" else remat
    if scan_layers:
        changes["scan_layers"] = True
    if needs_checkpoint(dataclasses.replace(preset, **{k: v for k, v in changes.items() if k == "checkpoint"})):
        raise InvalidSettings(f"preset {preset.name} needs --checkpoint DIR (a local Hugging Face Qwen3 directory)")
    return dataclasses.replace(preset, **changes)
