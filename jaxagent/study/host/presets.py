"""Presets of the host-domain study (`HOST_PRESETS`, run by `pipeline.run_study` and `experiments.host_study`): one per
domain and scale.

Domains (`domains.DOMAINS`): sql, bfcl (BFCL v4 multi-turn), code (multi-turn coding). Scales: `ci-<domain>`, a
minutes-scale CI miniature on a tiny random Qwen3 with the real Qwen3 tokenizer; `<domain>-toy` (sql-toy, code-toy;
bfcl-toy on the bfcl-first domain, bfcl2-toy on bfcl-two), studies that learn on a 2-core CPU from a toy Qwen3
fine-tuned on a noisy expert's references, whose reports call their findings pipeline demonstrations on a designed
base (`TOY_SCOPE`); `qwen3-0.6b-1gpu-<domain>` (one 80 GB GPU) and `qwen3-8b-v5p-<domain>` (a v5p-128 slice, mesh
(data, fsdp, tensor) = (4, 8, 2)), each from --checkpoint. The sql and code domains use their built-in tasks unless
`data` (`--data DIR`, `--data-format`) names a local Spider / InterCode-SQL or DeepCoder-style / APPS directory
(`data_env`). The AOT fields say what the AOT check compiles a preset for, as on the FrozenLake presets.
Presets and sizes: docs/host_study.md, "Domains", "Sizes" (the KV-cache arithmetic), "Toy presets" and "The CI
miniatures"; timings: docs/performance.md, "CPU figures".
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from jaxagent.envs.host import base as host_envs
from jaxagent.envs.host.datasets import DataError
from jaxagent.models.config import Qwen3Config
from jaxagent.study import preset_names
from jaxagent.study.host.sft import HostSFTSettings
from jaxagent.study.host.domains import get_domain
from jaxagent.study.host.stages import HOST_ARMS, HostTaskSettings
from jaxagent.study.run_dir import InvalidSettings


@dataclasses.dataclass(frozen=True)
class HostEvalSettings:
    n_samples: int = 16               # rollouts per held-out task and budget tier (n of the pass@k estimator)
    ks: tuple[int, ...] = (1, 2, 4, 8, 16)
    fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    batch_size: int = 64              # episodes per evaluation rollout batch
    step_samples: int = 16            # G: replies sampled per policy and matched state (finding 3, coding; the
                                      # paper's 16), in the evaluation's rollout batches (`host_step_quality`)
    step_states: int = 64             # matched states drawn from each policy's full-budget episodes per GRPO seed:
                                      # 2 x 64 states x 16 replies x 2 policies = 4,096 rows of one sampled reply
                                      # each per seed (64 batches of 64 at 0.6B; a prefix's env steps run once per
                                      # state and policy, `host_step_quality.StopAfter`)


@dataclasses.dataclass(frozen=True)
class HostPreset:
    name: str
    task: HostTaskSettings
    eval: HostEvalSettings = HostEvalSettings()
    checkpoint: Optional[str] = None  # a local HF Qwen3 directory (with its tokenizer): the base policy
    data: Optional[str] = None        # sql / code: a local dataset directory (`data_env`); None: the built-in tasks
    tiny_model: Optional[Qwen3Config] = None  # CI: a random Qwen3 with the real Qwen3 tokenizer (no checkpoint)
    # toy: the tiny model's tokenizer is Qwen3's pruned to the domain's texts (`host_sft.tokenizer_corpus`), its
    # vocabulary that size (the tiny_model's vocab_size is replaced), and the base is SFT on reference solutions
    pruned_vocabulary: bool = False
    sft: Optional[HostSFTSettings] = None
    arms: tuple[str, ...] = HOST_ARMS
    seeds: tuple[int, ...] = (0, 1, 2)
    iterations: int = 100
    n_tasks: int = 8                  # tasks per RL iteration (drawn with replacement from the train split)
    group_size: int = 8               # rollouts per task (GRPO group)
    lr: float = 1e-6
    epochs: int = 1
    minibatches: int = 1
    kl_coef: float = 0.0
    kl_estimator: str = "k2"          # the KL term's per-token estimator (`losses.kl_penalty`), as FrozenLake's
    entropy_coef: float = 0.0
    temperature: float = 1.0
    compute_dtype: str = "float32"
    mesh: tuple[int, int, int] = (1, 1, 1)   # (data, fsdp, tensor); (1, 1, 1): the default device
    micro_batches: int = 1
    remat: Optional[str] = None
    scan_layers: bool = False         # the train step's forwards as one lax.scan over layers (`MemoryPlan.scan_layers`)
    compiler_options: tuple = ()      # (name, value) XLA options of the train step's jit (`MemoryPlan.compiler_options`)
    # The train step projects onto the vocabulary at the batch's policy tokens only, packed into one list per
    # micro-batch (`host_stages.make_host_arm_runtime(packed_policy=)`), the same loss and gradient to float rounding.
    # The toy presets and ci-sql set it; the GPU and pod presets' programs (docs/aot_records) are checked without it.
    policy_positions: bool = False
    # Finding 6 (coding only, `host_dynamics`): R_single on the held-out first turns (eval.n_samples per task, in the
    # evaluation's rollout batches) at the base, after every `dynamics_every` updates and after the last, for the main
    # arm's (grpo's) seeds. One measurement is P x n_samples one-turn episodes, e.g. 4 x 16 = 64 at 0.6B: about one
    # training rollout's first turn, so every 10th of 100 iterations (11 points with the base's) costs a few percent
    # of the arm.
    dynamics_every: int = 10
    # The AOT check (experiments/aot_check.py): the checkpoint's architecture (a models.config.PRESETS name), the
    # topology compiled for (TPU 'v5p:4x4x4', GPUs 'h100:1x1x1'), and a GPU preset's HBM, checked where a TPU topology
    # stands in for its GPU (`--topology v5p:...`).
    aot_model: Optional[str] = None
    aot_topology: Optional[str] = None
    aot_hbm_gib: Optional[float] = None
    rehearsal: bool = False           # counts cut by `rehearsal_preset`: the report says its figures test the pipeline
    # The shift `with_seed_offset` applied (`--seed-offset`): already added to `seeds` and to the SFT's seed; it
    # also seeds the tiny model's random init and names the run directory (`run_name`)
    seed_offset: int = 0
    # The data's layout (`--data-format`): sql "spider" | "intercode", code "deepcoder" | "apps"; None: detected from
    # the files (an ambiguous directory is refused). Only with `data`.
    data_format: Optional[str] = None
    # (name, value) keyword arguments of the domain's env, e.g. (("grading", "spider"),) or
    # (("require_reference", True),) (`data_env`; the report names the grading the env ran)
    env_options: tuple = ()
    # What the run's findings show, printed at the top of its report (the toy presets: pipeline demonstrations)
    scope_note: str = ""

    @property
    def policy_tokens(self) -> Optional[int]:
        """With `policy_positions`, the most policy tokens a row can hold (t_max x max_action_tokens: a reply is cut
        at max_action_tokens), the per-row bound an AOT check lowers the step with (`MemoryPlan(policy_tokens=)`,
        an upper bound of the packed lists' work); else None."""
        return self.task.t_max * self.task.max_action_tokens if self.policy_positions else None


DATA_ENVS = ("sql", "code")  # env registry names whose constructor reads a dataset directory (`data=`)
DATA_FORMATS = {"sql": ("spider", "intercode"), "code": ("deepcoder", "apps")}  # `--data-format` per env
# `env_options` each env takes (the ones `data_env` passes besides the domain's own), and those that need `data`
ENV_OPTIONS = {"sql": ("grading", "keep_distinct", "schema_in_prompt", "lenient_text"),
               "code": ("require_reference",)}
DATA_OPTIONS = ("require_reference",)
# The toy presets' `scope_note`: what their findings can and cannot show
TOY_SCOPE = ("pipeline demonstration on a designed base: the SFT base imitates a noisy expert built so that RL has a "
             "mistake shared by all tasks to unlearn; the findings below show that every stage runs and decides on "
             "trained policies, not evidence for or against the paper's claims, until a control base fine-tuned on "
             "the clean references agrees")


def data_problem(preset: HostPreset) -> Optional[str]:
    """Why the preset's `data` cannot be used (a domain whose env reads no dataset, a path that does not exist, a
    `data_format` without data or of another domain), or None."""
    env = get_domain(preset.task.domain).env
    for name, _ in preset.env_options:
        if name not in ENV_OPTIONS.get(env, ()):
            return (f"preset {preset.name!r}: the {preset.task.domain} domain's env takes no option {name!r} (it "
                    f"takes {ENV_OPTIONS.get(env, ())})")
        if name in DATA_OPTIONS and preset.data is None:
            return f"preset {preset.name!r}: option {name!r} is for --data (the built-in tasks all have references)"
    if preset.data_format is not None:
        if preset.data is None:
            return f"preset {preset.name!r}: --data-format {preset.data_format} needs --data"
        if preset.data_format not in DATA_FORMATS.get(env, ()):
            return (f"preset {preset.name!r}: --data-format {preset.data_format!r} is not a format of the "
                    f"{preset.task.domain} domain (its env reads {DATA_FORMATS.get(env, ())})")
    if preset.data is None:
        return None
    if env not in DATA_ENVS:
        return (f"preset {preset.name!r}: --data is for the {' and '.join(DATA_ENVS)} domains, not "
                f"{preset.task.domain!r}")
    if not os.path.exists(preset.data):
        return f"preset {preset.name!r}: --data {preset.data!r} does not exist (data is read from local files only)"
    return None


def preset_problem(preset: HostPreset) -> Optional[str]:
    """Why the preset cannot run as given (`data_problem`, or no checkpoint for a preset without a tiny model),
    or None."""
    problem = data_problem(preset)
    if problem is None and preset.checkpoint is None and preset.tiny_model is None:
        problem = f"preset {preset.name} needs --checkpoint DIR (a local Hugging Face Qwen3 directory)"
    if problem is None and preset.pruned_vocabulary and (preset.checkpoint is not None or preset.tiny_model is None):
        problem = (f"preset {preset.name}: pruned_vocabulary is for a tiny random model (tiny_model, no checkpoint): "
                   "a checkpoint's embedding rows belong to its own tokenizer's ids")
    return problem


# `rehearsal_preset`'s interaction limits: 2 turns of 16-token replies, tool output capped at 64 tokens, in 1,024
# slots (the sql and code prompts hold a few hundred tokens); BFCL's tool documents alone are 2,031-4,878 tokens,
# so its rehearsal keeps the tasks whose system prompt has at most 2,200 (TradingBot's) in 2,560 slots.
REHEARSAL_TASK = dict(t_max=2, max_action_tokens=16, max_obs_tokens=64, max_context=1024, max_train_tasks=2,
                      max_heldout_tasks=2, max_extra_heldout_tasks=2, task_subset="first", workers=2,
                      reply_cap_bound=False)
REHEARSAL_BFCL = dict(max_context=2560, max_system_tokens=2200)


def rehearsal_preset(preset: HostPreset) -> HostPreset:
    """`preset` with its counts cut so that its whole pipeline (base, every arm, every finding of its domain,
    report.md) runs on a 2-core CPU in minutes: the model, tokenizer, domain, compute dtype, arms, remat and learning
    rate stay; one seed, one iteration of one task x 2 rollouts in one micro-batch (on a mesh: the least even
    multiple of its data x fsdp batch shards), `REHEARSAL_TASK`'s turns and
    slots (`REHEARSAL_BFCL`'s for BFCL), 2 held-out tasks x 1 sample at 2 budget tiers (K = 1) in batches of 2, one
    matched state with 2 replies (finding 3), R_single at the base and after the iteration. The SFT of a toy preset
    runs 2 steps of 2 rows. Every program runs at these counts, not the preset's (their fit at the preset's counts is
    the AOT check's, experiments.aot_check). `rehearsal=True` makes the report say so."""
    limits = {**REHEARSAL_TASK, **(REHEARSAL_BFCL if preset.task.domain.startswith("bfcl") else {})}
    task = dataclasses.replace(preset.task, **limits, slot_bucket=None if preset.task.slot_bucket is None else
                               min(preset.task.slot_bucket, limits["max_context"]))
    ev = dataclasses.replace(preset.eval, n_samples=1, ks=(1,), fractions=(0.5, 1.0), batch_size=2,
                             step_samples=2, step_states=1)
    sft = None if preset.sft is None else dataclasses.replace(preset.sft, steps=2, batch_size=2)
    return dataclasses.replace(preset, task=task, eval=ev, sft=sft, seeds=preset.seeds[:1], iterations=1, n_tasks=1,
                               group_size=preset_names.rehearsal_group(preset.mesh), minibatches=1, micro_batches=1,
                               dynamics_every=1, rehearsal=True)


def with_seed_offset(preset: HostPreset, offset: int) -> HostPreset:
    """`preset` on seeds shifted by `offset`, as a FrozenLake run's `--seed-offset`: RL seed k -> k + offset, the
    base's SFT seed (toy presets) and the tiny model's init seed (`seed_offset`) likewise, so that a new seed set
    also has its own base; `run_name` gives it its own run directory. Offset 0 returns `preset` itself."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidSettings(f"the seed offset must be a non-negative integer, got {offset!r}")
    if offset == 0:
        return preset
    sft = None if preset.sft is None else dataclasses.replace(preset.sft, seed=preset.sft.seed + offset)
    return dataclasses.replace(preset, seeds=tuple(s + offset for s in preset.seeds), sft=sft,
                               seed_offset=preset.seed_offset + offset)


def run_name(preset: HostPreset) -> str:
    """The run directory's default name: the preset's, then "-rehearsal" (`rehearsal`), then "-s<N>" (`seed_offset`
    N), as a FrozenLake run's."""
    return (preset.name + ("-rehearsal" if preset.rehearsal else "")
            + (f"-s{preset.seed_offset}" if preset.seed_offset else ""))


def data_env(preset: HostPreset):
    """The env of the preset's domain built with `env_options` and on `preset.data` (SQLEnv: Spider / InterCode-SQL,
    `spider.load_spider`; CodeEnv: DeepCoder-style or APPS problems, `deepcoder.load_deepcoder`, which requires a
    verified reference solution per problem only when the preset fine-tunes on them, `sft`: RL from a checkpoint
    keeps problems without one, unless `env_options` says otherwise), or None with neither (the domain's own env,
    with its built-in tasks). InvalidSettings (one line naming the file and the problem) for unusable data or
    options: `data_problem`, a file the loader cannot read (`datasets.DataError`: not UTF-8, not JSON, nested too
    deeply, an ambiguous directory, no usable record), an option the env does not take."""
    if preset.data is None and not preset.env_options and preset.data_format is None:
        return None
    problem = data_problem(preset)
    if problem is not None:
        raise InvalidSettings(problem)
    domain = get_domain(preset.task.domain)
    kwargs = {**dict(domain.env_kwargs), **dict(preset.env_options)}
    if preset.data is not None:
        kwargs.update(data=preset.data, data_format=preset.data_format)
        if domain.env == "code":
            kwargs.setdefault("require_reference", preset.sft is not None)
    try:
        return host_envs.make(domain.env, **kwargs)
    except DataError as e:
        raise InvalidSettings(f"preset {preset.name!r}: --data {preset.data}: {e}") from None
    except (TypeError, ValueError) as e:
        raise InvalidSettings(f"preset {preset.name!r}: env options {dict(preset.env_options)}: {e}") from None


def tiny_model() -> Qwen3Config:
    """1 layer, width 32, with the real tokenizer's 151,936-row vocabulary: most of a miniature's time is the train
    step's unembedding over that vocabulary at every position of the context."""
    return Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16)


