"""KV-cache generation: parity with transformers' greedy `generate`, samplers, logprobs, cache reuse,
no-retrace guards and input validation.

Legend: B batch, L prompt width, M new-token buffer, V vocab.
"""
import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxagent.models import ops, qwen3, weights
from jaxagent.sampling import GREEDY, Sampler, append, decode, generate, sample
from tests.hf_reference import make_hf_qwen3

_gen_module = importlib.import_module("jaxagent.sampling.generate")  # the name `generate` is the function
LENS = (5, 9, 3, 7)        # prompt lengths: width 9 -> bucket 16
MAX_NEW = 12
MAX_STEPS = 16             # = bucket(12, 8): every run below shares this static buffer
PAD = 0
TOL = 1e-4  # logits of magnitude ~1 through different programs (cache vs full forward, HF); see _f32_tol


def _f32_tol(ref, terms: int) -> float:
    """A bound for f32 rounding differences (summation order, fused multiply-adds) between two ways of
    computing `ref`: a few ulps per sqrt(reduction length), scaled by the values' magnitude."""
    return 16 * float(np.finfo(np.float32).eps) * np.sqrt(terms) * max(1.0, float(np.abs(np.asarray(ref)).max()))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("hf_gen"))
    hf = make_hf_qwen3(d, seed=7, rope_theta=5000.0)
    cfg, params = weights.load(d)
    return hf, cfg, params


FULL_WIDTH = 32  # every teacher-forced forward is right-padded to this width: one compile


@pytest.fixture(scope="module")
def full_logits(model):
    """seqs -> list of [len, V] logits of a plain (cache-free) forward, one jitted call per batch.

    Right padding never changes the logits of earlier positions (causal attention)."""
    _, cfg, params = model
    fwd = jax.jit(lambda p, t: qwen3.forward(p, cfg, t)[0])

    def apply(seqs):
        assert len(seqs) <= len(LENS) and max(map(len, seqs)) <= FULL_WIDTH
        toks = np.zeros((len(LENS), FULL_WIDTH), np.int32)
        for b, s in enumerate(seqs):
            toks[b, :len(s)] = s
        out = np.asarray(fwd(params, jnp.asarray(toks)))
        return [out[b, :len(s)] for b, s in enumerate(seqs)]
    return apply


@pytest.fixture(scope="module")
def prompts(model):
    """The same prompts padded on the left and on the right: (tokens, mask) each, [B, L]."""
    _, cfg, _ = model
    rng = np.random.default_rng(11)
    seqs = [rng.integers(1, cfg.vocab_size, n) for n in LENS]
    width = max(LENS)
    left_t, left_m = np.full((len(seqs), width), PAD), np.zeros((len(seqs), width), np.int64)
    right_t, right_m = left_t.copy(), left_m.copy()
    for b, s in enumerate(seqs):
        left_t[b, width - len(s):], left_m[b, width - len(s):] = s, 1
        right_t[b, :len(s)], right_m[b, :len(s)] = s, 1
    return seqs, (left_t, left_m), (right_t, right_m)


def hf_greedy(hf, tokens, mask, max_new, eos=None):
    """transformers' greedy generate on a LEFT-padded batch: the new tokens [B, <=max_new]."""
    import torch
    kw = dict(max_new_tokens=max_new, do_sample=False, pad_token_id=PAD)
    kw["eos_token_id"] = eos if eos is not None else None
    if eos is None:
        kw["min_new_tokens"] = max_new
    with torch.no_grad():
        out = hf.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask), **kw)
    return out[:, tokens.shape[1]:].numpy()


def run(params, cfg, tokens, mask, *, sampler=GREEDY, seed=0, max_new=MAX_NEW, **kw):
    return generate(params, cfg, jnp.asarray(tokens), jax.random.key(seed), max_new_tokens=max_new,
                    prompt_mask_BxL=jnp.asarray(mask), max_steps=kw.pop("max_steps", MAX_STEPS),
                    sampler=sampler, pad_id=PAD, return_cache=kw.pop("return_cache", True), **kw)


@pytest.fixture(scope="module")
def greedy_left(model, prompts):
    _, cfg, params = model
    (tl, ml) = prompts[1]
    return run(params, cfg, tl, ml)


