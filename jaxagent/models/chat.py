"""The Qwen3 chat format as token ids, written without the jinja template (`format_chat`, `turn_pieces`).

Dimension legend: T tokens (ids and masks are plain Python lists of length T; nothing here is jitted).

Rendered layout (Qwen3's chat template; `format_chat` reproduces its ids exactly):
  system <|im_start|>system\\n{content}<|im_end|>\\n   (with `tools`: + the tools as JSON in <tools></tools>)
  user   <|im_start|>user\\n{content}<|im_end|>\\n     (consecutive `tool` messages share ONE user turn of
         <tool_response>\\n{c}\\n</tool_response> blocks)
  assistant <|im_start|>assistant\\n[<think>\\n{reasoning}\\n</think>\\n\\n]{content}[\\n]<tool_call>...<|im_end|>\\n
  gen. prompt <|im_start|>assistant\\n (+ <think>\\n\\n</think>\\n\\n when thinking is off).
Past reasoning (Qwen3's rule): assistant turns at or before the last real user query lose their think block;
`keep_past_thinking=True` keeps every one (the append-only context of a multi-turn rollout). Assistant mask (the
tokens RL trains on): each assistant message's content, tool calls and closing <|im_end|> (+ its think block when
`enable_thinking`), by character-span overlap as transformers' `return_assistant_tokens_mask`.
The layout, reasoning and mask rules in full: docs/host_rollout.md, "Qwen3's template as token ids".
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Sequence

from jaxagent.models.tokenizer import (IM_END, IM_START, THINK, THINK_END, TOOL_CALL, TOOL_CALL_END,
                                       TOOL_RESPONSE, TOOL_RESPONSE_END, Tokenizer)

ROLES = ("system", "user", "assistant", "tool")
EMPTY_THINK = f"{THINK}\n\n{THINK_END}\n\n"

# Qwen3's fixed instructions around the tool list; the model was trained on exactly this text.
_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and "
               "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
               '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _to_json(value: Any) -> str:
    """JSON the way the chat template's `tojson` filter writes it (non-ASCII kept, default separators)."""
    return json.dumps(value, ensure_ascii=False)


