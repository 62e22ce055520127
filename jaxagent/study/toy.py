"""The toy world of the CPU study: the project's word-level tokenizer, FrozenLake and its chat layout.

A tiny Qwen3 trained from scratch stands in for a pretrained base model: supervised learning on a
noisy expert's trajectories gives a policy that knows the format and plays reasonably but makes
(and sometimes recovers from) mistakes, which is the regime the study's questions are about.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from jaxagent.envs.jax.budgets import BudgetFormat
from jaxagent.envs.jax.experts import NoisyExpert
from jaxagent.envs.jax.frozenlake import FrozenLake, FrozenLakeParams
from jaxagent.envs.jax.text_codec import TextCodec
from jaxagent.models.tokenizer import Tokenizer, build_word_tokenizer
from jaxagent.rollout import ChatLayout, RolloutConfig, budget_format, chat_layout, env_codec, rollout
from jaxagent.rollout.types import Rollout
from jaxagent.study.plan_mode import PLAN_WORDS


@dataclasses.dataclass(frozen=True, eq=False)
class ToyWorld:
    tokenizer: Tokenizer
    codec: TextCodec
    env: FrozenLake
    layout: ChatLayout
    fmt: BudgetFormat


# A short system prompt (words of FrozenLake's vocabulary): every token of context costs CPU time.
TOY_SYSTEM_PROMPT = ("Reach the goal G without falling into a hole H . P is you . The budget says how many "
                     "turns are left . Answer with exactly one move in the format <answer>Left</answer> .")


def _has_words(tok: Tokenizer, words) -> bool:
    try:
        for w in words:
            tok.token_id(w)
    except ValueError:
        return False
    return True


def toy_vocabulary() -> tuple[str, ...]:
    """The toy tokenizer's words: FrozenLake's (observations, messages, system prompt, actions, budget text),
    then the plan instruction's (`plan_mode.PLAN_INSTRUCTION`) not already among them."""
    return tuple(dict.fromkeys(FrozenLake.vocabulary() + PLAN_WORDS))


def make_toy_world(tokenizer_dir: str | os.PathLike, size: int = 4, system_prompt: str = TOY_SYSTEM_PROMPT,
                   enable_thinking: bool = True) -> ToyWorld:
    """Builds (or reloads) the word-level tokenizer in `tokenizer_dir` and the FrozenLake env on it.

    The vocabulary is `toy_vocabulary()`: FrozenLake's words and the plan-mode instruction's
    (`plan_mode.PLAN_WORDS`). A stored tokenizer lacking any of them (written for an older vocabulary) is
    rebuilt: the file is a cache of that function; a model trained on the older one no longer matches the
    run's vocabulary size, which the run's settings check reports.
    `enable_thinking=True` only means the layout inserts no empty think block before each reply
    (six tokens a turn saved); the toy policy learns to answer directly.
    """
    words = toy_vocabulary()
    tok = None
    if os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
        tok = Tokenizer.from_dir(tokenizer_dir)
        if not _has_words(tok, words):
            tok = None
    if tok is None:
        tok = build_word_tokenizer(words, tokenizer_dir)
    codec = env_codec(tok, words, FrozenLake.ACTION_STRINGS, word_level=True)
    unknown = [w for w in system_prompt.split() if w not in words]
    if unknown:
        raise ValueError(f"system prompt words outside the env vocabulary: {unknown}")
    layout = chat_layout(tok, system_prompt, enable_thinking=enable_thinking)
    return ToyWorld(tok, codec, FrozenLake(codec, size=size), layout, budget_format(codec))


def expert_rollouts(world: ToyWorld, tasks, budgets, key, env_params: FrozenLakeParams, *, epsilon: float,
                    t_max: int, max_action_tokens: int, max_context: int) -> Rollout:
    """Trajectories of the epsilon-noisy budget-aware expert in the exact chat layout the policy sees;
    `policy_mask` marks the expert's replies (the SFT targets). No model is run."""
    rcfg = RolloutConfig(t_max=t_max, max_action_tokens=max_action_tokens, max_context=max_context,
                         expert_fn=NoisyExpert(epsilon))
    return rollout(_no_params(), None, world.env, world.layout, world.fmt, tasks, budgets, key, env_params, rcfg)


def _no_params():
    """Placeholder params for scripted rollouts (the model is never called)."""
    return {"unused": np.zeros((), np.float32)}