@pytest.fixture(scope="module")
def hf_ref(model, prompts):
    hf = model[0]
    return hf_greedy(hf, *prompts[1], MAX_NEW)


# ---------------------------------------------------------------- greedy parity
def test_greedy_left_padding_matches_transformers(greedy_left, hf_ref):
    toks = np.asarray(greedy_left.tokens)
    assert toks.shape == (len(LENS), MAX_STEPS)
    np.testing.assert_array_equal(toks[:, :MAX_NEW], hf_ref)
    np.testing.assert_array_equal(toks[:, MAX_NEW:], PAD)
    assert np.asarray(greedy_left.lengths).tolist() == [MAX_NEW] * len(LENS)
    assert not np.asarray(greedy_left.stopped).any()
    # the random model does not collapse to one token (otherwise the parity check is weak)
    assert len(np.unique(hf_ref)) > 8


def test_greedy_right_padding_matches_transformers(model, prompts, hf_ref):
    _, cfg, params = model
    out = run(params, cfg, *prompts[2])
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :MAX_NEW], hf_ref)


@pytest.mark.parametrize("seam", ["cpu_xla", "accelerator"], indirect=True)
def test_greedy_matches_transformers_without_kernels(model, prompts, hf_ref, seam):
    """The same parity without the CPU kernels: XLA:CPU's branches (blocked multiply-add decode
    attention, a [D, V] head copy) and the branches GPUs and TPUs compile (dot_general), run on CPU."""
    _, cfg, params = model
    out = run(params, cfg, *prompts[1])
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :MAX_NEW], hf_ref)


@pytest.fixture(scope="module")
def eos_choice(greedy_left):
    """A token whose first occurrence differs between rows (one row never emits it, if possible)."""
    toks = np.asarray(greedy_left.tokens)[:, :MAX_NEW]
    best = None
    for tok in np.unique(toks):
        first = [int(np.argmax(r == tok)) if (r == tok).any() else None for r in toks]
        hits = [f for f in first if f is not None]
        score = (len(set(hits)) >= 2) + (None in first) + (len(set(hits)) >= 3)
        if best is None or score > best[0]:
            best = (score, int(tok), first)
    assert best[0] >= 2, "fixture: no token separates the rows' stop steps"
    unused = int(np.setdiff1d(np.arange(1, 101), toks)[0])  # a second stop id that never occurs
    return best[1], best[2], unused


def test_stop_token_matches_transformers(model, prompts, eos_choice):
    hf, cfg, params = model
    eos, first, unused = eos_choice
    tl, ml = prompts[1]
    out = run(params, cfg, tl, ml, stop_ids=(unused, eos))  # a stop-token set
    ref = hf_greedy(hf, tl, ml, MAX_NEW, eos=eos)
    toks, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    expect_len = [MAX_NEW if f is None else f + 1 for f in first]
    assert lengths.tolist() == expect_len
    assert len(set(expect_len)) >= 2, "rows should stop at different steps"
    assert np.asarray(out.stopped).tolist() == [f is not None for f in first]
    lp = np.asarray(out.logprobs)
    for b, n in enumerate(expect_len):
        np.testing.assert_array_equal(toks[b, :n], ref[b, :n])
        assert (toks[b, n:] == PAD).all() and (lp[b, n:] == 0).all()
        assert (ref[b, n:] == PAD).all()  # HF pads finished rows too
        if first[b] is not None:
            assert toks[b, n - 1] == eos and eos not in toks[b, :n - 1]
    # the cache holds prompt + generated (stop token included)
    assert np.asarray(out.cache["length"]).tolist() == [p + n for p, n in zip(LENS, expect_len)]


def test_per_row_token_limits(model, prompts, greedy_left):
    _, cfg, params = model
    limits = np.array([1, 16, 0, 7])
    out = run(params, cfg, *prompts[1], max_new=limits)
    full = run(params, cfg, *prompts[1], max_new=16)
    assert np.asarray(out.lengths).tolist() == limits.tolist()
    toks, ref = np.asarray(out.tokens), np.asarray(full.tokens)
    for b, n in enumerate(limits):
        np.testing.assert_array_equal(toks[b, :n], ref[b, :n])
        assert (toks[b, n:] == PAD).all()
    np.testing.assert_array_equal(ref[:, :MAX_NEW], np.asarray(greedy_left.tokens)[:, :MAX_NEW])


