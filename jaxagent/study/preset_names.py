"""The study presets' names with a one-line description each, the arms, the bounds the command line checks and a
rehearsal's group size, in a module that imports nothing of ours: `--help` and usage errors read them without JAX or the
study. The preset modules read their descriptions from here (`frozenlake.presets.PRESET_NOTES`); tests check that
these names are the keys of `frozenlake.presets.PRESETS` and `host.presets.HOST_PRESETS`, and that the arms are
`stages.ARMS` and `host.stages.HOST_ARMS`.
"""
from __future__ import annotations

import math

_ACCELERATOR = "a real Qwen3 from --checkpoint; GPUs, TPU pods"

# Every FrozenLake preset (`frozenlake.presets.PRESETS`), in the order --help lists them. The toy ones say what
# they are and how long they take, as measured (the README's presets table says the same).
FROZENLAKE = {
    "quick": "the toy study, the README's; 30-33 min wall on a 2-core CPU beside other jobs, 1,200-1,300 s of "
             "CPU time (docs/study.md, Results on two seed sets)",
    "standard": "the toy study sized for power (5 seeds), a 2-core CPU: about 3x quick's training and 4x its "
                "evaluation (not yet timed at T_max 8)",
    "full": "5x5 maps, 200 iterations, hours on a CPU",
    "ci": "the test suite's plumbing check of every stage: minutes, 70 s of CPU time on a 2-core CPU",
    "qwen3-0.6b-1gpu": _ACCELERATOR,
    "qwen3-4b-8gpu": _ACCELERATOR,
    "qwen3-8b-v5p": _ACCELERATOR,
}

_CI = "a minutes-long plumbing check on a tiny random Qwen3 with the real tokenizer"
_TOY = ("a toy study that learns on a 2-core CPU: a toy Qwen3 fine-tuned on a noisy expert, then RL "
        "(docs/host_study.md, Toy presets)")
_GPU = "Qwen3-0.6B from --checkpoint on one 80 GB GPU"
_POD = "Qwen3-8B from --checkpoint on a v5p-128 pod slice (--distributed)"

# Every host-domain preset (`host.presets.HOST_PRESETS`), in the order --help lists them.
HOST = {
    "ci-sql": _CI, "ci-bfcl": _CI, "ci-code": _CI,
    "sql-toy": _TOY, "code-toy": _TOY, "bfcl-toy": _TOY, "bfcl2-toy": _TOY,
    "qwen3-0.6b-1gpu-sql": _GPU, "qwen3-0.6b-1gpu-bfcl": _GPU, "qwen3-0.6b-1gpu-code": _GPU,
    "qwen3-8b-v5p-sql": _POD, "qwen3-8b-v5p-bfcl": _POD, "qwen3-8b-v5p-code": _POD,
}
HOST_SFT = ("sql-toy", "code-toy", "bfcl-toy", "bfcl2-toy")   # the host presets whose base is an SFT (`sft`)

ARMS = ("grpo", "budgetmix", "gigpo", "ppo", "grpo_oracle", "grpo_tight", "grpo_oracle_tight")   # `stages.ARMS`
HOST_ARMS = ("grpo", "budgetmix", "gigpo")                    # `host.stages.HOST_ARMS`
SWEEP_GRIDS = ("recipe", "kl", "base")   # `frozenlake.sweep.GRIDS` (RL recipes) and `BASE_GRIDS` (the base SFT)

BASE_SEED = 1000                      # PRNG key of the base SFT (plus the run's seed offset)
MAX_SEED = 2**31 - 1                  # seeds (offset included) are int32 PRNG seeds
MAX_ITERATIONS = 10**6                # the data position (iterations x tasks) is an int32


def describe(notes: dict) -> str:
    """'a (note a); b, c (their shared note)': the names in order, those with the same note as one group."""
    groups: dict = {}
    for name, note in notes.items():
        groups.setdefault(note, []).append(name)
    return "; ".join(f"{', '.join(names)} ({note})" for note, names in groups.items())


def rehearsal_group(mesh) -> int:
    """A rehearsal's rollouts for its one task on `mesh` (data, fsdp, tensor): the least even multiple of the batch
    shards (data x fsdp), so its one micro-batch splits over them (2 on one device)."""
    return math.lcm(2, int(mesh[0]) * int(mesh[1]))
