"""The jitted entry points compose: they nest inside a user's `jax.jit`, `jax.eval_shape`,
`jax.make_jaxpr` and `jax.vmap` (jax rejects compiler options on a nested jit; `xla_options.jit`
applies them when it compiles a top-level call) and give the same values nested as at top level.

Legend: B batch, T tokens, L prompt width, A replies, R reply width, V vocab.
"""
import collections
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent import xla_options
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl import train_state
from jaxagent.sampling import GREEDY, Sampler, append, decode, generate

gen_mod = importlib.import_module("jaxagent.sampling.generate")
CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
B, L, STEPS = 2, 8, 4


def _np_params(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: jnp.asarray(1.0 + 0.1 * rng.normal(size=s.shape) if s.ndim == 1
                                              else 0.3 * rng.normal(size=s.shape), jnp.float32),
                        qwen3.param_shapes(cfg))


@pytest.fixture(scope="module")
def params():
    return _np_params(CFG)


@pytest.fixture(scope="module")
def prompt():
    toks = np.random.default_rng(1).integers(1, CFG.vocab_size, (B, L)).astype(np.int32)
    return jnp.asarray(toks), jnp.ones((B, L), bool)


def _gen(p, t, m, k):
    return gen_mod.generate_jit(p, t, m, k, jnp.full((B,), STEPS, jnp.int32), cfg=CFG, max_steps=STEPS,
                             cache_len=L + STEPS, sampler=Sampler(temperature=0.8), stop_ids=(), pad_id=0)