# The miniatures' train step at XLA:CPU's optimisation level 2, whatever XLA_FLAGS say: the tests set -O0, which
# compiles a little faster but runs this step's unembedding and log-softmax over the 151,936-token vocabulary
# several times slower, and each miniature runs the step at least once.
_CI_COMPILE = (("xla_backend_optimization_level", 2),)


def _miniature(name: str, domain: str, *, max_context: int, eval_batch: int, task_kw: dict,
               **kw) -> HostPreset:
    """A CI miniature: 2 turns of 4-token replies (the bound as if references fit them: `reply_cap_bound`), tool
    output capped at 24 tokens, 2 held-out tiers x 2 samples
    (finding 3, coding: 2 matched states from each policy, 2 replies per policy and state),
    1 task x 2 rollouts per RL iteration on the tiny random Qwen3, the train step at `_CI_COMPILE`; finding 6's
    R_single (coding) at the base and at every iteration (the last among them)."""
    return HostPreset(name=name,
                      task=HostTaskSettings(domain=domain, t_max=2, max_action_tokens=4, max_context=max_context,
                                            max_obs_tokens=24, workers=2, reply_cap_bound=False, **task_kw),
                      eval=HostEvalSettings(n_samples=2, ks=(1, 2), fractions=(0.5, 1.0),
                                            batch_size=eval_batch, step_samples=2, step_states=2),
                      tiny_model=tiny_model(), n_tasks=1, group_size=2, lr=1e-4, compiler_options=_CI_COMPILE,
                      dynamics_every=1, **kw)