# ---------------------------------------------------------------- samplers
def test_top_k_1_equals_greedy(model, prompts, greedy_left):
    _, cfg, params = model
    out = run(params, cfg, *prompts[1], sampler=Sampler(top_k=1), seed=123)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(greedy_left.tokens))
    # same policy (temperature 1): same logprobs
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(greedy_left.logprobs), rtol=0,
                               atol=_f32_tol(greedy_left.logprobs, cfg.vocab_size))


def test_tiny_top_p_equals_greedy(model, prompts):
    _, cfg, params = model
    # Sharper logits (embedding x8, tied head): the random model's near-uniform logits have top-2 gaps
    # of ~1e-7, where log_softmax(logits / T) may round a tie the other way than argmax(logits).
    sharp = {**params, "embed": params["embed"] * 8.0}
    greedy = run(sharp, cfg, *prompts[1])
    out = run(sharp, cfg, *prompts[1], sampler=Sampler(top_p=1e-6, temperature=1.5), seed=5)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(greedy.tokens))


def _chi2_pvalue(counts, probs, min_expected=5.0):
    """Pearson chi-square p-value; bins with small expected counts are pooled into one."""
    n = counts.sum()
    expected = n * probs
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < min_expected:  # pool too small to test on its own: fold it into the last big bin
        obs, exp = np.append(obs[:-2], obs[-2:].sum()), np.append(exp[:-2], exp[-2:].sum())
    stat = ((obs - exp) ** 2 / exp).sum()
    return stats.chi2.sf(stat, len(obs) - 1)


def test_temperature_first_token_distribution(model, prompts, full_logits):
    _, cfg, params = model
    seq = prompts[0][0]
    n, temp = 4096, 0.6
    toks = np.tile(seq, (n, 1))
    out = generate(params, cfg, jnp.asarray(toks), jax.random.key(42), max_new_tokens=1, max_steps=1,
                   sampler=Sampler(temperature=temp))
    first = np.asarray(out.tokens)[:, 0]
    logits = full_logits([seq])[0][-1].astype(np.float64)
    probs = np.exp(logits / temp - logits.max() / temp)
    probs /= probs.sum()
    counts = np.bincount(first, minlength=cfg.vocab_size)
    assert _chi2_pvalue(counts, probs) > 1e-3
    # the test has power: the untempered distribution is clearly rejected
    p1 = np.exp(logits - logits.max())
    assert _chi2_pvalue(counts, p1 / p1.sum()) < 1e-6
    # sampler logprobs are log_softmax(logits / T) at the sampled token
    lp = np.asarray(out.logprobs)[:, 0]
    np.testing.assert_allclose(lp, np.log(probs)[first], atol=1e-4)


@pytest.mark.parametrize("sampler,support", [(Sampler(top_k=3, temperature=0.8), "k"),
                                             (Sampler(top_p=0.6, temperature=1.3), "p")])
