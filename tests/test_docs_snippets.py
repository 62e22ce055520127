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
    from jaxagent.models import tiny_checkpoint as write

    path = tmp_path_factory.mktemp("qwen3-tiny")
    write(path, API_WORDS)
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


EXAMPLE_SECTIONS = ("## The environment", "## Training it")   # the page's example: at most 40 lines (the README's)


def section_blocks(path: Path, heading: str) -> list[str]:
    """The python blocks of one `## ` section of a page."""
    text = path.read_text()
    body = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```", body, flags=re.S | re.M)


def test_custom_env_example_is_40_lines():
    lines = [ln for h in EXAMPLE_SECTIONS for b in section_blocks(DOCS / "custom_env.md", h) for ln in b.splitlines()
             if ln.strip()]
    assert 30 < len(lines) <= 40, len(lines)


@pytest.fixture(scope="module")
def custom_env_page():
    """The page run as one script; `import gymnax` finds the real package when installed, else the stand-in of
    tests/fake_gymnax.py (gymnax is no dependency)."""
    import sys

    from tests import fake_gymnax
    saved = sys.modules.get("gymnax")
    sys.modules["gymnax"] = fake_gymnax.module()
    try:
        return run_page("custom_env.md")
    finally:
        if saved is None:
            sys.modules.pop("gymnax", None)
        else:
            sys.modules["gymnax"] = saved


@pytest.mark.slow  # ~60 s on 2 busy cores with its fixture: a training run with evaluation, a gigpo iteration, Catch
def test_custom_env_page_trains_and_evaluates(custom_env_page):
    ns = custom_env_page
    result, out = ns["result"], ns["out"]
    assert [m["iteration"] for m in result.history] == [0, 1]
    first, last = result.history
    # the first update: ratio 1 and zero-mean group advantages, so the loss is 0 while the gradient need not be
    assert abs(first["loss"]) < 1e-6 and first["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert set(first) >= {"zero_advantage_groups", "zero_gradient_updates", "success_rate", "grad_norm"}
    assert (first["grad_norm"] == 0) == (first["zero_gradient_updates"] == 1)
    # Pass@(K,T) after the last iteration only (eval_every 10 > 2 iterations): tiers 1..4, k 1 and 2
    assert sorted(k for k in last if k.startswith("eval/")) == sorted(
        f"eval/pass@{k}/T={t}" for k in (1, 2) for t in (1, 2, 3, 4))
    assert not any(k.startswith("eval/") for k in first)
    assert all(last[f"eval/pass@1/T={t}"] <= last[f"eval/pass@2/T={t}"] + 1e-9 for t in (1, 2, 3, 4))
    # the log: one line per iteration, a warning line for each iteration whose updates all had a zero gradient
    import json
    rows = [json.loads(line) for line in open(f"{out}/metrics.jsonl")]
    assert [r["step"] for r in rows if "warning" not in r] == [0, 1]
    zero = [r["step"] for r in rows if r.get("zero_gradient_updates") == 1.0]
    assert [r["step"] for r in rows if "warning" in r] == zero
    assert ns["longer"].rl.budget_mode == "budgetmix" and ns["longer"].training_settings() != config_settings(ns)
    # the tasks: start and goal 1 to 3 apart, never equal (an episode done at reset would succeed for free)
    tasks = np.asarray(ns["sample_tasks"](jax.random.key(5), 256))
    assert ((tasks[:, 1] - tasks[:, 0] >= 1) & (tasks[:, 1] - tasks[:, 0] <= 3) & (tasks[:, 1] <= 9)).all()


@pytest.mark.slow  # shares the page's fixture
def test_custom_env_step_rules(custom_env_page):
    """The page's env on hand-written replies: a move each way, the goal, an invalid reply, a finished episode,
    the observation that shows the state, and the anchor of the state before the step."""
    ns = custom_env_page
    env, codec = ns["NumberLine"](ns["text"].codec), ns["text"].codec
    state, obs = env.reset(None, np.asarray([3, 5]), None)
    answer = lambda d: np.asarray(codec.action_tokens_AxPa[d])  # noqa: E731
    words = lambda o: " ".join(codec.words[int(np.argmax(np.asarray(codec.table_WxWt)[:, 0] == t))]  # noqa: E731
                               for t in np.asarray(o.tokens)[:int(o.length)])
    assert words(obs) == "at 3 goal 5 ."
    right = env.step(state, answer(1), 1, None)
    assert words(right.obs) == "at 4 goal 5 ." and float(right.reward) == 0 and not bool(right.done)
    assert int(right.info["anchor"]) == 35 and int(env.anchor(right.state)) == 45   # the state before the step
    assert words(env.step(state, answer(0), 1, None).obs) == "at 2 goal 5 ."
    bad = env.step(state, np.asarray([0, 0, 0]), 3, None)
    assert words(bad.obs) == "at 3 goal 5 ." and not bool(bad.info["valid"]) and int(bad.info["action"]) == -1
    hit = env.step(right.state, answer(1), 1, None)
    assert float(hit.reward) == 1 and bool(hit.done) and bool(hit.info["success"])
    again = env.step(hit.state, answer(0), 1, None)
    assert float(again.reward) == 0 and bool(again.done) and words(again.obs) == "at 5 goal 5 ."


def config_settings(ns):
    return ns["config"].training_settings()


@pytest.mark.slow  # shares the page's fixture
def test_custom_env_gymnax_block(custom_env_page):
    """The Catch episodes: every observation says where the ball and the paddle are, 3 turns, not finished (the ball
    needs 9 steps to land), so no reward."""
    ns = custom_env_page
    ro, tok = ns["c_ro"], ns["c_text"].tokenizer
    text = tok.decode(np.asarray(ro.tokens[0, :int(ro.length[0])]).tolist())
    assert len(re.findall(r"turns? left \. ball [0-4] paddle [0-4] \.", text)) == int(ro.turns_used[0]) == 3
    assert not np.asarray(ro.success).any() and float(np.abs(np.asarray(ro.turns.reward)).sum()) == 0.0