def toy_model() -> Qwen3Config:
    """2 layers, width 64, as the FrozenLake toy study's model; the vocabulary (here Qwen3's) is replaced by the
    pruned tokenizer's size at run time (`HostPreset.pruned_vocabulary`)."""
    return Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def _toy(name: str, domain: str, *, t_max: int, max_action_tokens: int, max_context: int, sft: HostSFTSettings,
         fractions: tuple = (0.5, 1.0), heldout: Optional[int] = 120, task_kw: Optional[dict] = None,
         **kw) -> HostPreset:
    """A toy study sized for a CPU (docs/host_study.md, "Toy presets"): the toy model with Qwen3's tokenizer
    pruned to the domain's texts, SFT on the train split's reference solutions, then grpo and gigpo (findings 1, 2,
    7 and the domain's own) x 3 seeds; `heldout` tasks spread over the held-out split (None: all of them) x 2
    tiers x 4 samples (K up to 4), and as many of "test_constants" where the domain's env has it (the built-in sets:
    train's templates with other constants, Pass@(K,T) only). Tool output capped at 64 tokens; the train step runs
    over the slots the rollout used, in multiples of 64 (`slot_bucket`), and projects onto the vocabulary at the
    policy tokens only (`policy_positions`). The report says its findings are pipeline demonstrations
    (`TOY_SCOPE`)."""
    task = HostTaskSettings(domain=domain, t_max=t_max, max_action_tokens=max_action_tokens, max_context=max_context,
                            max_obs_tokens=64, max_heldout_tasks=heldout, task_subset="spread", workers=2,
                            slot_bucket=64, extra_heldout=("test_constants",), max_extra_heldout_tasks=heldout,
                            **(task_kw or {}))
    return HostPreset(name=name, task=task,
                      eval=HostEvalSettings(n_samples=4, ks=(1, 2, 4), fractions=fractions,
                                            batch_size=64, step_samples=4, step_states=16),
                      tiny_model=toy_model(), pruned_vocabulary=True, sft=sft, arms=("grpo", "gigpo"),
                      seeds=(0, 1, 2), policy_positions=True, scope_note=TOY_SCOPE, **kw)


