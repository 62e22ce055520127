"""The chat layout of a multi-turn episode as token ids, built once on the host.

An episode's context is Qwen3's chat format, append-only so the KV cache is reused across turns:

    <|im_start|>system\\n{rules}<|im_end|>\\n                              (shared prefix, prefilled once)
    <|im_start|>user\\n{budget text} {observation}<|im_end|>\\n<|im_start|>assistant\\n[empty think]
    {reply_0 ... <|im_end|>}
    \\n<|im_start|>user\\n{budget text} {observation}<|im_end|>\\n<|im_start|>assistant\\n[empty think]
    {reply_1 ... <|im_end|>} ...

Past turns keep their (empty) think block, as `chat.format_chat(..., keep_past_thinking=True)` renders.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxagent.envs.jax.budgets import BudgetFormat
from jaxagent.envs.jax.text_codec import TextCodec, make_codec
from jaxagent.models import chat
from jaxagent.models.tokenizer import Tokenizer


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
    def open_width(self) -> int:
        return max(len(self.first_open), len(self.next_open))

    def pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(open pieces int32[2, W] padded, their lengths int32[2], close int32[C])."""
        w = self.open_width
        arr = np.full((2, w), self.pad_id, np.int32)
        arr[0, :len(self.first_open)] = self.first_open
        arr[1, :len(self.next_open)] = self.next_open
        return arr, np.asarray([len(self.first_open), len(self.next_open)], np.int32), np.asarray(self.close, np.int32)


def chat_layout(tokenizer: Tokenizer, system_prompt: str, *, enable_thinking: bool = False) -> ChatLayout:
    pieces = chat.turn_pieces(tokenizer, enable_thinking=enable_thinking)
    return ChatLayout(system=tuple(chat.system_turn(tokenizer, system_prompt)), first_open=pieces.user_open,
                      next_open=pieces.reply_to_user, close=pieces.user_to_assistant,
                      stop_ids=pieces.stop_ids, pad_id=tokenizer.pad_id)


def env_codec(tokenizer: Tokenizer, words, actions, *, word_level: bool) -> TextCodec:
    """The env's word table for `tokenizer`: one token per word for the project's word-level
    tokenizer; " word" BPE pieces (and both spacings of each action) for a real Qwen3 tokenizer."""
    if word_level:
        return make_codec(words, tokenizer.encode, tokenizer.pad_id, actions)
    return make_codec(words, tokenizer.encode, tokenizer.pad_id, actions, word_prefix=" ",
                      action_prefixes=("", " "))


def budget_format(codec: TextCodec, template=None) -> BudgetFormat:
    return BudgetFormat.from_codec(codec) if template is None else BudgetFormat.from_codec(codec, template)