def test_truncated_sampler_distribution(sampler, support):
    """top-k / top-p sample the renormalised truncated softmax(logits / T)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 1.5, 20).astype(np.float32)
    n = 20000
    tok, _ = jax.jit(sample, static_argnums=2)(jax.random.key(1), jnp.tile(logits, (n, 1)), sampler)
    counts = np.bincount(np.asarray(tok), minlength=20)
    p = np.exp((logits - logits.max()) / sampler.temperature).astype(np.float64)
    p /= p.sum()
    order = np.argsort(-p)
    if support == "k":
        keep = order[:3]
    else:
        before = np.cumsum(p[order]) - p[order]
        keep = order[before < sampler.top_p]
    q = np.zeros_like(p)
    q[keep] = p[keep] / p[keep].sum()
    assert counts[q == 0].sum() == 0
    assert _chi2_pvalue(counts[keep], q[keep]) > 1e-3


def test_generate_returns_the_cache_only_when_asked(model, prompts, greedy_left):
    """By default generate drops the KV cache as it returns (under a transformation: no output of the caller's
    program); the tokens are the same as with return_cache=True."""
    _, cfg, params = model
    tl, ml = prompts[1]
    out = run(params, cfg, tl, ml, return_cache=False)
    assert out.cache is None and greedy_left.cache is not None
    for name in ("tokens", "logprobs", "lengths", "stopped"):
        np.testing.assert_array_equal(np.asarray(getattr(out, name)), np.asarray(getattr(greedy_left, name)), name)
    shapes = jax.eval_shape(lambda p: generate(p, cfg, jnp.asarray(tl), jax.random.key(0), max_new_tokens=MAX_NEW,
                                               max_steps=MAX_STEPS, prompt_mask_BxL=jnp.asarray(ml)), params)
    assert shapes.cache is None and len(jax.tree.leaves(shapes)) == 4


# ---------------------------------------------------------------- logprobs and the cache
@pytest.fixture(scope="module")
def sampled_t1(model, prompts):
    _, cfg, params = model
    return run(params, cfg, *prompts[1], sampler=Sampler(temperature=1.0), seed=3)


def test_logprobs_equal_teacher_forced(prompts, full_logits, sampled_t1, greedy_left):
    for out in (sampled_t1, greedy_left):
        toks, lps, lengths = (np.asarray(x) for x in (out.tokens, out.logprobs, out.lengths))
        fulls = [np.concatenate([seq, toks[b, :lengths[b]]]) for b, seq in enumerate(prompts[0])]
        for b, (seq, logits) in enumerate(zip(prompts[0], full_logits(fulls))):
            n = lengths[b]
            ref = np.asarray(jax.nn.log_softmax(logits.astype(np.float64), -1))[len(seq) - 1:-1]
            np.testing.assert_allclose(lps[b, :n], ref[np.arange(n), toks[b, :n]], atol=TOL)
            assert (lps[b, n:] == 0).all()
    assert not np.array_equal(np.asarray(sampled_t1.tokens), np.asarray(greedy_left.tokens))


def test_cache_continues_with_append(model, prompts, full_logits, sampled_t1):
    """After generate, appending more tokens equals a full forward over prompt + generated + new."""
    _, cfg, params = model
    out = sampled_t1
    lengths = np.asarray(out.lengths)
    assert np.asarray(out.cache["length"]).tolist() == [p + n for p, n in zip(LENS, lengths)]
    extra = np.random.default_rng(2).integers(0, cfg.vocab_size, (len(LENS), 3))
    n_valid = np.array([3, 1, 0, 2])
    logits, cache = jax.jit(append, static_argnums=1)(params, cfg, out.cache, jnp.asarray(extra),
                                                      jnp.asarray(n_valid))
    assert np.asarray(cache["length"]).tolist() == [p + n + k for p, n, k in zip(LENS, lengths, n_valid)]
    toks = np.asarray(out.tokens)
    fulls = [np.concatenate([seq, toks[b, :lengths[b]], extra[b, :n_valid[b]]])
             for b, seq in enumerate(prompts[0])]
    for b, ref in enumerate(full_logits(fulls)):
        if n_valid[b]:
            assert np.abs(np.asarray(logits[b]) - ref[-1]).max() < TOL


@pytest.mark.parametrize("seam", ["kernels", "accelerator"], indirect=True)
def test_kv_windows_equal_full_attention(model, sampled_t1, seam):
    """Appending through a run-time window choice (`KVWindows`, one traced index) equals attending over
    the whole cache for every window that holds the rows' histories; so does a static int window.
    kernels: the CPU attention kernel reads the window at run time; accelerator: the `lax.switch` over
    the sizes that GPUs and TPUs compile (asserted in the jaxpr), run on CPU."""
    _, cfg, params = model
    cache = sampled_t1.cache
    slots = cache["v"][0].shape[2]
    extra = jnp.asarray(np.random.default_rng(5).integers(0, cfg.vocab_size, (len(LENS), 3)))
    n_valid = jnp.asarray([3, 1, 0, 2])
    need = int(np.max(np.asarray(cache["length"]))) + 3
    sizes = tuple(sorted({-(-need // 8) * 8, slots}))
    ref, ref_cache = jax.jit(append, static_argnums=1)(params, cfg, cache, extra, n_valid)

    @jax.jit
    def windowed(cache, index):
        return append(params, cfg, cache, extra, n_valid, kv_window=ops.KVWindows(sizes, index))

    if seam == "accelerator":
        assert "cond[" in str(jax.make_jaxpr(windowed)(cache, jnp.int32(0)))  # the switch over the sizes
    live = np.asarray(n_valid) > 0
    for i in range(len(sizes)):
        logits, new_cache = windowed(cache, jnp.int32(i))
        assert np.abs(np.asarray(logits - ref)[live]).max() < TOL
        for a, r in zip(jax.tree.leaves(new_cache), jax.tree.leaves(ref_cache)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), atol=_f32_tol(r, cfg.hidden_size))
    static, _ = jax.jit(append, static_argnums=1, static_argnames="kv_window")(
        params, cfg, cache, extra, n_valid, kv_window=sizes[0])
    assert np.abs(np.asarray(static - ref)[live]).max() < TOL
    assert int(ops.choose_window(sizes, need).index) == 0
    assert int(ops.choose_window(sizes, slots + 5).index) == len(sizes) - 1  # too long: the largest
    with pytest.raises(ValueError, match="kv_window"):
        append(params, cfg, cache, extra, n_valid, kv_window=ops.KVWindows((slots + 8,), jnp.int32(0)))


def _compiled_ops(fn, *args):
    """(conditionals, batched dot_generals, custom calls) in the program XLA compiled for `fn(*args)`."""
    hlo = fn.lower(*args).compile().as_text()
    lines = hlo.splitlines()
    return (sum("conditional(" in x for x in lines), sum(bool(re.search(r"\bdot\(", x)) and "lhs_batch_dims={0,1}" in x
                                                        for x in lines), sum("custom-call(" in x for x in lines))


@pytest.mark.parametrize("seam", ["accelerator"], indirect=True)
def test_kv_windows_decode_executes_the_switch_and_the_pv_dot(model, prompts, hf_ref, seam):
    """Greedy decoding through a run-time window choice (`KVWindows`, one traced index) with the branches
    GPUs and TPUs compile, executed here: the compiled program holds the `lax.switch` over the sizes (a
    conditional per layer) whose branches compute the scores and the short-cache p.V as batched
    dot_generals (no CPU kernel, no multiply-adds), and for every window that holds the sequences the tokens
    equal transformers' greedy ones."""
    _, cfg, params = model
    seqs, _, (right_t, _) = prompts
    slots = 64
    sizes = (32, slots)  # 32 holds prompt (<= 9) + MAX_STEPS new tokens
    cache0 = qwen3.init_cache(cfg, len(LENS), slots)
    logits0, cache0 = jax.jit(append, static_argnums=1)(params, cfg, cache0, jnp.asarray(right_t),
                                                        jnp.asarray([len(x) for x in seqs]))

    @jax.jit
    def windowed(cache, logits, index):
        return decode(params, cfg, cache, logits, jax.random.key(0), MAX_NEW, max_steps=MAX_STEPS, sampler=GREEDY,
                      stop_ids=(), pad_id=PAD, kv_window=ops.KVWindows(sizes, index))

    conds, batched, calls = _compiled_ops(windowed, cache0, logits0, jnp.int32(0))
    layers = cfg.num_hidden_layers
    assert calls == 0 and conds >= layers  # the switch over the sizes, in every layer
    assert batched == 2 * layers * len(sizes)  # scores and p.V dots in each branch of each layer's switch
    for i in range(len(sizes)):
        out = windowed(cache0, logits0, jnp.int32(i))
        np.testing.assert_array_equal(np.asarray(out.tokens)[:, :MAX_NEW], hf_ref)