# bfcl-toy's and bfcl2-toy's shared recipe: 128-token replies, every held-out task, the noisy expert's SFT and the RL
# settings (the presets' comments in HOST_PRESETS).
_BFCL_TOY = dict(max_action_tokens=128, heldout=None,
                 sft=HostSFTSettings(steps=800, batch_size=16, lr=3e-3, noise=0.5, copies=3, slip_fix=0.5,
                                     width_bucket=128),
                 iterations=20, n_tasks=8, group_size=8, lr=2e-4, kl_coef=0.5, kl_estimator="exact", epochs=2,
                 minibatches=2)

def _gpu_0_6b(name: str, task: HostTaskSettings, eval: HostEvalSettings, **kw) -> HostPreset:
    """One 80 GB GPU, Qwen3-0.6B: bf16 forward passes, 16 micro-batches with full remat in the train step (as the
    FrozenLake 0.6B preset), AOT-checked for one H100."""
    return HostPreset(name=name, task=task, eval=eval, seeds=(0, 1, 2), lr=1e-6, compute_dtype="bfloat16",
                      micro_batches=16, remat="full", aot_model="qwen3_0_6b", aot_topology="h100:1x1x1",
                      aot_hbm_gib=80.0, **kw)


def _pod_8b(name: str, task: HostTaskSettings, eval: HostEvalSettings, *, n_tasks: int, micro_batches: int,
            **kw) -> HostPreset:
    """Qwen3-8B on a v5p 4x4x4 slice with the 8B FrozenLake preset's mesh (4, 8, 2): episodes over data x fsdp = 32
    batch shards, so n_tasks x 8 / micro_batches is a multiple of 32 (one or more rows per shard per micro-batch);
    bf16 forward passes, full remat, 200 iterations, R_single (coding) every 20th (11 points, as at 0.6B)."""
    return HostPreset(name=name, task=task, eval=eval, seeds=(0, 1, 2), iterations=200, dynamics_every=20,
                      n_tasks=n_tasks, group_size=8,
                      lr=1e-6, compute_dtype="bfloat16", mesh=(4, 8, 2), micro_batches=micro_batches, remat="full",
                      aot_model="qwen3_8b", aot_topology="v5p:4x4x4", **kw)


