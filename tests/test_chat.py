"""Tests for jaxagent.models.chat: parity with Qwen3's real chat template, masks, rollout pieces."""
import pytest

from jaxagent.models.chat import (EMPTY_THINK, format_chat, render_chat, system_turn, tool_turn,
                                  turn_pieces, user_turn)
from jaxagent.models.tokenizer import Tokenizer, build_word_tokenizer, qwen3_tokenizer_dir


@pytest.fixture(scope="module")
def qwen():
    return Tokenizer.from_dir(qwen3_tokenizer_dir())


@pytest.fixture(scope="module")
def word_tok(tmp_path_factory):
    words = ["<answer>", "</answer>", "Left", "Right", "you", "are", "on", "ice", ".", "Moved", "go"]
    return build_word_tokenizer(words, tmp_path_factory.mktemp("chat_wordtok"))


TOOLS = [
    {"type": "function", "function": {
        "name": "move", "description": "Move one step — on the lake",
        "parameters": {"type": "object", "properties": {
            "direction": {"type": "string", "enum": ["Left", "Right", "Up", "Down"]},
            "steps": {"type": "integer"}}, "required": ["direction"]}}},
    {"type": "function", "function": {"name": "look", "description": "Describe the cell",
                                      "parameters": {"type": "object", "properties": {}}}},
]

