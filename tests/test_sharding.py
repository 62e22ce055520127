"""Sharding on 8 fake CPU devices (tests/conftest.py): rule table, checkpoint placement, sharded forward
and generation equal unsharded.

Legend: B batch, T tokens, V vocab; meshes are (data, fsdp, tensor).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxagent import sharding as shd
from jaxagent.models import qwen3, weights
from jaxagent.models.config import Qwen3Config
from jaxagent.sampling import GREEDY, generate
from tests.hf_reference import make_hf_qwen3

MESHES = [(2, 2, 2), (1, 4, 2), (8, 1, 1), (1, 1, 8)]
B, T = 8, 11
LENS = (11, 4, 9, 1, 7, 11, 2, 6)
MAX_NEW = 6
TOL = 1e-5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Untied (lm_head too), every dim divisible by 8 except the 2 KV heads."""
    d = str(tmp_path_factory.mktemp("hf_shard"))
    make_hf_qwen3(d, tie=False, vocab=128, hidden=64, inter=128, heads=8, kv_heads=2, head_dim=16, seed=4)
    cfg, params = weights.load(d)
    return d, cfg, params


@pytest.fixture(scope="module")
def batch(ckpt):
    _, cfg, _ = ckpt
    rng = np.random.default_rng(0)
    toks = rng.integers(1, cfg.vocab_size, (B, T)).astype(np.int32)
    mask = (np.arange(T)[None] >= T - np.asarray(LENS)[:, None]).astype(np.int32)  # left padding
    return toks, mask


@pytest.fixture(scope="module")
def reference(ckpt, batch):
    """Unsharded (single-device) logits and greedy generation."""
    _, cfg, params = ckpt
    toks, mask = batch
    logits = np.asarray(jax.jit(lambda p, t: qwen3.forward(p, cfg, t)[0])(params, toks))
    gen = generate(params, cfg, toks, jax.random.key(0), max_new_tokens=MAX_NEW, prompt_mask_BxL=mask,
                   sampler=GREEDY)
    return logits, gen


@pytest.fixture(scope="module", params=MESHES, ids=lambda m: "x".join(map(str, m)))
def sharded(request, ckpt):
    d, _, _ = ckpt
    mesh = shd.make_mesh(*request.param)
    cfg, params = weights.load(d, mesh=mesh)
    return request.param, mesh, cfg, params


# Expected specs per mesh (trailing Nones spelled out). tensor=8 cannot split 2 KV heads: replicated.
EXPECTED = {
    (2, 2, 2): {"q_proj": P("fsdp", "tensor", None), "k_proj": P("fsdp", "tensor", None),
                "o_proj": P("tensor", None, "fsdp"), "embed": P("tensor", "fsdp"),
                "lm_head": P("fsdp", "tensor"), "down_proj": P("tensor", "fsdp"), "norm": P("fsdp")},
    (1, 4, 2): {"q_proj": P("fsdp", "tensor", None), "k_proj": P("fsdp", "tensor", None),
                "o_proj": P("tensor", None, "fsdp"), "embed": P("tensor", "fsdp"),
                "lm_head": P("fsdp", "tensor"), "down_proj": P("tensor", "fsdp"), "norm": P("fsdp")},
    (8, 1, 1): {k: None for k in ("q_proj", "k_proj", "o_proj", "embed", "lm_head", "down_proj", "norm")},
    (1, 1, 8): {"q_proj": P(None, "tensor", None), "k_proj": P(None, None, None),
                "o_proj": P("tensor", None, None), "embed": P("tensor", None),
                "lm_head": P(None, "tensor"), "down_proj": P("tensor", None), "norm": P(None)},
}


def _named(params):
    a = params["layers"][1]
    return {"q_proj": a["attn"]["q_proj"], "k_proj": a["attn"]["k_proj"], "o_proj": a["attn"]["o_proj"],
            "embed": params["embed"], "lm_head": params["lm_head"], "down_proj": a["mlp"]["down_proj"],
            "norm": params["norm"]["weight"]}