# Interaction limits per domain at the real scales (both model sizes), and why.
# SQL: 10 turns (InterCode-SQL's limit), 256-token replies (a query or an answer), tool output capped at 512 tokens;
#   10 x (256 + 512) worst case overruns 4096 slots, but a query's table is mostly short (the env shows 30 rows).
_SQL = dict(domain="sql", t_max=10, max_action_tokens=256, max_context=4096, max_obs_tokens=512)
# SQL and coding evaluate 200 held-out tasks spread evenly over the split (the built-in sets hold 426 and 222; a
#   Spider dev set 1,034) x 4 tiers x 8 samples (K up to 8, the paper's K): 6,400 episodes per policy.
_HELDOUT = dict(max_heldout_tasks=200, task_subset="spread")
_EVAL_200 = dict(n_samples=8, ks=(1, 2, 4, 8))
# BFCL: 16 turns, one above the longest reference solution (15; tiers 4/8/12/16 leave 9%, 60%, 97%, 100% of the
#   held-out tasks structurally solvable); 256-token replies (a message of tool calls; each call ~30-80 tokens);
#   tool output capped at 512 tokens (long_context's listings run to the env's 8,000-character clip). The system
#   prompt (the tools' JSON) is 2,031-4,878 tokens, so the context is 12,288 slots at 0.6B (typical turns of
#   ~300 tokens fit 16 of them; 16 maximal turns, ~800 each, do not and end context_exhausted) and 16,384 on the pod.
_BFCL = dict(domain="bfcl", t_max=16, max_action_tokens=256, max_obs_tokens=512)
# Coding: 4 submissions (tiers 1-4 turns; the bound is 1 turn for every task), 512-token replies (a solution
#   without thinking), test feedback capped at 256 tokens (one failing test's call, expected and actual value):
#   ~250 prompt tokens + 4 x ~800 fit 4,096 slots. Env steps overlap the decoding of the other episode group
#   (overlap_groups 2; `host_schedule`: the sandboxed test runs take about as long as a turn's decoding). One env
#   thread per core of the host (workers=None: `CodeEnv.max_parallel`, the sandbox's runs at once).
_CODE = dict(domain="code", t_max=4, max_action_tokens=512, max_context=4096, max_obs_tokens=256, overlap_groups=2,
             workers=None)