def test_untied_head_gives_the_same_logits(model, prompts):
    _, cfg, params = model
    toks = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 6)))
    p2, c2 = qwen3.untied(params, cfg)
    ref, _ = qwen3.forward(params, cfg, toks)
    out, _ = qwen3.forward(p2, c2, toks)
    assert not c2.tie_word_embeddings and qwen3.untied(p2, c2) == (p2, c2)
    # the same product in another layout: equal up to f32 summation order over D (AVX-512 or not)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=_f32_tol(ref, cfg.hidden_size))


# ---------------------------------------------------------------- no retrace
def test_no_retrace_across_token_limits_and_prompt_lengths(model, prompts, greedy_left):
    _, cfg, params = model
    tl, ml = prompts[1]
    fn = _gen_module.generate_jit
    run(params, cfg, tl, ml)  # compiled here if a test ran in another seam mode since (caches cleared)
    before = fn._cache_size()
    results = []
    for max_new in (9, 13, 16, np.array([2, 16, 11, 5])):  # default buffer: bucket(max, 8) = 16
        results.append(generate(params, cfg, jnp.asarray(tl), jax.random.key(0), max_new_tokens=max_new,
                                prompt_mask_BxL=jnp.asarray(ml), sampler=GREEDY, pad_id=PAD))
    for max_new in (0, 1, 5):  # explicit buffer
        run(params, cfg, tl, ml, max_new=max_new)
    for width in (10, 12, 16):  # wider prompts, same bucket (16)
        pad = np.zeros((len(LENS), width - tl.shape[1]), np.int64)
        run(params, cfg, np.concatenate([pad, tl], 1), np.concatenate([pad, ml], 1))
    assert fn._cache_size() == before, "generate recompiled for a new max_new_tokens or prompt width"
    ref = np.asarray(greedy_left.tokens)
    for out, k in zip(results, (9, 13, 16)):
        assert np.asarray(out.lengths).tolist() == [k] * len(LENS)
        np.testing.assert_array_equal(np.asarray(out.tokens)[:, :min(k, MAX_NEW)], ref[:, :min(k, MAX_NEW)])
    # the counter does count: a new batch size compiles once; a row alone equals its batched self
    seqs = prompts[0]
    alone = run(params, cfg, seqs[1][None], np.ones((1, len(seqs[1]))))
    assert fn._cache_size() == before + 1
    np.testing.assert_array_equal(np.asarray(alone.tokens)[0], ref[1])