def _same(a, b):
    """Integer and bool leaves (tokens, lengths, done flags) exactly; float leaves to a few ulp: the nested
    program is compiled without the top-level compiler options, so XLA may fuse and round differently
    (1 ulp on AMD EPYC)."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        if np.issubdtype(x.dtype, np.floating):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(x, y)


def test_xla_options_jit_keeps_options_at_top_level_only():
    f = xla_options.jit(lambda x: x * 2, compiler_options={"xla_backend_optimization_level": 0})
    assert float(f(jnp.float32(3))) == 6.0
    assert float(jax.jit(lambda x: f(x) + 1)(jnp.float32(3))) == 7.0
    # a plain jax.jit with the options cannot nest: the reason for xla_options.jit
    g = jax.jit(lambda x: x * 2, compiler_options=xla_options.DECODING_CPU_OPTIONS)
    with pytest.raises(ValueError, match="compiler_options"):
        jax.jit(lambda x: g(x) + 1)(jnp.float32(3))
    assert f._cache_size() == 1  # the top-level call's executable; the nested one is the user's program
    assert "stablehlo.multiply" in f.lower(jnp.float32(3)).as_text()


def test_options_follow_the_platform_and_the_device_count():
    """XLA:CPU options on CPU only: decoding programs turn YNNPACK off; sequence programs keep XLA's defaults on one
    device and turn it off over several; GPU and TPU compiles get none, `extra` goes on everywhere."""
    device = collections.namedtuple("Device", "platform id")
    cpu, tpu = [device("cpu", i) for i in range(2)], [device("tpu", i) for i in range(2)]
    off = {"xla_cpu_experimental_ynn_fusion_type": ""}
    assert xla_options.options(cpu[:1]) == xla_options.options(cpu) == off
    assert xla_options.options(cpu[:1], sequence=True) == {}
    assert xla_options.options(cpu, sequence=True) == off
    assert xla_options.options(tpu) == xla_options.options(tpu[:1], sequence=True) == {}
    assert xla_options.options(tpu, extra={"a": 1}) == {"a": 1}
    assert xla_options.options(cpu[:1], sequence=True, extra={"a": 1}) == {"a": 1}
    with pytest.raises(ValueError, match="no devices"):
        xla_options.options([])


def _only_readers_fail(monkeypatch, programs, readers: dict):
    """For each option set named in `readers`, an option value XLA rejects put in it fails exactly the programs
    (names from `programs()`: (name, thunk) pairs, built after the patch) listed for it; the others run."""
    bogus = {"xla_cpu_experimental_ynn_fusion_type": "not-a-fusion"}
    for patched, failing in readers.items():
        with monkeypatch.context() as m:
            m.setattr(xla_options, patched, bogus)
            for name, run in programs():
                if name in failing:
                    with pytest.raises(Exception, match="not-a-fusion|not a valid enum"):
                        jax.block_until_ready(run())
                else:
                    jax.block_until_ready(run())


def test_sequence_programs_compile_with_the_sequence_options(monkeypatch, params):
    """Programs over whole sequences (the train step, the SFT step, full-row log-probs) compile with
    `SEQUENCE_CPU_OPTIONS` on one CPU device, every other entry point with `DECODING_CPU_OPTIONS`: an option value
    XLA rejects put in one set fails exactly the programs that read it. (A module-level entry point, e.g.
    generation, keeps the executables it compiled earlier in this process: a fresh decoding jit stands for them.)"""
    from jaxagent.rl import logprobs, sft, train_step
    tokens = jnp.asarray(np.random.default_rng(2).integers(1, CFG.vocab_size, (2, 8)), jnp.int32)
    mask = jnp.zeros((2, 8), bool).at[:, 4:].set(True)
    batch = {"tokens": tokens, "policy_mask": mask, "advantages": jnp.ones((2, 8)), "old_logprobs": jnp.zeros((2, 8))}
    tx = optax.sgd(1e-3)

    def programs():
        p = jax.tree.map(jnp.copy, params)
        state = train_state.init_train_state(CFG, tx, jax.random.key(0), params=p)
        yield "train", lambda: train_step.build_train_step(CFG, tx, train_state.LossSettings())(state, batch)
        yield "sft", lambda: sft.make_sft_step(CFG, tx)(jax.tree.map(jnp.copy, params), tx.init(params), tokens, mask)
        yield "logprobs", lambda: logprobs.make_logprobs_fn(CFG)(params, tokens)
        yield "decode", lambda: xla_options.jit(lambda x: x * 2)(tokens)

    _only_readers_fail(monkeypatch, programs, {"SEQUENCE_CPU_OPTIONS": {"train", "sft", "logprobs"},
                                               "DECODING_CPU_OPTIONS": {"decode"}})


def _sharded_sequence_setup(params):
    """(mesh of 2 devices, the params replicated on it, a batch over its rows, the same tokens and mask unplaced)."""
    from jaxagent import sharding
    mesh = sharding.make_mesh(2, 1, 1, devices=jax.devices()[:2])
    tokens = jnp.asarray(np.random.default_rng(3).integers(1, CFG.vocab_size, (2, 8)), jnp.int32)
    mask = jnp.zeros((2, 8), bool).at[:, 4:].set(True)
    rows = sharding.row_sharding(mesh)
    batch = {"tokens": tokens, "policy_mask": mask, "advantages": jnp.ones((2, 8)), "old_logprobs": jnp.zeros((2, 8))}
    batch = {k: jax.device_put(v, rows) for k, v in batch.items()}
    return mesh, jax.device_put(params, sharding.replicated(mesh)), batch, tokens, mask


def test_sequence_programs_over_several_devices_keep_the_decoding_options(monkeypatch, params):
    """Partitioned over several devices the sequence programs compile with `DECODING_CPU_OPTIONS` (YNNPACK ran the
    ci-sql step there slower, at twice the peak memory): the builders given a mesh of 2 devices, and the SFT step
    and teacher-forced scoring (built without a mesh) called on arguments sharded over 2 devices; on one device the
    same SFT step reads `SEQUENCE_CPU_OPTIONS`."""
    from jaxagent.eval import scoring
    from jaxagent.rl import logprobs, sft, train_step
    mesh, placed, batch, tokens, mask = _sharded_sequence_setup(params)
    tx = optax.sgd(1e-3)

    def programs():
        scoring_jit = xla_options.jit(scoring.token_logprobs, static_argnums=1, sequence=True)  # as the module's
        state = train_state.init_train_state(CFG, tx, jax.random.key(0), mesh=mesh)
        yield "train", lambda: train_step.build_train_step(CFG, tx, train_state.LossSettings(), mesh=mesh)(
            state, batch)
        yield "logprobs", lambda: logprobs.make_logprobs_fn(CFG, mesh=mesh)(placed, batch["tokens"])
        yield "sft", lambda: sft.make_sft_step(CFG, tx)(jax.tree.map(jnp.copy, placed), tx.init(placed),
                                                        batch["tokens"], batch["policy_mask"])
        yield "scoring", lambda: scoring_jit(placed, CFG, batch["tokens"])
        yield "sft_one_device", lambda: sft.make_sft_step(CFG, tx)(jax.tree.map(jnp.copy, params), tx.init(params),
                                                                   tokens, mask)

    _only_readers_fail(monkeypatch, programs, {"SEQUENCE_CPU_OPTIONS": {"sft_one_device"},
                                               "DECODING_CPU_OPTIONS": {"train", "logprobs", "sft", "scoring"}})


def test_what_aot_compiles_for_a_mesh_is_what_a_call_on_that_mesh_runs(params):
    """The SFT step (built without a mesh) and the train step built for a mesh of 2 devices, called on arguments
    placed on it: the executable the call ran is the one `.compile` makes from abstract arguments carrying the same
    shardings (what the AOT check lowers), the same optimised program text; `.lower` of the abstract arguments is the
    call's lowering; and the one-device options would have compiled a different program (YNNPACK's fusions)."""
    from jaxagent.rl import sft, train_step
    mesh, placed, batch, _, _ = _sharded_sequence_setup(params)
    tx = optax.sgd(1e-3)
    abstract = lambda tree: jax.tree.map(  # noqa: E731
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
    state = train_state.init_train_state(CFG, tx, jax.random.key(0), mesh=mesh)
    calls = {"sft": (sft.make_sft_step(CFG, tx), (placed, tx.init(placed), batch["tokens"], batch["policy_mask"])),
             "train": (train_step.build_train_step(CFG, tx, train_state.LossSettings(), mesh=mesh), (state, batch))}
    for name, (program, args) in calls.items():
        shapes = abstract(args)
        lowered = program.lower(*shapes)
        assert lowered.as_text() == program.lower(*args).as_text(), name
        aot = program.compile(*shapes).as_text()
        jax.block_until_ready(program(*jax.tree.map(jnp.copy, args)))
        (ran,) = [executable for compiled in program._executables.values() for _, executable, _ in compiled]
        assert ran.as_text() == aot, name
        assert lowered.compile(xla_options.SEQUENCE_CPU_OPTIONS or None).as_text() != aot, name


def test_generate_nests_in_jit_eval_shape_make_jaxpr_and_vmap(params, prompt):
    toks, mask = prompt
    key = jax.random.key(3)
    top = _gen(params, toks, mask, key)
    _same(jax.jit(_gen)(params, toks, mask, key), top)
    shapes = jax.eval_shape(_gen, params, toks, mask, key)
    assert shapes.tokens.shape == (B, STEPS) and shapes.logprobs.dtype == jnp.float32
    assert "while" in str(jax.make_jaxpr(_gen)(params, toks, mask, key))
    keys = jax.random.split(jax.random.key(4), 3)  # several samples of the same prompts
    many = jax.vmap(_gen, in_axes=(None, None, None, 0))(params, toks, mask, keys)
    assert many.tokens.shape == (3, B, STEPS)
    np.testing.assert_array_equal(np.asarray(many.tokens[1]), np.asarray(_gen(params, toks, mask, keys[1]).tokens))


def test_public_generate_inside_jit(params, prompt):
    """`generate` itself (host checks on concrete inputs) inside a user's jit: checks that need values
    are skipped for traced inputs, so it needs an explicit `max_steps` there."""
    toks, mask = prompt
    key = jax.random.key(5)
    kw = dict(max_new_tokens=STEPS, max_steps=STEPS, sampler=GREEDY)
    top = generate(params, CFG, toks, key, prompt_mask_BxL=mask, **kw)
    nested = jax.jit(lambda p, t, m: generate(p, CFG, t, key, prompt_mask_BxL=m, **kw))(params, toks, mask)
    _same(nested.tokens, top.tokens)
    with pytest.raises(ValueError, match="max_steps"):
        jax.jit(lambda t: generate(params, CFG, t, key, max_new_tokens=STEPS).tokens)(toks)


def test_append_and_decode_nest(params, prompt):
    toks, _ = prompt

    def prefill_decode(p, t, k):
        cache = qwen3.init_cache(CFG, B, L + STEPS)
        logits, cache = append(p, CFG, cache, t, jnp.full((B,), L, jnp.int32))
        return decode(p, CFG, cache, logits, k, STEPS, max_steps=STEPS, sampler=GREEDY, stop_ids=())

    key = jax.random.key(0)
    out = jax.jit(prefill_decode)(params, toks, key)
    assert jax.eval_shape(prefill_decode, params, toks, key).tokens.shape == (B, STEPS)
    # greedy: the same tokens as generate's
    ref = generate(params, CFG, toks, key, max_new_tokens=STEPS, max_steps=STEPS, sampler=GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


def test_host_loop_jits_nest(params, prompt):
    from jaxagent.rollout import host_policy
    toks, _ = prompt
    cache = qwen3.init_cache(CFG, B, L + STEPS)
    n = jnp.full((B,), L, jnp.int32)
    logits0 = jnp.zeros((B, CFG.vocab_size), jnp.float32)

    def both(p, c, t, k):
        logits, c = host_policy.append_jit(p, c, t, n, logits0, cfg=CFG)
        return host_policy.decode_jit(p, c, logits, k, jnp.ones((B,), bool), cfg=CFG, max_steps=STEPS,
                                      sampler=GREEDY, stop_ids=(), pad_id=0)

    out = jax.jit(both)(params, cache, toks, jax.random.key(0))
    ref = generate(params, CFG, toks, jax.random.key(0), max_new_tokens=STEPS, max_steps=STEPS, sampler=GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert jax.eval_shape(both, params, cache, toks, jax.random.key(0)).tokens.shape == (B, STEPS)


def test_eval_driver_jits_nest(params, prompt):
    from jaxagent.eval import scoring
    toks, _ = prompt
    top = scoring.token_logprobs_jit(params, CFG, toks)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda p, t: scoring.token_logprobs_jit(p, CFG, t))(params, toks)),
                               np.asarray(top), rtol=1e-6, atol=1e-6)
    stacked = jnp.stack([toks, toks[::-1]])
    many = jax.vmap(lambda t: scoring.token_logprobs_jit(params, CFG, t))(stacked)
    np.testing.assert_allclose(np.asarray(many[0]), np.asarray(top), rtol=1e-5, atol=1e-5)
    ctx_len = jnp.asarray([L, L - 3], jnp.int32)
    replies = toks[:, :3]
    reply_len = jnp.asarray([3, 2], jnp.int32)
    score = lambda p: scoring.reply_logprobs_jit(p, toks, ctx_len, replies, reply_len, cfg=CFG,  # noqa: E731
                                                 temperature=1.0)
    np.testing.assert_allclose(np.asarray(jax.jit(score)(params)), np.asarray(score(params)), rtol=1e-5, atol=1e-5)
    assert jax.eval_shape(score, params).shape == (B, 2)


@pytest.mark.slow
def test_rollout_jit_nests():
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
    args = (_np_params(cfg), sample_tasks(jax.random.key(0), B, 4, 0.8), jnp.asarray([1, 2], jnp.int32),
            jax.random.key(1), FrozenLakeParams(horizon=2), jnp.asarray(False), jnp.full((B, 2), -1, jnp.int32))
    run = lambda *a: rollout_jit(*a, cfg=cfg, env=env, layout=layout, fmt=fmt, rcfg=rcfg)  # noqa: E731
    shapes = jax.eval_shape(run, *args)
    assert shapes.tokens.shape == (B, 256)
    _same(jax.jit(run)(*args).tokens, run(*args).tokens)


@pytest.mark.slow
def test_train_and_sft_steps_nest():
    from jaxagent.rl import sft
    from jaxagent.rl import train_step as ts
    params = _np_params(CFG)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, L)), jnp.int32)
    batch = {"tokens": tokens, "policy_mask": jnp.ones((B, L), bool).at[:, :2].set(False),
             "advantages": jnp.asarray(rng.normal(size=(B, L)), jnp.float32),
             "old_logprobs": jnp.full((B, L), -np.log(CFG.vocab_size), jnp.float32)}
    tx = optax.sgd(0.1)
    step = ts.build_train_step(CFG, tx, train_state.LossSettings())
    state = train_state.init_train_state(CFG, tx, jax.random.key(0), params=params)
    shapes = jax.eval_shape(step, state, batch)
    assert jax.tree.structure(shapes[0]) == jax.tree.structure(state)
    assert "dot_general" in str(jax.make_jaxpr(step)(state, batch))
    nested_state, nested_metrics = jax.jit(lambda s, b: step(s, b))(state, batch)
    state2 = train_state.init_train_state(CFG, tx, jax.random.key(0), params=params)
    top_state, top_metrics = step(state2, batch)
    np.testing.assert_allclose(float(nested_metrics["loss"]), float(top_metrics["loss"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(nested_state.params), jax.tree.leaves(top_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)

    sft_step = sft.make_sft_step(CFG, tx)
    opt_state = tx.init(params)
    mask = jnp.ones((B, L), bool)
    shapes = jax.eval_shape(sft_step, params, opt_state, tokens, mask)
    assert shapes[2]["loss"].shape == ()
    _, _, m_nested = jax.jit(lambda p, o: sft_step(p, o, tokens, mask))(params, opt_state)
    _, _, m_top = sft_step(jax.tree.map(jnp.copy, params), tx.init(params), tokens, mask)
    np.testing.assert_allclose(float(m_nested["loss"]), float(m_top["loss"]), rtol=1e-5)