CONVERSATIONS = {
    "system_user": [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "Where is the goal?"}],
    "user_only_unicode": [{"role": "user", "content": "Héllo 世界 — go\n\nnow"}],
    "multi_turn": [
        {"role": "system", "content": "Play FrozenLake."},
        {"role": "user", "content": "S F\nF G"},
        {"role": "assistant", "content": "<answer>Right</answer>"},
        {"role": "user", "content": "reward: 0. state:\nF S\nF G"},
        {"role": "assistant", "content": "<answer>Down</answer>"}],
    "reasoning_in_content": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "times 3?"},
        {"role": "assistant", "content": "<think>\n12 because 4*3\n</think>\n\n12"}],
    "reasoning_content_field": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "calling", "reasoning_content": "\nneed the tool\n",
         "tool_calls": [{"name": "look", "arguments": {}}]},
        {"role": "tool", "content": "a frozen lake"},
        {"role": "assistant", "content": "It is a lake."}],
    "tool_calls": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Move left twice then look."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"name": "move", "arguments": {"direction": "Left", "steps": 2, "note": "é \"q\""}},
            {"type": "function", "function": {"name": "look", "arguments": "{\"verbose\": true}"}}]},
        {"role": "tool", "content": "{\"ok\": true, \"pos\": [0, 1]}"},
        {"role": "tool", "content": "You see ice."},
        {"role": "assistant", "content": "Done: ice.", "tool_calls": [
            {"name": "move", "arguments": {"direction": "Up"}}]},
        {"role": "tool", "content": "}\n"}],
    "tool_response_as_user": [
        {"role": "user", "content": "start"},
        {"role": "assistant", "content": "<think>\nplan\n</think>\n\nstep one",
         "tool_calls": [{"name": "look", "arguments": {}}]},
        {"role": "user", "content": "<tool_response>\nice\n</tool_response>"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n\nstep two"}],
    "late_system_and_whitespace": [
        {"role": "system", "content": "first"},
        {"role": "user", "content": "  leading spaces"},
        {"role": "assistant", "content": "\n\nreply with newlines\n"},
        {"role": "system", "content": "second system"},
        {"role": "user", "content": "again\n"}],
}


def _hf_ids(tok, messages, **kw):
    out = tok.hf.apply_chat_template(messages, tokenize=True, **kw)
    return list(out["input_ids"])  # transformers 5 returns a BatchEncoding by default


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_ids_equal_qwen3_template(qwen, name):
    messages = CONVERSATIONS[name]
    n_checked = 0
    for thinking in (False, True):
        for gen_prompt in (False, True):
            for tools in (None, TOOLS):
                kw = dict(add_generation_prompt=gen_prompt, enable_thinking=thinking, tools=tools)
                ref_text = qwen.hf.apply_chat_template(messages, tokenize=False, **kw)
                text, _ = render_chat(messages, **kw)
                assert text == ref_text, (thinking, gen_prompt, tools is not None)
                ids, mask = format_chat(qwen, messages, **kw)
                assert ids == _hf_ids(qwen, messages, **kw), (thinking, gen_prompt, tools is not None)
                assert len(mask) == len(ids)
                n_checked += 1
    assert n_checked == 8


def _masked_runs(ids, mask):
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def test_mask_is_content_plus_im_end_thinking_off(qwen):
    messages = CONVERSATIONS["multi_turn"]
    ids, mask = format_chat(qwen, messages, add_generation_prompt=False, enable_thinking=False)
    runs = _masked_runs(ids, mask)
    assert runs == [qwen.encode("<answer>Right</answer>") + [qwen.im_end_id],
                    qwen.encode("<answer>Down</answer>") + [qwen.im_end_id]]
    # The last reply gets the (prompt-side) empty think block right before its masked content.
    start = len(ids) - len(runs[1]) - 1
    assert ids[start - 4:start] == qwen.encode(EMPTY_THINK) and not any(mask[start - 4:start])
    assert ids[-1] == qwen.encode("\n")[0] and not mask[-1]


def test_mask_includes_think_block_when_thinking(qwen):
    messages = CONVERSATIONS["reasoning_in_content"]
    ids, mask = format_chat(qwen, messages, add_generation_prompt=False, enable_thinking=True)
    runs = _masked_runs(ids, mask)
    # First reply is before the last query: its reasoning is dropped by the template.
    assert runs[0] == qwen.encode("4") + [qwen.im_end_id]
    assert runs[1] == qwen.encode("<think>\n12 because 4*3\n</think>\n\n12<|im_end|>")
    assert len(runs) == 2


def test_mask_tool_calls(qwen):
    messages = CONVERSATIONS["tool_calls"]
    ids, mask = format_chat(qwen, messages, add_generation_prompt=True, enable_thinking=False)
    runs = _masked_runs(ids, mask)
    call1 = ('<tool_call>\n{"name": "move", "arguments": {"direction": "Left", "steps": 2, '
             '"note": "é \\"q\\""}}\n</tool_call>\n<tool_call>\n{"name": "look", "arguments": '
             '{"verbose": true}}\n</tool_call><|im_end|>')
    call2 = 'Done: ice.\n<tool_call>\n{"name": "move", "arguments": {"direction": "Up"}}\n</tool_call><|im_end|>'
    assert runs == [qwen.encode(call1), qwen.encode(call2)]
    assert sum(mask) == len(runs[0]) + len(runs[1])
    # Nothing of the generation prompt (the last 7 tokens) is marked.
    assert ids[-7:] == qwen.encode("<|im_start|>assistant\n" + EMPTY_THINK) and not any(mask[-7:])


def test_mask_straddling_first_token(qwen):
    # "\n\n" + "\nx" merges into one "\n\n\n" token across the prompt/reply boundary; it counts.
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\nx"}]
    text, spans = render_chat(messages, add_generation_prompt=False, enable_thinking=False)
    assert text.endswith("</think>\n\nx<|im_end|>\n")  # the template lstrips the last reply
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": " x"}]
    ids, mask = format_chat(qwen, messages, add_generation_prompt=False, enable_thinking=False)
    assert _masked_runs(ids, mask) == [qwen.encode(" x<|im_end|>")]


def test_turn_pieces_values(qwen):
    off, on = turn_pieces(qwen, enable_thinking=False), turn_pieces(qwen, enable_thinking=True)
    assert off.user_open == (151644, 872, 198)
    assert off.system_open == (151644, 8948, 198)
    assert off.user_close == (151645, 198)
    assert on.generation_prompt == (151644, 77091, 198)
    assert off.generation_prompt == (151644, 77091, 198, 151667, 271, 151668, 271)
    assert off.user_to_assistant == off.user_close + off.generation_prompt
    assert off.reply_to_user == (198, 151644, 872, 198)
    assert off.stop_ids == (151645, 151643)


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_rollout_from_pieces(qwen, thinking, tools):
    """Append-only multi-turn build equals keep_past_thinking=True; its first prompt equals Qwen3's."""
    p = turn_pieces(qwen, enable_thinking=thinking)
    system, task = "Play FrozenLake.", "S F\nF G"
    observations = ["reward: 0.\nF S", "  indented obs\n"]
    replies = ["<answer>Right</answer>", "<answer>Down</answer>", "done"]
    reasonings = ["go right", "", "finish"]

    prompt = system_turn(qwen, system, tools) + user_turn(qwen, task) + list(p.generation_prompt)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    assert prompt == _hf_ids(qwen, messages, add_generation_prompt=True, enable_thinking=thinking,
                             tools=tools)
    ids = list(prompt)
    for k, reply in enumerate(replies):
        generated = reply if not thinking else f"<think>\n{reasonings[k]}\n</think>\n\n{reply}"
        ids += qwen.encode(generated) + [qwen.im_end_id]  # what the sampler wrote
        messages.append({"role": "assistant", "content": reply, "reasoning_content": reasonings[k]}
                        if thinking else {"role": "assistant", "content": reply})
        if k == 0:  # single reply: the append-only ids also equal Qwen3's template
            assert ids + list(p.after_reply) == _hf_ids(
                qwen, messages, add_generation_prompt=False, enable_thinking=thinking, tools=tools)
        if k < len(observations):
            ids += list(p.after_reply) + user_turn(qwen, observations[k]) + list(p.generation_prompt)
            messages.append({"role": "user", "content": observations[k]})
    ids += list(p.after_reply)
    ours, mask = format_chat(qwen, messages, add_generation_prompt=False, enable_thinking=thinking,
                             tools=tools, keep_past_thinking=True)
    assert ours == ids
    assert sum(mask) == sum(len(qwen.encode(r)) + 1 for r in replies) + (
        sum(len(qwen.encode(f"<think>\n{r}\n</think>\n\n")) for r in reasonings) if thinking else 0)
    # Qwen3's template instead drops past think blocks (thinking off: the two earlier empty blocks).
    template = _hf_ids(qwen, messages, add_generation_prompt=False, enable_thinking=thinking, tools=tools)
    if not thinking:
        assert len(ids) - len(template) == 2 * len(p.empty_think)
    else:
        assert len(template) < len(ids)


def test_tool_turn_and_split_pieces(qwen):
    p = turn_pieces(qwen)
    results = ['{"ok": true}', "}\n"]  # "}\n" merges with the template's "\n": needs whole-turn encoding
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [{"name": "look", "arguments": {}}]},
                *({"role": "tool", "content": r} for r in results)]
    full = _hf_ids(qwen, messages, add_generation_prompt=True, enable_thinking=False)
    tail = tool_turn(qwen, results) + list(p.generation_prompt)
    assert full[-len(tail):] == tail
    assert full[-len(tail) - 2:-len(tail)] == [qwen.im_end_id, p.after_reply[0]]
    # Encoding the result alone would differ: "}\n" + "\n" of the wrapper is one "}\n\n" token.
    split = (list(p.user_open) + [qwen.tool_response_id] + qwen.encode("\n" + results[0] + "\n")
             + [qwen.tool_response_end_id, qwen.tool_response_id] + qwen.encode("\n") + qwen.encode(results[1])
             + qwen.encode("\n") + [qwen.tool_response_end_id] + list(p.user_close))
    assert split != tool_turn(qwen, results)
    obs = "F S\nF G"
    assert user_turn(qwen, obs) == list(p.user_open) + qwen.encode(obs) + list(p.user_close)
    assert system_turn(qwen) == []
    assert system_turn(qwen, None, TOOLS) == _hf_ids(
        qwen, [{"role": "user", "content": "x"}], tools=TOOLS)[:-len(user_turn(qwen, "x"))]