# ---------------------------------------------------------------- bad inputs
def test_bad_inputs_raise_clear_errors(model, prompts):
    _, cfg, params = model
    tl, ml = prompts[1]
    key = jax.random.key(0)

    def gen(t=tl, m=ml, **kw):
        kw.setdefault("max_new_tokens", 4)
        return generate(params, cfg, t, key, prompt_mask_BxL=m, **kw)

    empty = ml.copy()
    empty[2] = 0
    with pytest.raises(ValueError, match="at least one real token"):
        gen(m=empty)
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        gen(t=np.zeros((2, 0), np.int64), m=None)
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        gen(t=np.zeros(5, np.int64), m=None)
    bad = tl.copy()
    bad[0, -1] = cfg.vocab_size
    with pytest.raises(ValueError, match="token ids"):
        gen(t=bad)
    bad[0, -1] = -3
    with pytest.raises(ValueError, match="token ids"):
        gen(t=bad)
    with pytest.raises(ValueError, match=r"generate: prompt_mask_BxL has L = \d+ .* but prompt_BxL has L = \d+"):
        gen(m=ml[:, 1:])
    with pytest.raises(TypeError, match=r"generate: prompt_BxL must be an integer array \[B, L\]; got float32"):
        gen(t=tl.astype(np.float32))
    with pytest.raises(TypeError, match=r"generate: key must be a PRNG key .*; got int"):
        generate(params, cfg, tl, 0, prompt_mask_BxL=ml, max_new_tokens=4)
    with pytest.raises(ValueError, match="exceeds the buffer max_steps"):
        gen(max_new_tokens=9, max_steps=8)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        gen(max_new_tokens=-1)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        gen(max_new_tokens=np.array([3, -2, 1, 1]))
    with pytest.raises(ValueError, match="cache_len"):
        gen(cache_len=8)
    with pytest.raises(ValueError, match="max_steps"):
        gen(max_steps=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen(max_new_tokens=np.array([1, 2]))


def test_padding_values_outside_vocab_are_ignored(model, prompts, greedy_left):
    """Only real tokens are range-checked: padding may hold any id (e.g. -1)."""
    _, cfg, params = model
    tl, ml = prompts[1]
    out = run(params, cfg, np.where(ml == 1, tl, -1), ml)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(greedy_left.tokens))