HOST_PRESETS: dict[str, HostPreset] = {
    # ---------------------------------------------------------------- CI miniatures (no checkpoint)
    # Seconds-scale plumbing check: 2 turns of 4-token replies, the first 4 train and 5 held-out tasks (the
    # hand-written ones). Tool output capped at 24 tokens so that the cap is exercised (the SQL env's format-error
    # message is longer). The train step at the policy tokens only, as the toy presets' (`policy_positions`).
    "ci-sql": _miniature("ci-sql", "sql", max_context=448, eval_batch=20,
                         task_kw=dict(max_train_tasks=4, max_heldout_tasks=5), seeds=(0, 1), iterations=2,
                         policy_positions=True),
    # BFCL's system prompt alone is >= 2,031 tokens and the train step's cost grows with the context, so the
    # miniature keeps tasks whose prompt is <= 2,200 tokens (TradingBot scenarios) in 2,560 slots, and trains the
    # fewest steps that reach every stage: grpo (the findings' main arm) and gigpo (finding 7 compares them on BFCL),
    # 1 seed, 1 iteration of 2 episodes.
    # 1 train and 2 held-out tasks x 2 tiers x 2 samples in rollout batches of 2 (the training rollout's shape:
    # one set of compiles). Tool output capped at 24 tokens (BFCL's error responses are longer).
    "ci-bfcl": _miniature("ci-bfcl", "bfcl", max_context=2560, eval_batch=2,
                          task_kw=dict(max_train_tasks=1, max_heldout_tasks=2, max_system_tokens=2200),
                          arms=("grpo", "gigpo"), seeds=(0,), iterations=1),
    # Coding in 448 slots (as ci-sql) with 2 overlapping episode groups (the real code presets' setting) of 1 row
    # each; eval batches of 2, the training rollout's shape (one set of compiles). 1 arm, 1 seed, 1 iteration of 2
    # episodes; the first 2 train and 2 held-out tasks (hand-written). Test feedback capped at 24 tokens.
    "ci-code": _miniature("ci-code", "code", max_context=448, eval_batch=2,
                          task_kw=dict(max_train_tasks=2, max_heldout_tasks=2, overlap_groups=2),
                          arms=("grpo",), seeds=(0,), iterations=1),

    # ---------------------------------------------------------------- toy studies that learn on a CPU
    # SQL: the base imitates a noisy expert (docs/host_study.md, "Toy presets"): 3 rows per train task, each
    # slipping with probability 0.5 (`experts.sql.slip_query`) and, where its budget is 2 turns, checking first
    # with probability 0.5 (a query run, then the reference submitted). RL at 2e-4 with an exact KL term to the
    # base (0.5) over the pruned vocabulary, 2 epochs x 2 minibatches; every task of the structural held-out split
    # (426) and of "test_constants" (168), x 2 tiers x 4 samples.
    "sql-toy": _toy("sql-toy", "sql", t_max=2, max_action_tokens=64, max_context=640, heldout=None,
                    sft=HostSFTSettings(steps=1500, batch_size=16, lr=3e-3, noise=0.5, check=0.5, copies=3),
                    iterations=30, n_tasks=8, group_size=8, lr=2e-4, kl_coef=0.5, kl_estimator="exact", epochs=2,
                    minibatches=2),
    # Coding: the same recipe; the noisy expert's slip (`experts.code.slip_program`: a comparison turned around, an
    # integer one too large, min/max or any/all swapped) fails its first submission, and where the budget is 2
    # turns the expert then reads the test feedback and submits the reference half the time, the slipped program
    # again otherwise (`slip_fix`: an expert that always fixed its slip lost nothing to it at the training budget).
    # 2 turns of 128-token replies in 768 slots; SFT batches cut to their rows' slots in multiples of 128. RL as
    # sql-toy but 20 iterations: with 30, the training batches' success rose over the first 20 and not after
    # (docs/host_study.md). R_single (finding 6) of the base and after the last iteration only (480 one-turn episodes
    # each).
    "code-toy": _toy("code-toy", "code", t_max=2, max_action_tokens=128, max_context=768,
                     sft=HostSFTSettings(steps=1500, batch_size=16, lr=3e-3, noise=0.5, copies=3, slip_fix=0.5,
                                         width_bucket=128),
                     iterations=20, n_tasks=8, group_size=8, lr=2e-4, kl_coef=0.5, kl_estimator="exact", epochs=2,
                     minibatches=2, dynamics_every=20, task_kw=dict(overlap_groups=2)),
    # BFCL: the tasks cut to their first request, the tools as one-line signatures (domain bfcl-first, 470 / 155
    # tasks): prompts of about 250-750 tokens in 1,024 slots, where BFCL's JSON tool docs alone are 2,031-4,878
    # tokens. 3 turns (tiers 2, 3: the reference is the request's calls and a closing message); the noisy expert's
    # slip (`BFCLExpert.slipped_actions`: one call with a required argument left out) gets a schema error, after which
    # the expert sends the reference (half the time, `slip_fix`) or gives up. 128-token replies (longer reference
    # messages are left out of SFT); SFT batches cut to their rows' slots in multiples of 128 (rows of 200-950
    # slots); RL as sql-toy but 20 iterations (four train steps over ~900 slots take about 5 of the 7 s per
    # iteration: 30 min in all on 2 cores, docs/host_study.md); every held-out task.
    "bfcl-toy": _toy("bfcl-toy", "bfcl-first", t_max=3, max_context=1024, fractions=(0.5, 1.0), **_BFCL_TOY),
    # BFCL kept multi-turn: the first two user requests of every task (domain bfcl-two, 599 / 200 tasks), so the
    # second request works on the state the first left, miss_param's clarification can follow its request and
    # miss_func's late functions arrive; tools as signatures. 5 turns (the reference takes 3-4: per request its calls
    # and a closing message), tiers 4 and 5 (every reference fits the tight tier; a slip costs its one extra turn);
    # 1,536 slots (prompts of 250-750 tokens, four turns of 128-token replies and 64-token tool output). The same
    # base recipe and RL as bfcl-toy. Defined and rehearsed (`--rehearsal`), not yet run at full size: its base SFT
    # alone is over 40 minutes on 2 cores (docs/host_study.md, "Toy presets").
    "bfcl2-toy": _toy("bfcl2-toy", "bfcl-two", t_max=5, max_context=1536, fractions=(0.8, 1.0), **_BFCL_TOY),

    # ---------------------------------------------------------------- one 80 GB GPU, Qwen3-0.6B
    # 64 episodes per iteration (8 tasks x 8): KV cache 64 x 4,096 slots = 28 GiB, as the FrozenLake 0.6B preset's
    # 128 x 2,048, in 2 episode groups of 32 (the AOT check: one append over all 64 rows needs 67.5 GiB, 76 with the
    # train state and the base beside it; over 32 rows 25 GiB). 200 held-out tasks x 4 tiers x 8 samples.
    "qwen3-0.6b-1gpu-sql": _gpu_0_6b(
        "qwen3-0.6b-1gpu-sql", HostTaskSettings(**_SQL, **_HELDOUT, workers=8, overlap_groups=2),
        HostEvalSettings(**_EVAL_200, batch_size=64), iterations=100, n_tasks=8),
    # 16 episodes per iteration (2 tasks x 8) for 200 iterations (3,200 training episodes, as SQL's and coding's 64
    # x 100 would be 6,400): KV cache 16 x 12,288 slots = 21 GiB. At 32 episodes the rollout's programs do not fit
    # 80 GB (docs/aot.md: the widest append holds the 42 GiB cache and 24 GiB of attention scores, 90 GiB in all).
    # Evaluation: 48 held-out tasks spread over the 4 categories (12 each) x 4 tiers x 8 samples (K up to 8), 1,536
    # episodes per policy in batches of 16 (the training rollout's programs).
    "qwen3-0.6b-1gpu-bfcl": _gpu_0_6b(
        "qwen3-0.6b-1gpu-bfcl",
        HostTaskSettings(**_BFCL, max_context=12288, max_heldout_tasks=48, task_subset="spread", workers=8),
        HostEvalSettings(n_samples=8, ks=(1, 2, 4, 8), batch_size=16), iterations=200, n_tasks=2),
    # 64 episodes per iteration (8 train tasks x 8): KV cache 64 x 4,096 slots = 28 GiB. 200 held-out tasks x 4 tiers
    # x 8 samples. One thread per core for the sandboxed test runs.
    "qwen3-0.6b-1gpu-code": _gpu_0_6b(
        "qwen3-0.6b-1gpu-code", HostTaskSettings(**_CODE, **_HELDOUT),
        HostEvalSettings(**_EVAL_200, batch_size=64), iterations=100, n_tasks=8),

    # ---------------------------------------------------------------- v5p pod slice, Qwen3-8B
    # 256 episodes per iteration (32 tasks x 8), 8 per batch shard: KV cache per chip 8 x 16,384 slots x 72 KiB
    # = 9 GiB; the train step's 8 micro-batches hold one 16,384-token row per shard. Every held-out task (200) x 4
    # tiers x 16 samples in batches of 256.
    "qwen3-8b-v5p-bfcl": _pod_8b(
        "qwen3-8b-v5p-bfcl", HostTaskSettings(**_BFCL, max_context=16384, workers=32),
        HostEvalSettings(n_samples=16, ks=(1, 2, 4, 8, 16), batch_size=256), n_tasks=32, micro_batches=8),
    # 128 episodes per iteration (16 tasks x 8), 4 per batch shard: KV cache per chip 4 x 4,096 x 72 KiB = 1.1 GiB;
    # 4 micro-batches of one row per shard. 200 held-out tasks x 4 tiers x 8 samples. Each host steps the envs of its
    # own episodes (`host_schedule.episode_owners`).
    "qwen3-8b-v5p-sql": _pod_8b(
        "qwen3-8b-v5p-sql", HostTaskSettings(**_SQL, **_HELDOUT, workers=16),
        HostEvalSettings(**_EVAL_200, batch_size=128), n_tasks=16, micro_batches=4),
    # 128 episodes per iteration (16 tasks x 8), in 2 overlapping groups; 4 micro-batches of one row per shard. 200
    # held-out tasks x 4 tiers x 8 samples. One thread per core of each host for its episodes' sandboxed test runs.
    "qwen3-8b-v5p-code": _pod_8b(
        "qwen3-8b-v5p-code", HostTaskSettings(**_CODE, **_HELDOUT),
        HostEvalSettings(**_EVAL_200, batch_size=128), n_tasks=16, micro_batches=4),
}
