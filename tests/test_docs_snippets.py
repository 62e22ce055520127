"""The ```python blocks of docs/api.md and docs/custom_env.md run top to bottom as one script per page, and what
they compute is checked. A tiny random Qwen3 checkpoint with a word-level tokenizer over the page's words
stands in for "/path/to/Qwen3-0.6B" (the real tokenizer's 152k-row vocabulary makes every program of the page
~8x slower to compile and run here; the real tokenizer's chat path is tested in tests/test_chat.py)."""
import re
from pathlib import Path

import jax
import numpy as np
import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
CKPT_PLACEHOLDER = "/path/to/Qwen3-0.6B"
API_WORDS = ("What", "is", "2", "+", "2?", "3", "5?", "4", "8")  # the words of docs/api.md's chat messages


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def run_page(name: str, replace: dict[str, str] = ()) -> dict:
    """Executes the page's blocks in order in one namespace; a failing block is named in the error."""
    blocks = python_blocks(DOCS / name)
    assert blocks, f"docs/{name} has no python blocks"
    ns = {"__name__": f"docs_{name.replace('.', '_')}"}
    for i, code in enumerate(blocks):
        for old, new in dict(replace).items():
            code = code.replace(old, new)
        exec(compile(code, f"docs/{name}, block {i + 1}", "exec"), ns)  # noqa: S102 -- our own docs
    return ns


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A random Qwen3 (config.json + model.safetensors) and its tokenizer files, as a checkpoint directory."""
    from jaxagent.models import Qwen3Config, build_word_tokenizer, init, save

    path = tmp_path_factory.mktemp("qwen3-tiny")
    tok = build_word_tokenizer(API_WORDS, path)
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    save(path, cfg, init(cfg, jax.random.key(0)))
    return path


@pytest.mark.slow  # ~40 s on 2 busy cores: the page compiles forward, generate (3 ways), a GRPO step
def test_api_page_runs(tiny_checkpoint):
    text = (DOCS / "api.md").read_text()
    assert CKPT_PLACEHOLDER in text
    ns = run_page("api.md", {CKPT_PLACEHOLDER: str(tiny_checkpoint)})
    # the params were placed on the mesh, FSDP-sharded over all devices
    assert ns["mesh"].shape["fsdp"] == jax.device_count()
    assert len(ns["params"]["embed"].sharding.device_set) == jax.device_count()
    # the RL step moved the params and its loss is the GRPO loss of what was sampled
    loss, aux = ns["loss"], ns["aux"]
    assert np.isfinite(float(loss)) and np.asarray(aux["advantages_PxG"]).shape == (2, 4)
    assert float(aux["ratio_mean"]) == pytest.approx(1.0, abs=1e-4)  # first step: pi_theta = pi_old
    # Pass@k rises with k at every budget; the truncated grid is a valid probability table
    grid = np.asarray(ns["grid_UxJ"])
    assert grid.shape == (3, 3) and (np.diff(grid, axis=1) >= -1e-6).all() and (np.diff(grid[:, 0]) > 0).all()
    assert ((0 <= np.asarray(ns["grid_truncated_UxJ"])) & (np.asarray(ns["grid_truncated_UxJ"]) <= 1)).all()


@pytest.fixture(scope="module")
def custom_env_page():
    return run_page("custom_env.md")


@pytest.mark.slow  # ~40 s on 2 busy cores with its fixture: a rollout, another batch size, the train step
def test_custom_env_page_runs(custom_env_page):
    ns = custom_env_page
    tok, ro = ns["text"].tokenizer, ns["ro"]
    first = tok.decode(np.asarray(ns["run"](ns["params"], np.asarray([3]), np.asarray([3]),
                                            jax.random.key(1)).tokens[0]).tolist())
    assert "Turn 1 of 3 . 3 turns left . Guess my number .<|im_end|>" in first
    metrics = ns["metrics"]
    assert np.isfinite(metrics["loss"]) and 0 <= metrics["success_rate"] <= 1 and metrics["tokens"] > 0
    assert ro.tokens.shape[0] == 8  # n_tasks x group_size episodes
    # the iteration updated the policy
    before, after = np.asarray(ns["params"]["embed"]), np.asarray(ns["state"].params["embed"])
    assert np.abs(after - before).max() > 0


@pytest.mark.slow  # shares the page's fixture
def test_custom_env_step_rules(custom_env_page):
    """The page's env on hand-written replies: higher / lower / correct, an invalid reply, a finished episode."""
    env, codec = custom_env_page["env"], custom_env_page["text"].codec
    state, obs = env.reset(None, 5, None)
    answer = lambda d: np.asarray(codec.action_tokens_AxPa[d])  # noqa: E731
    words = lambda o: " ".join(codec.words[int(np.argmax(np.asarray(codec.table_WxWt)[:, 0] == t))]  # noqa: E731
                               for t in np.asarray(o.tokens)[:int(o.length)])
    out = env.step(state, answer(2), 1, None)
    assert words(out.obs) == "higher ." and float(out.reward) == 0 and not bool(out.done)
    assert int(out.info["action"]) == 2
    assert words(env.step(state, answer(9), 1, None).obs) == "lower ."
    bad = env.step(state, np.asarray([0, 0, 0]), 3, None)
    assert words(bad.obs) == "invalid ." and not bool(bad.info["valid"]) and int(bad.info["action"]) == -1
    hit = env.step(state, answer(5), 1, None)
    assert words(hit.obs) == "correct ." and float(hit.reward) == 1 and bool(hit.done) and bool(hit.info["success"])
    again = env.step(hit.state, answer(5), 1, None)
    assert float(again.reward) == 0 and bool(again.done)
