"""`generate` on a mesh decodes with the rollouts' layout of the weights: on a (data, fsdp, tensor) = (2, 2, 2)
mesh of the 8 fake CPU devices (conftest), FSDP-sharded params (`sharding.RULES`, as training keeps them) are
laid out per `sharding.ROLLOUT_RULES` before the decode program (`sampling.rollout_params`: split over tensor,
whole over the batch axes, so no weight is gathered per decode step), cast to `compute_dtype` when given; the
tokens equal the single-device ones; and the AOT analysis' `generate` program (`jaxagent.aot.programs`) is the very program
`generate` runs (the same lowered text).

Legend: B batch, L prompt width.
"""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import sharding
from jaxagent.aot import programs as A
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.sampling import generate

gen_mod = importlib.import_module("jaxagent.sampling.generate")  # the name `generate` is the function
# every weight dimension divisible by its mesh axes (D 32 over fsdp; heads, MLP, vocab over tensor)
CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
B, L, NEW, STOP = 8, 16, 8, 3  # L and NEW are generate's buckets: prompt width 16, max_steps 8


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(2, 2, 2)


@pytest.fixture(scope="module")
def params():
    return qwen3.init(CFG, jax.random.key(0))


@pytest.fixture(scope="module")
def fsdp_params(params, mesh):
    return jax.device_put(params, sharding.shardings_for(qwen3.logical_axes(CFG), params, mesh))


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    toks = rng.integers(4, CFG.vocab_size, (B, L)).astype(np.int32)
    mask = np.arange(L)[None, :] >= rng.integers(0, L // 2, B)[:, None]  # left padding of 0..7 slots
    return toks, mask


def _recording(monkeypatch, call_real=True):
    """Replaces the jitted decode program with a recorder of what `generate` hands it."""
    seen = []
    real = gen_mod.generate_jit

    def spy(*args, **kw):
        seen.append((args, kw))
        return real(*args, **kw) if call_real else gen_mod.Generation(None, None, None, None)
    monkeypatch.setattr(gen_mod, "generate_jit", spy)
    return seen


@pytest.fixture(scope="module")
def on_mesh(fsdp_params, prompts, mesh):
    """generate on the mesh from FSDP-sharded params: (Generation, the args and kwargs of `generate_jit`)."""
    toks, mask = prompts
    with pytest.MonkeyPatch.context() as mp:
        seen = _recording(mp)
        out = generate(fsdp_params, CFG, toks, jax.random.key(1), prompt_mask_BxL=mask, max_new_tokens=NEW,
                       stop_ids=(STOP,), mesh=mesh)
    assert len(seen) == 1
    return out, seen[0][0], seen[0][1]


def test_fsdp_params_are_laid_out_for_decoding(on_mesh, params, fsdp_params, mesh):
    _, args, _ = on_mesh
    want = sharding.shardings_for(qwen3.logical_axes(CFG), params, mesh, sharding.ROLLOUT_RULES)
    fsdp_split = 0
    for x, x0, fs, sh in zip(jax.tree.leaves(args[0]), jax.tree.leaves(params), jax.tree.leaves(fsdp_params),
                             jax.tree.leaves(want)):
        assert x.sharding.is_equivalent_to(sh, x.ndim), (x.shape, x.sharding.spec)
        assert "fsdp" not in str(x.sharding.spec) and "data" not in str(x.sharding.spec)
        assert x.dtype == x0.dtype  # no compute_dtype: not cast
        np.testing.assert_array_equal(np.asarray(x), np.asarray(x0))
        fsdp_split += "fsdp" in str(fs.sharding.spec)
    assert fsdp_split >= 5  # the caller's params were FSDP-sharded (and stay so)
    assert "fsdp" in str(fsdp_params["embed"].sharding.spec)


def test_mesh_tokens_equal_one_device(on_mesh, params, prompts):
    out, _, _ = on_mesh
    toks, mask = prompts
    ref = generate(params, CFG, toks, jax.random.key(1), prompt_mask_BxL=mask, max_new_tokens=NEW, stop_ids=(STOP,))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=1e-5, rtol=1e-5)
    assert int(np.asarray(out.lengths).sum()) > B  # rows decoded several tokens


def test_aot_generate_program_is_what_generate_runs(on_mesh, mesh):
    _, args, kw = on_mesh
    runs = gen_mod.generate_jit.lower(*args, **kw).as_text()
    prog = A.generate_program(CFG, mesh, rows=B, prompt_len=L, new_tokens=NEW, dtype=jnp.float32, stop_ids=(STOP,),
                              pad_id=0, run_mesh=mesh)
    assert prog.lower().as_text() == runs


def test_compute_dtype_casts_before_decoding(params, fsdp_params, prompts, mesh, monkeypatch):
    toks, mask = prompts
    seen = _recording(monkeypatch, call_real=False)
    generate(params, CFG, toks, jax.random.key(1), max_new_tokens=NEW, compute_dtype=jnp.bfloat16)
    generate(fsdp_params, CFG, toks, jax.random.key(1), max_new_tokens=NEW, mesh=mesh, compute_dtype="bfloat16")
    generate(params, CFG, toks, jax.random.key(1), max_new_tokens=NEW)
    (one, _), (placed, _), (plain, _) = seen
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(one[0]))
    want = sharding.shardings_for(qwen3.logical_axes(CFG), params, mesh, sharding.ROLLOUT_RULES)
    for x, sh in zip(jax.tree.leaves(placed[0]), jax.tree.leaves(want)):
        assert x.dtype == jnp.bfloat16 and x.sharding.is_equivalent_to(sh, x.ndim)
    assert plain[0] is params  # neither mesh nor compute_dtype: the params as given
    with pytest.raises(ValueError, match="floating"):
        generate(params, CFG, toks, jax.random.key(1), max_new_tokens=NEW, compute_dtype=jnp.int32)


def test_traced_generate_on_a_mesh(fsdp_params, prompts, mesh):
    """Inside a user's transformation the params are laid out by a sharding constraint (no compile here)."""
    toks, mask = prompts
    out = jax.eval_shape(lambda p, t, m: generate(p, CFG, t, jax.random.key(1), prompt_mask_BxL=m, max_new_tokens=NEW,
                                                  max_steps=NEW, mesh=mesh), fsdp_params, toks, mask)
    assert out.tokens.shape == (B, NEW) and out.tokens.dtype == jnp.int32
