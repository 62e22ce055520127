"""The chat layout of a multi-turn episode as token ids, built once on the host.

An episode's context is Qwen3's chat format, append-only so the KV cache is reused across turns:

    <|im_start|>system\\n{rules}<|im_end|>\\n                              (shared prefix, prefilled once)
    <|im_start|>user\\n{budget text} {observation}<|im_end|>\\n<|im_start|>assistant\\n[empty think]
    {reply_0 ... <|im_end|>}
    \\n<|im_start|>user\\n{budget text} {observation}<|im_end|>\\n<|im_start|>assistant\\n[empty think]
    {reply_1 ... <|im_end|>} ...

Past turns keep their (empty) think block, as `chat.format_chat(..., keep_past_thinking=True)` renders.
A reply that did not end with <|im_end|> (it hit `max_action_tokens`) gets it at the head of the next
turn's chunk (`episode`, "Truncated replies").

`env_text` builds every text piece a jittable env's rollout needs (tokenizer, codec with the budget
words, layout, budget format) from the env's words, actions and system prompt.
"""
from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple, Optional, Sequence

import numpy as np

from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.envs.jax.budgets import BudgetFormat
from jaxagent.envs.jax.text_codec import TextCodec, make_codec
from jaxagent.models import chat
from jaxagent.models.tokenizer import Tokenizer, build_word_tokenizer


@dataclasses.dataclass(frozen=True)
class ChatLayout:
    """Static (hashable) token pieces of the episode layout."""

    system: tuple[int, ...]           # the shared system turn
    first_open: tuple[int, ...]       # opens the first user turn
    next_open: tuple[int, ...]        # after a reply's <|im_end|>: "\n<|im_start|>user\n"
    close: tuple[int, ...]            # "<|im_end|>\n<|im_start|>assistant\n" (+ empty think)
    stop_ids: tuple[int, ...]
    pad_id: int

    @property
    def end_of_turn(self) -> int:
        """<|im_end|>, the token that ends every chat message (the first stop id)."""
        return self.stop_ids[0]

    def _openers(self) -> tuple[tuple[int, ...], ...]:
        # turn 0; a later turn after a closed reply; after a truncated one (<|im_end|> first)
        return self.first_open, self.next_open, (self.end_of_turn,) + self.next_open

    @property
    def open_width(self) -> int:
        return max(len(p) for p in self._openers())

    def pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(openers int32[3, W] padded: turn 0, after a closed reply, after a truncated reply; their
        lengths int32[3]; close int32[C])."""
        openers = self._openers()
        arr = np.full((len(openers), self.open_width), self.pad_id, np.int32)
        for i, p in enumerate(openers):
            arr[i, :len(p)] = p
        return arr, np.asarray([len(p) for p in openers], np.int32), np.asarray(self.close, np.int32)


def chat_layout(tokenizer: Tokenizer, system_prompt: str, *, enable_thinking: bool = False) -> ChatLayout:
    pieces = chat.turn_pieces(tokenizer, enable_thinking=enable_thinking)
    return ChatLayout(system=tuple(chat.system_turn(tokenizer, system_prompt)), first_open=pieces.user_open,
                      next_open=pieces.reply_to_user, close=pieces.user_to_assistant,
                      stop_ids=pieces.stop_ids, pad_id=tokenizer.pad_id)


def env_codec(tokenizer: Tokenizer, words, actions, *, word_level: bool, budget_template=None) -> TextCodec:
    """The env's word table for `tokenizer`: one token per word for the project's word-level
    tokenizer; " word" BPE pieces (and both spacings of each action) for a real Qwen3 tokenizer.
    The budget text's words (`budgets.vocabulary(template)`: "Turn", "of", ".", ... and the digits) are
    added after `words` when missing, so `budget_format(codec)` always finds them."""
    words = tuple(dict.fromkeys(tuple(words) + budget_vocabulary(budget_template)))
    if word_level:
        return make_codec(words, tokenizer.encode, tokenizer.pad_id, actions)
    return make_codec(words, tokenizer.encode, tokenizer.pad_id, actions, word_prefix=" ",
                      action_prefixes=("", " "))


def budget_format(codec: TextCodec, template=None) -> BudgetFormat:
    return BudgetFormat.from_codec(codec) if template is None else BudgetFormat.from_codec(codec, template)


def budget_vocabulary(template=None) -> tuple[str, ...]:
    """The words a budget text with `template` (default the study's) can contain."""
    return budgets_lib.vocabulary() if template is None else budgets_lib.vocabulary(template)


class EnvText(NamedTuple):
    """The text pieces of a jittable env's rollout: `rollout(params, cfg, env, text.layout, text.fmt, ...)`
    with `env` built on `text.codec`."""

    tokenizer: Tokenizer
    codec: TextCodec
    layout: ChatLayout
    fmt: BudgetFormat


def env_text(words: Sequence[str], actions: Sequence[str], system_prompt: str, *,
             tokenizer: Optional[Tokenizer] = None, tokenizer_dir: Optional[str | os.PathLike] = None,
             word_level: Optional[bool] = None, enable_thinking: bool = False, budget_template=None) -> EnvText:
    """Tokenizer, codec, chat layout and budget format for an env whose observations use `words` and whose
    actions are the strings `actions` (action k = actions[k]).

    Without `tokenizer`, builds the project's word-level tokenizer into `tokenizer_dir` over the env's words,
    its actions, the system prompt's words and the budget text's words (`models.tokenizer.build_word_tokenizer`;
    a word is any whitespace-free string). With a real tokenizer (e.g. Qwen3's), pass it as `tokenizer`
    (`word_level` then defaults to False: words become " word" BPE pieces). The codec holds `words` plus the
    budget words (`env_codec`); `enable_thinking=False` puts Qwen3's empty think block before each reply."""
    if isinstance(words, str) or isinstance(actions, str):
        raise TypeError("env_text: words and actions must be sequences of strings, not one string")
    if not isinstance(system_prompt, str):
        raise TypeError(f"env_text: system_prompt must be a str, got {type(system_prompt).__name__}")
    if tokenizer is None:
        if tokenizer_dir is None:
            raise ValueError("env_text: give a tokenizer, or a tokenizer_dir to build the word-level one into")
        vocab = tuple(words) + tuple(actions) + tuple(system_prompt.split()) + budget_vocabulary(budget_template)
        tokenizer = build_word_tokenizer(tuple(dict.fromkeys(vocab)), tokenizer_dir)
        word_level = True if word_level is None else word_level
    codec = env_codec(tokenizer, words, actions, word_level=bool(word_level), budget_template=budget_template)
    return EnvText(tokenizer, codec, chat_layout(tokenizer, system_prompt, enable_thinking=enable_thinking),
                   budget_format(codec, budget_template))