def _local_shape(shape, spec, mesh):
    out = []
    for i, dim in enumerate(shape):
        axes = spec[i] if i < len(spec) else None
        names = () if axes is None else ((axes,) if isinstance(axes, str) else axes)
        out.append(dim // int(np.prod([mesh.shape[a] for a in names], dtype=int)))
    return tuple(out)


def test_params_sharded_per_rules(sharded, ckpt):
    mesh_shape, mesh, cfg, params = sharded
    ref = ckpt[2]
    for name, x in _named(params).items():
        want = EXPECTED[mesh_shape][name]
        assert isinstance(x.sharding, NamedSharding) and x.sharding.mesh == mesh
        if want is None:
            assert x.sharding.is_fully_replicated, (name, x.sharding.spec)
        else:
            assert x.sharding.is_equivalent_to(NamedSharding(mesh, want), x.ndim), (name, x.sharding.spec, want)
            # really split: each device holds only its block
            assert x.addressable_shards[0].data.shape == _local_shape(x.shape, want, mesh)
    # every leaf follows the rule table and holds the unsharded values
    axes = qwen3.logical_axes(cfg)
    flat_axes = jax.tree.leaves(axes, is_leaf=shd.is_axes)
    flat_p, flat_ref = jax.tree.leaves(params), jax.tree.leaves(ref)
    assert len(flat_axes) == len(flat_p) == len(flat_ref)
    for ax, x, r in zip(flat_axes, flat_p, flat_ref):
        want = NamedSharding(mesh, shd.spec_for(ax, x.shape, mesh))
        assert x.sharding.is_equivalent_to(want, x.ndim)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(r))
    if mesh_shape != (8, 1, 1):
        n_split = sum(not x.sharding.is_fully_replicated for x in flat_p)
        assert n_split >= len(flat_p) // 2


def test_sharded_forward_equals_unsharded(sharded, batch, reference):
    mesh_shape, mesh, cfg, params = sharded
    toks, _ = batch
    p_sh = shd.shardings_for(qwen3.logical_axes(cfg), params, mesh)
    tok_sh = shd.batch_sharding(mesh, 2, batch_size=B)
    out_sh = shd.batch_sharding(mesh, 3, batch_size=B)
    fwd = jax.jit(lambda p, t: qwen3.forward(p, cfg, t)[0], in_shardings=(p_sh, tok_sh), out_shardings=out_sh)
    logits = fwd(params, jax.device_put(toks, tok_sh))
    assert logits.sharding.is_equivalent_to(out_sh, 3)
    batch_ways = mesh_shape[0] * mesh_shape[1]
    assert logits.addressable_shards[0].data.shape == (B // batch_ways, T, cfg.vocab_size)
    assert np.abs(np.asarray(logits) - reference[0]).max() < TOL


def test_sharded_generate_equals_unsharded(sharded, batch, reference):
    mesh_shape, mesh, cfg, params = sharded
    toks, mask = batch
    ref = reference[1]
    out = generate(params, cfg, toks, jax.random.key(0), max_new_tokens=MAX_NEW, prompt_mask_BxL=mask,
                   sampler=GREEDY, mesh=mesh, return_cache=True)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=TOL)
    assert np.asarray(out.cache["length"]).tolist() == [n + MAX_NEW for n in LENS]
    # the cache and outputs follow the rule table: batch over (data, fsdp), KV heads over tensor
    want = shd.shardings_for(qwen3.cache_logical_axes(cfg), out.cache, mesh)
    for got, w in zip(jax.tree.leaves(out.cache), jax.tree.leaves(want)):
        assert got.sharding.is_equivalent_to(w, got.ndim), (got.sharding.spec, w.spec)
    assert out.tokens.sharding.is_equivalent_to(shd.batch_sharding(mesh, 2, batch_size=B), 2)
    assert len(np.unique(np.asarray(ref.tokens))) > 4  # the comparison is not trivially constant


def test_generate_on_sharded_params_without_mesh_argument(ckpt, batch, reference):
    """The default path (no mesh): the compiler propagates the params' shardings; same tokens."""
    d, _, _ = ckpt
    cfg, params = weights.load(d, mesh=shd.make_mesh(2, 2, 2))
    toks, mask = batch
    out = generate(params, cfg, toks, jax.random.key(0), max_new_tokens=MAX_NEW, prompt_mask_BxL=mask,
                   sampler=GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference[1].tokens))


# ---------------------------------------------------------------- the rule table itself
def test_divisibility_fallback_replicates_kv_heads():
    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=16)
    mesh = shd.make_mesh(2, 1, 4)
    sh = shd.shardings_for(qwen3.logical_axes(cfg), qwen3.param_shapes(cfg), mesh)
    attn = sh["layers"][0]["attn"]
    assert attn["k_proj"].spec == P(None, None, None)   # 2 KV heads on tensor=4: kept whole
    assert attn["v_proj"].spec == P(None, None, None)
    assert attn["q_proj"].spec == P(None, "tensor", None)  # 8 query heads split 4 ways
    cache_sh = shd.shardings_for(qwen3.cache_logical_axes(cfg), qwen3.init_cache(cfg, 4, 8), mesh)
    assert cache_sh["k"][0].spec == P("data", None, None, None)
    # on tensor=2 the KV heads do split
    mesh2 = shd.make_mesh(1, 4, 2)
    assert shd.spec_for(("embed", "kv_heads", "head_dim"), (64, 2, 16), mesh2) == P("fsdp", "tensor", None)


