"""The compute seam (`jaxagent.models.ops`): the model and the loops name no CPU kernel path, what the
kernels read travels inside `ops.prepare`'s params, and whether the kernels are built on this host
never changes a program lowered for an accelerator.

Legend: B batch, T tokens, V vocab.
"""
import dataclasses
import io
import pathlib
import tokenize

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxagent
from jaxagent.models import ops, ops_cpu, qwen3
from jaxagent.models.config import Qwen3Config
from tests.conftest import seam_mode

ROOT = pathlib.Path(jaxagent.__file__).parent
# the model and the loops above it: one XLA program, with every CPU-specific line behind `ops`
SEAM_FREE = ["models/qwen3.py", *(f"sampling/{p.name}" for p in (ROOT / "sampling").glob("*.py")),
             *(f"rollout/{p.name}" for p in (ROOT / "rollout").glob("*.py"))]
CPU_WORDS = ("cpu", "kernel", "pack", "panel", "platform", "head_copy")


def _names(path: pathlib.Path) -> set[str]:
    """The identifiers of a module's code (comments and strings left out)."""
    toks = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return {t.string for t in toks if t.type == tokenize.NAME}


@pytest.mark.parametrize("rel", SEAM_FREE)
def test_model_and_loops_name_no_cpu_kernel_path(rel):
    """No identifier of qwen3.py, sampling/ or rollout/ names a CPU path (kernels, packed weights, platform
    choices, `prep`); the CPU branch is reached only through `ops`."""
    names = _names(ROOT / rel)
    bad = sorted(n for n in names if n == "prep" or any(w in n.lower() for w in CPU_WORDS))
    assert not bad, f"{rel}: {bad}"


def test_kernels_built_is_asked_only_in_the_cpu_branch():
    """`kernels_built` is called in `ops_cpu` (the CPU branch) only, nowhere else in the package."""
    users = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if "kernels_built" in _names(p))
    assert users == ["models/ops_cpu.py"], users


CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)


def _programs(dtype):
    """name -> (function, abstract args): forward, a cached append, generate and decode, as callers jit them."""
    from jaxagent.sampling import Sampler, append as append_, decode as decode_
    from jaxagent.sampling.generate import generate_jit
    b, t, steps = 4, 16, 8
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), qwen3.param_shapes(CFG))
    toks = jax.ShapeDtypeStruct((b, t), jnp.int32)
    n = jax.ShapeDtypeStruct((b,), jnp.int32)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    cache = jax.eval_shape(lambda: qwen3.init_cache(CFG, b, 2 * t, dtype))
    logits = jax.ShapeDtypeStruct((b, CFG.vocab_size), jnp.float32)

    def append(p, c, tk, nv):
        return append_(ops.prepare(p, CFG), CFG, c, tk, nv)

    def generate(p, tk, m, k, nv):
        return generate_jit(p, tk, m, k, nv, cfg=CFG, max_steps=steps, cache_len=t + steps,
                                    sampler=Sampler(temperature=0.7), stop_ids=(1,), pad_id=0)

    def decode(p, c, lg, k):
        window = ops.choose_window((t, 2 * t), jnp.max(c["length"]) + steps)
        return decode_(p, CFG, c, lg, k, steps, max_steps=steps, sampler=Sampler(), stop_ids=(1,),
                              kv_window=window)

    return {"forward": (lambda p, tk: qwen3.forward(p, CFG, tk)[0], (params, toks)),
            "append": (append, (params, cache, toks, n)),
            "generate": (generate, (params, toks, jax.ShapeDtypeStruct((b, t), bool), key, n)),
            "decode": (decode, (params, cache, logits, key))}


def _lowered(fn, args, platform):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.skipif(not ops_cpu.kernels_built(), reason="CPU kernels not built on this host")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_kernels_built_does_not_change_an_accelerator_program(dtype):
    """The same lowered text for TPU and CUDA with the kernels built and with them off; the CPU program
    does change (f32: it calls them), so the switch is live."""
    for name, (fn, args) in _programs(dtype).items():
        built = {p: _lowered(fn, args, p) for p in ("tpu", "cuda", "cpu")}
        with seam_mode("cpu_xla"):
            off = {p: _lowered(fn, args, p) for p in ("tpu", "cuda", "cpu")}
        assert built["tpu"] == off["tpu"] and built["cuda"] == off["cuda"], name
        if dtype == jnp.float32 and name != "forward":
            assert built["cpu"] != off["cpu"] and "jaxagent_" in built["cpu"] and "jaxagent_" not in off["cpu"], name


@pytest.mark.parametrize("seam", ["kernels", "cpu_xla", "accelerator"], indirect=True)
@pytest.mark.parametrize("tied", [True, False])
def test_prepared_params_give_the_same_logits(seam, tied):
    """forward and a decode step on `ops.prepare(params, cfg, decoding=True)` equal those on the params
    (f32 and bf16) on every path: the kernels, XLA:CPU without them (the head read from the prepared
    [D, V] layout), the accelerators' XLA."""
    cfg = dataclasses.replace(CFG, tie_word_embeddings=tied)
    one = jax.jit(lambda p, c, t: qwen3.forward(p, cfg, t, cache=c))
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)):
        params = jax.tree.map(lambda w: w.astype(dtype), qwen3.init(cfg, jax.random.key(0)))
        prepared = ops.prepare(params, cfg, decoding=True)
        assert ops.PREPARED in prepared or (dtype == jnp.bfloat16 and not tied)
        toks = jax.random.randint(jax.random.key(1), (3, 7), 0, cfg.vocab_size)
        n_valid = jnp.array([7, 2, 5], jnp.int32)
        step = jax.jit(lambda p, c, t: qwen3.forward(p, cfg, t, cache=c, n_valid=n_valid,
                                                     logits_index=jnp.maximum(n_valid - 1, 0)))
        cache = qwen3.init_cache(cfg, 3, 16, dtype)
        want, want_cache = step(params, cache, toks)
        got, got_cache = step(prepared, cache, toks)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)
        np.testing.assert_array_equal(np.asarray(got_cache["length"]), np.asarray(want_cache["length"]))
        nxt = toks[:, :1]
        want, _ = one(params, want_cache, nxt)
        got, _ = one(prepared, got_cache, nxt)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)
