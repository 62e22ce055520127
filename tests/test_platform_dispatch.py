"""Platform-correct dispatch: programs lowered for TPU on this CPU host contain no CPU kernel (no
`jaxagent_*` custom call) and compile, while the same programs lowered for this host's CPU use the
kernels; decode attention is dot_general on accelerators and blocked multiply-adds only on CPU.

TPU programs are compiled without a TPU through libtpu's compile-only topology devices
(`jax.experimental.topologies`, v5p:2x2x1, a (data 1, fsdp 2, tensor 2) mesh), with abstract inputs.
Legend: B batch, T tokens, L prompt width, N turns, V vocab.
"""
import functools
import importlib
import importlib.util
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxagent import sharding as shd
from jaxagent import xla_options
from jaxagent.kernels import cpu as cpu_kernels
from jaxagent.models import ops, ops_cpu, qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.sampling import Sampler

gen_mod = importlib.import_module("jaxagent.sampling.generate")
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu not installed (pip install 'jax[tpu]==<jax version>')")
CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
B, L, STEPS = 4, 16, 8


@pytest.fixture(scope="module")
def tpu_mesh():
    from jax.experimental import topologies
    devices = topologies.get_topology_desc("v5p:2x2x1", "tpu").devices
    assert len(devices) == 4 and devices[0].platform == "tpu"
    return shd.make_mesh(1, 2, 2, devices=devices)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype if hasattr(x, "dtype")
                                                       else jnp.asarray(x).dtype), tree)


def _param_shapes(dtype):
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), qwen3.param_shapes(CFG))


def _programs(dtype):
    """name -> (function, abstract args): forward, generate (prefill + decode loop), decode alone with
    KV windows, each as its caller jits it (the entry points nest inside this jit)."""
    params = _param_shapes(dtype)
    toks = jax.ShapeDtypeStruct((B, L), jnp.int32)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    cache = jax.eval_shape(lambda: qwen3.init_cache(CFG, B, 2 * L, dtype))
    logits = jax.ShapeDtypeStruct((B, CFG.vocab_size), jnp.float32)

    def generate(p, t, m, k, n):
        return gen_mod.generate_jit(p, t, m, k, n, cfg=CFG, max_steps=STEPS, cache_len=L + STEPS,
                                    sampler=Sampler(temperature=0.7), stop_ids=(1,), pad_id=0)

    def decode(p, c, lg, k):
        window = ops.choose_window((L, 2 * L), jnp.max(c["length"]) + STEPS)
        return gen_mod.decode(p, CFG, c, lg, k, STEPS, max_steps=STEPS, sampler=Sampler(), stop_ids=(1,),
                              kv_window=window)

    return {"forward": (lambda p, t: qwen3.forward(p, CFG, t)[0], (params, toks)),
            "generate": (generate, (params, toks, jax.ShapeDtypeStruct((B, L), bool), key,
                                    jax.ShapeDtypeStruct((B,), jnp.int32))),
            "decode": (decode, (params, cache, logits, key))}


def _rollout_program(dtype):
    from jaxagent.envs.jax.frozenlake import FrozenLake, FrozenLakeParams, sample_tasks
    from jaxagent.models.tokenizer import build_word_tokenizer
    from jaxagent.rollout import RolloutConfig, budget_format, chat_layout, env_codec
    from jaxagent.rollout.jax_loop import rollout_jit
    import tempfile
    tok = build_word_tokenizer(FrozenLake.vocabulary(), tempfile.mkdtemp(prefix="tok"))
    codec = env_codec(tok, FrozenLake.vocabulary(), FrozenLake.ACTION_STRINGS, word_level=True)
    env = FrozenLake(codec, size=4)
    layout, fmt = chat_layout(tok, FrozenLake.system_prompt()), budget_format(codec)
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    rcfg = RolloutConfig(t_max=2, max_action_tokens=6, max_context=256, sampler=Sampler(temperature=1.0))
    fn = functools.partial(rollout_jit, cfg=cfg, env=env, layout=layout, fmt=fmt, rcfg=rcfg)
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), qwen3.param_shapes(cfg))
    args = (params, _abstract(sample_tasks(jax.random.key(0), B, 4, 0.8)), jax.ShapeDtypeStruct((B,), jnp.int32),
            jax.ShapeDtypeStruct((), jax.random.key(0).dtype), _abstract(FrozenLakeParams(horizon=2)),
            jax.ShapeDtypeStruct((), bool), jax.ShapeDtypeStruct((B, 2), jnp.int32))
    return fn, args


def _custom_calls(text: str) -> set[str]:
    return set(re.findall(r"jaxagent_\w+", text))


def _lower_for_tpu(mesh, fn, args):
    return jax.jit(fn, in_shardings=NamedSharding(mesh, P())).lower(*args)


@needs_libtpu
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_tpu_programs_have_no_cpu_kernels_and_compile(tpu_mesh, dtype):
    """forward, generate and decode lowered for TPU on this CPU host (kernels built or not): no
    `jaxagent_*` custom call before or after compilation, and they compile; for f32 the same programs
    lowered for this host's CPU do call the kernels when they are built (the choice follows the target)."""
    for name, (fn, args) in _programs(dtype).items():
        lowered = _lower_for_tpu(tpu_mesh, fn, args)
        assert not _custom_calls(lowered.as_text()), name
        assert not _custom_calls(lowered.compile().as_text()), name
        if dtype == jnp.float32 and cpu_kernels.available() and name != "forward":  # (no cache: no kernel)
            assert "jaxagent_attention" in _custom_calls(jax.jit(fn).lower(*args).as_text()), name