def test_multi_axis_rules_keep_the_longest_dividing_prefix():
    mesh = shd.make_mesh(2, 2, 2)
    assert shd.spec_for(("batch", None), (8, 3), mesh) == P(("data", "fsdp"), None)
    assert shd.spec_for(("batch", None), (6, 3), mesh) == P("data", None)   # 6 % 4 != 0, 6 % 2 == 0
    assert shd.spec_for(("batch", None), (3, 3), mesh) == P(None, None)
    mesh = shd.make_mesh(1, 8, 1)  # data has size 1: batch goes to fsdp alone
    assert shd.spec_for(("batch",), (16,), mesh) == P("fsdp")
    assert shd.batch_sharding(mesh, 3).spec == P("fsdp", None, None)
    assert shd.batch_sharding(mesh, 2, batch_size=3).spec == P(None, None)


def test_no_mesh_axis_used_twice():
    mesh = shd.make_mesh(1, 2, 4)
    assert shd.spec_for(("mlp", "vocab"), (8, 8), mesh) == P("tensor", None)
    assert shd.spec_for(("embed", "embed"), (8, 8), mesh) == P("fsdp", None)
    # a dim the first rule cannot split leaves the axis free for the next one
    assert shd.spec_for(("kv_heads", "vocab"), (2, 8), mesh) == P(None, "tensor")


def test_custom_rules():
    mesh = shd.make_mesh(2, 2, 2)
    rules = dict(shd.RULES, embed=None, mlp=("fsdp", "tensor"))
    assert shd.spec_for(("embed", "mlp"), (64, 128), mesh, rules) == P(None, ("fsdp", "tensor"))


def test_spec_for_errors():
    mesh = shd.make_mesh(2, 2, 2)
    with pytest.raises(ValueError, match="do not match shape"):
        shd.spec_for(("embed", "mlp"), (4,), mesh)
    with pytest.raises(ValueError, match="'heads' has no sharding rule"):
        shd.spec_for(("heads",), (8,), mesh)
    with pytest.raises(ValueError, match="'tensr'"):
        shd.spec_for(("mlp",), (8,), mesh, dict(shd.RULES, mlp="tensr"))
    with pytest.raises(ValueError, match="do not match shape"):
        shd.shardings_for({"w": ("embed",)}, {"w": np.zeros((2, 2))}, mesh)
    with pytest.raises(ValueError, match="needs 12 devices, 8 available"):
        shd.make_mesh(2, 2, 3)


def test_mesh_layout():
    mesh = shd.make_mesh(2, 2, 2)
    assert mesh.axis_names == shd.MESH_AXES
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert len(jax.devices()) == 8  # conftest's fake devices
    sub = shd.make_mesh(1, 1, 2, devices=jax.devices()[:2])
    assert sub.devices.shape == (1, 1, 2)
    x = shd.shard({"a": jnp.arange(8.0)}, {"a": shd.batch_sharding(mesh, 1)})
    assert x["a"].addressable_shards[0].data.shape == (2,)


def test_activation_constraints_pin_rows_and_vocab(sharded, batch, reference):
    """forward(mesh=...) pins the residual stream to rows over (data, fsdp) and the logits' vocab to
    tensor (the activation rules), whatever sharding the compiler would pick; same values."""
    mesh_shape, mesh, cfg, params = sharded
    toks, _ = batch
    p_sh = shd.shardings_for(qwen3.logical_axes(cfg), params, mesh)
    fwd = jax.jit(lambda p, t: qwen3.forward(p, cfg, t, mesh=mesh)[0], in_shardings=(p_sh, shd.replicated(mesh)))
    logits = fwd(params, toks)
    want = NamedSharding(mesh, shd.spec_for(qwen3.LOGITS_AXES, logits.shape, mesh))
    assert logits.sharding.is_equivalent_to(want, 3)
    assert want.spec == P(shd.batch_axes(mesh), None, "tensor" if mesh_shape[2] > 1 else None)
    jaxpr = str(jax.make_jaxpr(lambda p, t: qwen3.hidden_states(p, cfg, t, mesh=mesh)[0])(params, toks))
    assert jaxpr.count("sharding_constraint") == cfg.num_hidden_layers + 2  # table, embeddings, every block
    assert np.abs(np.asarray(logits) - reference[0]).max() < TOL


def test_constrain_reads_the_context_mesh_and_is_a_no_op_without_one():
    x = jnp.ones((8, 3, 16))
    assert shd.constrain(x, qwen3.RESIDUAL_AXES) is x
    assert {"activation_batch", "activation_seq", "activation_embed", "activation_vocab"} <= set(shd.RULES)
    mesh = shd.make_mesh(2, 2, 2)
    with jax.set_mesh(mesh):
        y = jax.jit(lambda x: shd.constrain(x * 2, qwen3.LOGITS_AXES))(x)
    assert y.sharding.spec == P(("data", "fsdp"), None, "tensor")
    np.testing.assert_array_equal(np.asarray(y), 2 * np.ones((8, 3, 16)))