def test_word_tokenizer_chat(word_tok):
    messages = [{"role": "system", "content": "you are on ice ."},
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "<answer> Left </answer>"},
                {"role": "user", "content": "Moved ."}]
    ids, mask = format_chat(word_tok, messages, add_generation_prompt=True, enable_thinking=False)
    text, _ = render_chat(messages, add_generation_prompt=True, enable_thinking=False)
    assert word_tok.decode(ids) == text
    pieces = ("<|im_start|> system \n you are on ice . <|im_end|> \n <|im_start|> user \n go <|im_end|> \n "
              "<|im_start|> assistant \n <answer> Left </answer> <|im_end|> \n <|im_start|> user \n Moved . "
              "<|im_end|> \n <|im_start|> assistant \n <think> \n \n </think> \n \n").split(" ")
    assert ids == [word_tok.token_id(t) for t in pieces]
    assert _masked_runs(ids, mask) == [[word_tok.token_id(t) for t in ("<answer>", "Left", "</answer>",
                                                                       "<|im_end|>")]]
    p = turn_pieces(word_tok)
    assert p.generation_prompt == tuple(word_tok.token_id(t) for t in pieces[-9:])
    assert ids[-len(p.user_to_assistant):] == list(p.user_to_assistant)


def test_bad_messages(qwen):
    with pytest.raises(ValueError, match="non-empty"):
        format_chat(qwen, [])
    with pytest.raises(ValueError, match="role"):
        format_chat(qwen, [{"role": "bot", "content": "x"}])
    with pytest.raises(ValueError, match="content must be a string"):
        format_chat(qwen, [{"role": "user", "content": [{"type": "text", "text": "x"}]}])
    with pytest.raises(ValueError, match="name"):
        format_chat(qwen, [{"role": "user", "content": "x"},
                           {"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]}])
    with pytest.raises(ValueError, match="tools"):
        format_chat(qwen, [{"role": "user", "content": "x"}], tools=["move"])
    with pytest.raises(ValueError, match="non-empty"):
        tool_turn(qwen, [])