@pytest.mark.parametrize("kw,match", [
    (dict(temperature=0.0), "temperature"), (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(temperature=float("inf")), "temperature"),
    (dict(top_k=-1), "top_k"), (dict(top_k=1.5), "top_k"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(top_p=float("nan")), "top_p")])
def test_bad_sampler_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        Sampler(**kw)


def test_greedy_ignores_temperature():
    assert Sampler(greedy=True, temperature=0.0).greedy


@pytest.mark.parametrize("sampler", [GREEDY, Sampler(temperature=1.0)], ids=["greedy", "sampled"])
def test_compacted_decode_equals_the_full_loop(sampler):
    """`decode(compact_rows=C)`: 16 rows, 13 of which may generate 3 tokens, one 12 and two 30, so from step 3 on
    at most 3 <= C = 4 rows are generating and the loop goes on over 4 rows (with (4, 2), from step 12 over 2 of
    those). Tokens, lengths and stops equal the full loop's, log-probs and the cache's held slots (those before each
    row's length) to float rounding (greedy; sampled with the pre-drawn noise a small vocabulary gets, gathered with
    the rows)."""
    from jaxagent.models.config import Qwen3Config
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8)
    params = qwen3.init(cfg, jax.random.key(3))
    b, slots, steps = 16, 64, 32
    rng = np.random.default_rng(5)
    prompt = jnp.asarray(rng.integers(1, cfg.vocab_size, (b, 8)), jnp.int32)
    n = jnp.asarray(rng.integers(2, 9, b), jnp.int32)
    logits, cache = append(params, cfg, qwen3.init_cache(cfg, b, slots), prompt, n)
    max_new = jnp.asarray([3] * 13 + [12] + [30] * 2, jnp.int32)[rng.permutation(b)]
    run_ = jax.jit(lambda c, compact: decode(params, cfg, c, logits, jax.random.key(9), max_new, max_steps=steps,
                                             sampler=sampler, stop_ids=(), pad_id=PAD, compact_rows=compact),
                   static_argnums=1)
    full = run_(cache, None)
    for levels in (4, (4, 2)):
        _same_generation(run_(cache, levels), full, max_new, slots)


def _same_generation(compact, full, max_new, slots):
    np.testing.assert_array_equal(np.asarray(compact.lengths), np.asarray(max_new))  # no stop ids: every row full
    for name in ("tokens", "lengths", "stopped"):
        np.testing.assert_array_equal(np.asarray(getattr(compact, name)), np.asarray(getattr(full, name)), name)
    np.testing.assert_allclose(np.asarray(compact.logprobs), np.asarray(full.logprobs), atol=1e-5)
    length = np.asarray(full.cache["length"])
    np.testing.assert_array_equal(np.asarray(compact.cache["length"]), length)
    held = np.arange(slots)[None, :] < length[:, None]  # [B, S]: the slots a later call reads (past them: stale)
    for a, c in zip(full.cache["k"], compact.cache["k"]):  # [B, K, E, S]
        np.testing.assert_allclose(np.where(held[:, None, None], c, 0), np.where(held[:, None, None], a, 0), atol=1e-5)
    for a, c in zip(full.cache["v"], compact.cache["v"]):  # [B, K, S, E]
        np.testing.assert_allclose(np.where(held[:, None, :, None], c, 0), np.where(held[:, None, :, None], a, 0),
                                   atol=1e-5)


@pytest.mark.parametrize("bad", [0, 4, 5, 2.0, True, (2, 3), (2, 0)])
def test_compact_rows_out_of_range_is_refused(model, bad):
    _, cfg, params = model
    cache = qwen3.init_cache(cfg, 4, 16)
    with pytest.raises(ValueError, match="compact_rows must be an int in .* or a decreasing tuple"):
        decode(params, cfg, cache, jnp.zeros((4, cfg.vocab_size)), jax.random.key(0), 2, max_steps=2,
               sampler=GREEDY, stop_ids=(), compact_rows=bad)