def _content(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""  # the template would fail on a missing content; an empty reply renders the same way
    if not isinstance(content, str):
        raise ValueError(f"message {index}: content must be a string, got {type(content).__name__} "
                         "(content-part lists are not supported)")
    return content


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if isinstance(messages, (str, Mapping)) or len(messages) == 0:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"message {i} must be a dict, got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise ValueError(f"message {i}: role must be one of {ROLES}, got {m.get('role')!r}")
        _content(m, i)
        if m.get("tool_calls") and m["role"] != "assistant":
            raise ValueError(f"message {i}: only assistant messages may carry tool_calls")


def _split_reasoning(message: Mapping[str, Any], index: int) -> tuple[str, str]:
    """(reasoning, content) of an assistant message, following Qwen3's template."""
    content = _content(message, index)
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise ValueError(f"message {index}: reasoning_content must be a string")
        return reasoning, content
    if THINK_END in content:
        head = content.split(THINK_END)[0].rstrip("\n")
        return head.split(THINK)[-1].lstrip("\n"), content.split(THINK_END)[-1].lstrip("\n")
    return "", content


def _tool_call_block(call: Mapping[str, Any], index: int) -> str:
    if not isinstance(call, Mapping):
        raise ValueError(f"message {index}: each tool call must be a dict with name and arguments")
    if "function" in call and call["function"] is not None:  # OpenAI shape {"type", "function": {...}}
        call = call["function"]
    name = call.get("name")
    if not isinstance(name, str):
        raise ValueError(f"message {index}: tool call needs a string 'name', got {name!r}")
    args = call.get("arguments", {})
    args_text = args if isinstance(args, str) else _to_json(args)  # strings are taken as ready JSON
    return f'{TOOL_CALL}\n{{"name": "{name}", "arguments": {args_text}}}\n{TOOL_CALL_END}'


def _is_tool_response_wrapper(text: str) -> bool:
    return text.startswith(TOOL_RESPONSE) and text.endswith(TOOL_RESPONSE_END)


def _system_text(content: str | None, tools: Sequence[Mapping[str, Any]] | None) -> str:
    """The opening system turn: the system content and/or the tool list ("" when neither)."""
    if tools:
        head = "" if content is None else content + "\n\n"
        tool_lines = "".join("\n" + _to_json(dict(t)) for t in tools)
        return f"{IM_START}system\n{head}{_TOOLS_HEAD}{tool_lines}{_TOOLS_TAIL}{IM_END}\n"
    return "" if content is None else f"{IM_START}system\n{content}{IM_END}\n"


def render_chat(messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                enable_thinking: bool = False, tools: Sequence[Mapping[str, Any]] | None = None,
                keep_past_thinking: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """The chat as text and the [start, end) character spans the assistant generated.

    Arguments as in `format_chat`; the layout and reasoning rules: docs/host_rollout.md, "Qwen3's template as
    token ids".
    """
    _check_messages(messages)
    if tools is not None and not all(isinstance(t, Mapping) for t in tools):
        raise ValueError("tools must be a list of JSON-schema dicts")
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = 0

    def emit(text: str, generated: bool = False) -> None:
        nonlocal pos
        if generated and text:
            if spans and spans[-1][1] == pos:
                spans[-1] = (spans[-1][0], pos + len(text))
            else:
                spans.append((pos, pos + len(text)))
        parts.append(text)
        pos += len(text)

    n = len(messages)
    emit(_system_text(_content(messages[0], 0) if messages[0]["role"] == "system" else None, tools))

    last_query = n - 1
    for i in range(n - 1, -1, -1):
        m = messages[i]
        if m["role"] == "user" and not _is_tool_response_wrapper(_content(m, i)):
            last_query = i
            break

    for i, m in enumerate(messages):
        role = m["role"]
        if role == "user" or (role == "system" and i > 0):
            emit(f"{IM_START}{role}\n{_content(m, i)}{IM_END}\n")
        elif role == "assistant":
            reasoning, content = _split_reasoning(m, i)
            emit(f"{IM_START}assistant\n")
            with_think = keep_past_thinking or (i > last_query and (i == n - 1 or bool(reasoning)))
            if with_think:
                body = reasoning.strip("\n")
                emit(f"{THINK}\n{body}\n{THINK_END}\n\n", generated=enable_thinking)
                emit(content.lstrip("\n"), generated=True)
            else:
                emit(content, generated=True)
            for j, call in enumerate(m.get("tool_calls") or ()):
                # A newline separates a call from the text (or call) before it.
                sep = "\n" if (j > 0 or content) else ""
                emit(sep + _tool_call_block(call, i), generated=True)
            emit(IM_END, generated=True)
            emit("\n")
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                emit(f"{IM_START}user")
            emit(f"\n{TOOL_RESPONSE}\n{_content(m, i)}\n{TOOL_RESPONSE_END}")
            if i == n - 1 or messages[i + 1]["role"] != "tool":
                emit(f"{IM_END}\n")
    if add_generation_prompt:
        emit(f"{IM_START}assistant\n" + ("" if enable_thinking else EMPTY_THINK))
    return "".join(parts), spans


def format_chat(tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True, enable_thinking: bool = False,
                tools: Sequence[Mapping[str, Any]] | None = None,
                keep_past_thinking: bool = False) -> tuple[list[int], list[bool]]:
    """Token ids of a conversation in Qwen3's chat format, and the assistant mask.

    messages: dicts with `role` in system/user/assistant/tool and a string `content`; assistant
      messages may carry `reasoning_content` and `tool_calls` (a list of {name, arguments} or OpenAI's
      {"function": {name, arguments}}; dict arguments are written as JSON, string ones verbatim).
    tools: JSON-schema dicts listed in the system turn.
    enable_thinking: False appends the empty think block to the generation prompt (Qwen3's
      "non-thinking mode"); it also decides whether think blocks count as generated in the mask.
    keep_past_thinking: False reproduces Qwen3's template (ids equal
      `apply_chat_template(..., enable_thinking=...)`); True keeps every assistant turn's think block,
      which equals what the append-only rollout built from `turn_pieces` holds.
    Returns (ids_T, assistant_mask_T); the mask rules: docs/host_rollout.md, "Qwen3's template as token ids".
    """
    text, spans = render_chat(messages, add_generation_prompt=add_generation_prompt,
                              enable_thinking=enable_thinking, tools=tools,
                              keep_past_thinking=keep_past_thinking)
    ids, offsets = tokenizer.encode_with_offsets(text)
    mask = [False] * len(ids)
    k = 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        mask[t] = end > spans[k][0]
    return ids, mask


@dataclasses.dataclass(frozen=True)
class TurnPieces:
    """Token ids of the fixed pieces a multi-turn rollout splices around env observations.

    An append-only conversation is built as
        prompt  = system_turn(...) + user_turn(task)           + generation_prompt
        turn k  : the model writes reply_k ending in <|im_end|>, then the rollout appends
                  after_reply + user_turn(obs_k) (or tool_turn(...)) + generation_prompt
    Every piece starts at a control token or ends right before one, so concatenating them gives the
    same ids as encoding the whole text at once; the result equals
    `format_chat(..., keep_past_thinking=True)` and, for the first prompt and single-reply chats,
    Qwen3's template. The split ids (`user_open` + encode(obs) + `user_close`) equal `user_turn(obs)`
    whenever obs does not start with whitespace.
    """

    system_open: tuple[int, ...]        # "<|im_start|>system\n"
    user_open: tuple[int, ...]          # "<|im_start|>user\n"
    user_close: tuple[int, ...]         # "<|im_end|>\n" (closes a system or user turn)
    generation_prompt: tuple[int, ...]  # "<|im_start|>assistant\n" (+ empty think block if thinking off)
    after_reply: tuple[int, ...]        # "\n": follows the <|im_end|> the model generated
    user_to_assistant: tuple[int, ...]  # user_close + generation_prompt
    reply_to_user: tuple[int, ...]      # after_reply + user_open
    empty_think: tuple[int, ...]        # "<think>\n\n</think>\n\n"
    stop_ids: tuple[int, ...]           # ids that end a reply (<|im_end|>, <|endoftext|>)


def turn_pieces(tokenizer: Tokenizer, enable_thinking: bool = False) -> TurnPieces:
    """The fixed chat pieces as ids for `tokenizer` (see `TurnPieces`)."""
    def enc(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text))

    gen = enc(f"{IM_START}assistant\n" + ("" if enable_thinking else EMPTY_THINK))
    user_close = enc(f"{IM_END}\n")
    after_reply = enc("\n")
    user_open = enc(f"{IM_START}user\n")
    return TurnPieces(system_open=enc(f"{IM_START}system\n"), user_open=user_open,
                      user_close=user_close, generation_prompt=gen, after_reply=after_reply,
                      user_to_assistant=user_close + gen, reply_to_user=after_reply + user_open,
                      empty_think=enc(EMPTY_THINK), stop_ids=tuple(tokenizer.eos_ids))


def system_turn(tokenizer: Tokenizer, content: str | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """Ids of the opening system turn (with the tool list when `tools`); [] when neither is given."""
    if tools is not None and not all(isinstance(t, Mapping) for t in tools):
        raise ValueError("tools must be a list of JSON-schema dicts")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"system content must be a string, got {type(content).__name__}")
    text = _system_text(content, tools)
    return tokenizer.encode(text) if text else []


def user_turn(tokenizer: Tokenizer, content: str) -> list[int]:
    """Ids of "<|im_start|>user\\n{content}<|im_end|>\\n", exactly as the template renders the turn."""
    text, _ = render_chat([{"role": "user", "content": content}], add_generation_prompt=False)
    return tokenizer.encode(text)


def tool_turn(tokenizer: Tokenizer, contents: Sequence[str]) -> list[int]:
    """Ids of the one user turn that carries the results of consecutive tool calls."""
    if isinstance(contents, str) or len(contents) == 0:
        raise ValueError("tool_turn takes a non-empty list of tool-result strings")
    text, _ = render_chat([{"role": "tool", "content": c} for c in contents],
                          add_generation_prompt=False)
    return tokenizer.encode(text)
