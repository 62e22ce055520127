"""Tests for jaxagent.envs.jax.budgets: tiers, BudgetMix sampling, validation, budget text."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from jaxagent.envs.jax import budgets as bd
from jaxagent.envs.jax.text_codec import make_codec, render


def test_budget_tiers_exact_ceil():
    assert bd.budget_tiers(10) == (3, 5, 8, 10)
    assert bd.budget_tiers(4) == (1, 2, 3, 4)
    assert bd.budget_tiers(1) == (1, 1, 1, 1)
    assert bd.budget_tiers(10, (0.3,)) == (3,)  # 0.3 * 10 is 3.0000000000000004 in floats
    assert bd.budget_tiers(10, (0.1, 0.7)) == (1, 7)  # Fraction(0.1) * 10 > 1 in binary
    assert bd.budget_tiers(3, (0.01,)) == (1,)  # max(1, .)
    assert bd.budget_tiers(7, ("1/3",)) == (3,)


@pytest.mark.parametrize("bad", [0, -1, 1000, 2.5, True])
def test_budget_tiers_rejects_bad_t_max(bad):
    with pytest.raises(ValueError, match="t_max"):
        bd.budget_tiers(bad)


def test_budget_tiers_rejects_bad_fraction():
    with pytest.raises(ValueError, match="fraction"):
        bd.budget_tiers(10, (0.0,))
    with pytest.raises(ValueError, match="fraction"):
        bd.budget_tiers(10, (1.5,))


def test_budgetmix_candidates():
    assert bd.budgetmix_candidates(10) == tuple(range(1, 11))
    assert bd.budgetmix_candidates(5) == (1, 1, 2, 2, 3, 3, 4, 4, 5, 5)  # ceil(k/10 * 5)
    assert bd.budgetmix_candidates(7) == (1, 2, 3, 3, 4, 5, 5, 6, 7, 7)
    assert bd.budgetmix_candidates(1) == (1,) * 10


def test_sample_budgetmix_groups_share_a_budget():
    b = bd.sample_budgetmix(jax.random.key(0), 50, 4, 10)
    assert b.shape == (200,) and b.dtype == jnp.int32
    groups = np.asarray(b).reshape(50, 4)
    assert np.all(groups == groups[:, :1])
    assert set(np.unique(groups).tolist()) <= set(range(1, 11))
    assert len(np.unique(groups[:, 0])) > 3  # not one constant budget


def test_sample_budgetmix_uniform():
    n = 20000
    b = np.asarray(jax.jit(bd.sample_budgetmix, static_argnums=(1, 2, 3))(
        jax.random.key(1), n, 1, 10))
    counts = np.bincount(b, minlength=11)[1:]
    chi2 = float(((counts - n / 10) ** 2 / (n / 10)).sum())
    assert chi2 < 27.9  # chi-square, 9 dof, p = 0.001
    # T_max = 5: each value is 2 of the 10 candidates -> 1/5 each
    b5 = np.asarray(bd.sample_budgetmix(jax.random.key(2), n, 1, 5))
    np.testing.assert_allclose(np.bincount(b5, minlength=6)[1:] / n, 0.2, atol=0.015)


def test_full_budget_and_validate():
    assert np.asarray(bd.full_budget(3, 7)).tolist() == [7, 7, 7]
    assert bd.validate_budgets(jnp.asarray([1, 5, 10]), 10).tolist() == [1, 5, 10]
    for whole in (np.asarray([2.0, 3.0]), jnp.asarray([2.0, 3.0]), [2.0]):  # a float budget is refused, whole or not
        with pytest.raises(ValueError, match="budgets must be integers .turns per episode., got dtype float"):
            bd.validate_budgets(whole, 10, keep_on_device=True)
    with pytest.raises(ValueError, match=r"outside \[1, T_max=10\].*\[0\]"):
        bd.validate_budgets(jnp.asarray([3, 0, 4]), 10)
    with pytest.raises(ValueError, match=r"\[-2\]"):
        bd.validate_budgets([-2], 10)
    with pytest.raises(ValueError, match="outside"):
        bd.validate_budgets([11], 10)
    with pytest.raises(ValueError, match="integers"):
        bd.validate_budgets([2.5], 10)
    with pytest.raises(ValueError, match="empty"):
        bd.validate_budgets([], 10)


@pytest.fixture(scope="module")
def codec_tok():
    words = bd.vocabulary()
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *words, "<answer>Left</answer>"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    codec = make_codec(words, lambda s: tok.encode(s).ids, 0, ["<answer>Left</answer>"])
    return codec, tok


def _text(codec, tok, ids, n):
    toks, length = render(codec, ids, n)
    return tok.decode(np.asarray(toks[:length]).tolist())


@pytest.mark.parametrize("args, want", [
    ((2, 10, 8), "Turn 3 of 1 0 . 8 turns left ."),
    ((0, 1, 1), "Turn 1 of 1 . 1 turns left ."),
    ((99, 120, 21), "Turn 1 0 0 of 1 2 0 . 2 1 turns left ."),
    ((998, 999, 0), "Turn 9 9 9 of 9 9 9 . 0 turns left ."),
])
def test_budget_words_text(codec_tok, args, want):
    codec, tok = codec_tok
    fmt = bd.BudgetFormat.from_codec(codec)
    ids, n = jax.jit(bd.budget_words, static_argnums=3)(*args, fmt)
    assert ids.shape == (fmt.max_words,) == (3 * 3 + 6,)
    assert _text(codec, tok, ids, n) == want


@pytest.mark.parametrize("t_max", [1, 6, 9, 10, 57, 100, 999, 5000])
def test_words_for_bounds_every_rollout_text(codec_tok, t_max):
    """`words_for(t_max)` is the exact maximum of n_words over turns, budgets and remaining turns <= t_max."""
    codec, _ = codec_tok
    fmt = bd.BudgetFormat.from_codec(codec)
    vals = np.unique(np.clip(np.concatenate([np.arange(1, 12), [t_max - 1, t_max]]), 0, t_max))
    t, b, r = (x.reshape(-1) for x in np.meshgrid(vals, vals, vals))
    _, n = jax.jit(jax.vmap(lambda t, b, r: bd.budget_words(t - 1, b, r, fmt)))(t, b, r)
    assert int(np.max(np.asarray(n))) == fmt.words_for(t_max) <= fmt.max_words


def test_budget_words_hidden_and_custom_format(codec_tok):
    codec, tok = codec_tok
    fmt = bd.BudgetFormat.from_codec(codec)
    _, n = bd.budget_words(2, 10, 8, fmt, hidden=True)
    assert int(n) == 0
    _, n = jax.vmap(lambda h: bd.budget_words(2, 10, 8, fmt, h))(jnp.asarray([True, False]))
    assert np.asarray(n).tolist() == [0, 10]  # "Turn 3 of 1 0 . 8 turns left ."
    short = bd.BudgetFormat.from_codec(codec, ("{remaining}", "turns", "left"))
    ids, n = bd.budget_words(4, 10, 6, short)
    assert _text(codec, tok, ids, n) == "6 turns left"
    with pytest.raises(ValueError, match="not in this codec"):
        bd.BudgetFormat.from_codec(codec, ("Budget", "{budget}"))


def test_validate_budgets_keeps_device_arrays_on_device():
    """The RL loop's sampled budgets are checked by min/max and stay a device array; bad ones still raise."""
    b = jnp.asarray([1, 3, 6], jnp.int32)
    out = bd.validate_budgets(b, 6, keep_on_device=True)
    assert isinstance(out, jax.Array) and out.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out), [1, 3, 6])
    assert isinstance(bd.validate_budgets(b, 6), np.ndarray)  # the default path is numpy
    with pytest.raises(ValueError, match=r"outside \[1, T_max=6\] \(min 0, max 7\)"):
        bd.validate_budgets(jnp.asarray([0, 7]), 6, keep_on_device=True)
    with pytest.raises(ValueError, match="empty"):
        bd.validate_budgets(jnp.zeros((0,), jnp.int32), 6, keep_on_device=True)