@needs_libtpu
def test_entry_point_compiles_for_tpu_without_the_cpu_options(tpu_mesh, monkeypatch):
    """An entry point (`xla_options.jit`) compiled as a call on TPU would run it (`.compile`, from abstract inputs
    placed on the topology): no CPU kernel, and none of the XLA:CPU options (an option value XLA rejects, put in them,
    does not reach the TPU compile)."""
    rep = NamedSharding(tpu_mesh, P())
    fn, args = _programs(jnp.float32)["generate"]
    args = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=rep), args)
    kw = dict(cfg=CFG, max_steps=STEPS, cache_len=L + STEPS, sampler=Sampler(), stop_ids=(1,), pad_id=0)
    assert gen_mod.generate_jit.devices(*args, **kw) == set(tpu_mesh.devices.flat)
    monkeypatch.setattr(xla_options, "DECODING_CPU_OPTIONS", {"xla_cpu_experimental_ynn_fusion_type": "not-a-fusion"})
    assert not _custom_calls(gen_mod.generate_jit.compile(*args, **kw).as_text())


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_tpu_rollout_has_no_cpu_kernels(tpu_mesh, dtype):
    fn, args = _rollout_program(dtype)
    compiled = _lower_for_tpu(tpu_mesh, fn, args).compile()
    assert not _custom_calls(compiled.as_text())
    if dtype == jnp.float32 and cpu_kernels.available():
        assert {"jaxagent_rows_matmul", "jaxagent_attention"} <= _custom_calls(jax.jit(fn).lower(*args).as_text())


@needs_libtpu
def test_tpu_forward_is_fsdp_with_a_mesh(tpu_mesh):
    """With `mesh=`, the residual stream is pinned to rows over (data, fsdp) and the logits' vocab to
    tensor: the TPU program gathers weights and never all-to-alls activations; the logits come out
    sharded P(fsdp, None, tensor)."""
    params = _param_shapes(jnp.float32)
    p_sh = shd.shardings_for(qwen3.logical_axes(CFG), params, tpu_mesh)
    toks = jax.ShapeDtypeStruct((B, L), jnp.int32)
    fn = jax.jit(lambda p, t: qwen3.forward(p, CFG, t, mesh=tpu_mesh)[0],
                 in_shardings=(p_sh, NamedSharding(tpu_mesh, P("fsdp"))))
    compiled = fn.lower(params, toks).compile()
    kinds = re.findall(r"= \S+ (all-gather|all-reduce|all-to-all|reduce-scatter)(?:-start)?\(", compiled.as_text())
    assert kinds.count("all-gather") >= 2 * CFG.num_hidden_layers and "all-to-all" not in kinds, kinds
    assert compiled.output_shardings.spec == P("fsdp", None, "tensor")


def _attention_dots(platform: str, t: int, slots: int) -> int:
    """dot_general ops in `ops.attention` of t query tokens over `slots` cache slots, lowered for `platform`."""
    q = jax.ShapeDtypeStruct((1, t, CFG.num_attention_heads, CFG.head_dim), jnp.float32)
    kt = jax.ShapeDtypeStruct((1, CFG.num_key_value_heads, CFG.head_dim, slots), jnp.float32)
    v = jax.ShapeDtypeStruct((1, CFG.num_key_value_heads, slots, CFG.head_dim), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, t, slots), bool)
    lowered = jax.jit(functools.partial(ops.attention, CFG)).trace(q, kt, v, mask).lower(
        lowering_platforms=(platform,))
    return lowered.as_text().count("stablehlo.dot_general")


def test_decode_attention_is_dots_on_accelerators_and_multiply_adds_on_cpu():
    """Decode-shaped attention (2 query rows per KV head): scores and p.V are dot_generals in programs
    for TPU and GPU (no f32 copy of the keys, no blocked multiply-adds); a CPU program uses the blocked
    multiply-adds, for p.V only up to `ops_cpu.SUM_MAX_SLOTS` slots. Prefill-shaped attention: dots everywhere."""
    for platform in ("tpu", "cuda"):
        assert _attention_dots(platform, 1, 40) == 2
    assert _attention_dots("cpu", 1, 40) == 0
    assert _attention_dots("cpu", 1, ops_cpu.SUM_MAX_SLOTS + 8) == 1  # p.V a dot past the limit
    assert _attention_dots("cpu", 8, 40) == _attention_dots("tpu", 8, 40) == 2


def test_causal_attention_is_one_dense_block_on_accelerators_and_query_blocks_on_cpu():
    """The training forward (no cache) over T = 2 x CAUSAL_BLOCK tokens: scores and p.V are one dot_general each
    per layer in programs for TPU and GPU; a CPU program runs them per query block (2 blocks: 4 per layer). Up to
    CAUSAL_BLOCK tokens both are dense."""
    params = jax.eval_shape(lambda: qwen3.init(CFG, jax.random.key(0)))

    def dots(platform, t):
        toks = jax.ShapeDtypeStruct((2, t), jnp.int32)
        lowered = jax.jit(lambda p, x: qwen3.hidden_states(p, CFG, x)[0]).trace(params, toks).lower(
            lowering_platforms=(platform,))
        return lowered.as_text().count("stablehlo.dot_general")

    t = 2 * ops.CAUSAL_BLOCK
    layers = CFG.num_hidden_layers
    assert dots("tpu", t) == dots("cuda", t) and dots("cpu", t) - dots("tpu", t) == 2 * layers
    assert dots("cpu", ops.CAUSAL_BLOCK) == dots("tpu", ops.CAUSAL_BLOCK)


def test_no_default_backend_in_the_package():
    """The path is never chosen from the host's backend (`jax.default_backend()`), which is 'cpu' on a
    host that compiles for TPU."""
    import pathlib
    import jaxagent
    root = pathlib.Path(jaxagent.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if "default_backend(" in p.read_text()]
    assert not offenders
