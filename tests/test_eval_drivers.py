"""The eval drivers on the toy FrozenLake world: Pass@(K,T) modes, upper bound, exact action scoring, matched
step quality, error states with forced replay, likelihood and R_single.

Policies are hand-built "bigram" Qwen3s: the next-token logits are set mostly by the current token (the
assistant opener -> an action with fixed preferences, an action -> <|im_end|>), so episodes move, reach the
goal and write canonical replies. `blind` zeroes attention and MLP outputs, so its logits depend on the
current token only: it literally ignores the budget text. One rollout compile (B=8, T_max=4) serves all.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.envs.jax.frozenlake import FrozenLakeParams
from jaxagent.eval import driver_common, pass_drivers, scoring, state_drivers
from jaxagent.eval import step_quality as sq
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rollout import RolloutConfig
from jaxagent.rollout.jax_loop import rollout_jit
from jaxagent.sampling import Sampler
from jaxagent.study.toy import make_toy_world

T_MAX, BATCH, N_TASKS, N_SAMPLES, KS, N_STATES, SCORE = 4, 8, 4, 2, (1, 2), 4, 8
ROW_TASK = np.repeat(np.arange(N_TASKS), 2)  # the shared rollouts: two episodes per task, one batch
TIERS = (1, 2, 3, 4)
ENV_PARAMS = FrozenLakeParams(horizon=T_MAX)


@pytest.fixture(scope="module")
def compiles_before():
    return rollout_jit._cache_size(), scoring.reply_logprobs_jit._cache_size()


@pytest.fixture(scope="module")
def world(tmp_path_factory, compiles_before):
    return make_toy_world(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def cfg(world):
    return Qwen3Config(vocab_size=world.tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)


def bigram_params(world, cfg, seed, prefs, *, blind=False):
    """Embeddings on basis directions 0..4: the opener's last token on e0, action a on prefs[a] e0 + e_{1+a},
    <|im_end|> on 8 (e1 + .. + e4); every other token has no component there (tied unembedding)."""
    p = qwen3.init(cfg, jax.random.key(seed))
    emb = p["embed"].at[:, :5].set(0.0)
    opener = world.layout.close[-1]
    emb = emb.at[opener].set(0.0).at[opener, 0].set(0.1)
    for a, tok in enumerate(np.asarray(world.codec.action_tokens_AxPa)[:, 0]):
        emb = emb.at[tok].set(0.0).at[tok, 0].set(prefs[a]).at[tok, 1 + a].set(1.0)
    stop = world.layout.stop_ids[0]
    emb = emb.at[stop].set(0.0).at[stop, 1:5].set(8.0)
    p["embed"] = emb
    if blind:
        layer = p["layers"][0]
        layer["attn"]["o_proj"] = jnp.zeros_like(layer["attn"]["o_proj"])
        layer["mlp"]["down_proj"] = jnp.zeros_like(layer["mlp"]["down_proj"])
    return p


@pytest.fixture(scope="module")
def policies(world, cfg):
    return {"base": bigram_params(world, cfg, 0, (0.4, 1.2, 1.2, 0.4)),
            "rl": bigram_params(world, cfg, 1, (0.0, 1.5, 1.3, 0.0)),
            "blind": bigram_params(world, cfg, 2, (0.4, 1.2, 1.2, 0.4), blind=True)}


@pytest.fixture(scope="module")
def rcfg():
    return RolloutConfig(t_max=T_MAX, max_action_tokens=4, max_context=256, sampler=Sampler(temperature=1.0),
                         allow_forced=True)


MAPS = """
FFFF FFFF FFFF FFFF
FHFF FFFF FHFF FSFF
FFFF HFSF FSFF FFHF
FFSG FFHG FFFG FFFG
"""  # four 4x4 maps side by side (S start, G goal, H hole): shortest paths 1, 2, 3 and 4 moves


@pytest.fixture(scope="module")
def tasks():
    """Maps whose shortest paths are 1, 2, 3 and 4 moves, so every budget tier is partly solvable."""
    code = {"F": fls.FROZEN, "H": fls.HOLE, "S": fls.START, "G": fls.GOAL}
    rows = [line.split() for line in MAPS.strip().splitlines()]
    return jnp.asarray([[[code[c] for c in row[m]] for row in rows] for m in range(4)], jnp.int8)


@pytest.fixture(scope="module")
def passes(world, cfg, policies, tasks, rcfg):
    out = {}
    for name in ("blind", "base"):
        for mode in pass_drivers.MODES:
            out[name, mode] = pass_drivers.pass_kt(world, cfg, policies[name], tasks, jax.random.key(7), t_max=T_MAX,
                                                   tiers=TIERS, n_samples=N_SAMPLES, ks=KS, env_params=ENV_PARAMS,
                                                   rcfg=rcfg, mode=mode, batch_size=BATCH, n_boot=200)
    return out


@pytest.fixture(scope="module")
def rollouts(world, cfg, policies, tasks, rcfg):
    run = lambda name, seed: driver_common.run_rollouts(world, cfg, policies[name], tasks[ROW_TASK],  # noqa: E731
                                                        np.full(ROW_TASK.size, T_MAX), jax.random.key(seed), ENV_PARAMS,
                                                        rcfg, batch_size=BATCH)
    return run("base", 11), run("rl", 12)


# ----------------------------------------------------------------------------- Pass@(K,T)
def test_pass_kt_shapes_and_monotone(passes):
    for (name, mode), res in passes.items():
        assert res["grid"].shape == (len(TIERS), len(KS)) and res["per_task"].shape == (len(TIERS), len(KS), N_TASKS)
        assert res["success"].shape == (len(TIERS), N_TASKS, N_SAMPLES)
        assert (np.diff(res["per_task"], axis=1) >= 0).all()  # monotone in K
        np.testing.assert_allclose(res["grid"], res["per_task"].mean(-1), atol=1e-6)
        np.testing.assert_allclose(res["pass_at_t"], res["grid"][:, -1], atol=1e-6)
        ci = res["pass_at_t_ci"]
        assert (ci["lo"] <= res["pass_at_t"] + 1e-6).all() and (res["pass_at_t"] <= ci["hi"] + 1e-6).all()
        c = res["costs"]
        assert (c["mean_turns"] <= np.asarray(TIERS) + 1e-6).all()
        np.testing.assert_array_equal(c["status_counts"].sum(-1), N_TASKS * N_SAMPLES)
        np.testing.assert_allclose(c["mean_env_calls"], c["mean_turns"])
        if mode == "truncated":
            assert (np.diff(res["per_task"], axis=0) >= 0).all()  # monotone in T: success within T
    assert passes["base", "announced"]["grid"].max() > 0  # the policies do reach the goal


def test_hidden_equals_truncated(passes):
    """Same key and rows at every tier: the budget-hidden run at tier T is the T_max run's first T turns."""
    for name in ("base", "blind"):
        hid, trunc = passes[name, "hidden"], passes[name, "truncated"]
        np.testing.assert_array_equal(hid["success"], trunc["success"])
        for k in ("mean_turns", "mean_gen_tokens", "truncation_rate", "status_counts", "success_rate"):
            np.testing.assert_allclose(hid["costs"][k], trunc["costs"][k], err_msg=k)


def test_announced_equals_truncated_when_budget_text_is_ignored(passes):
    """A policy blind to the budget text gives the same Pass@(K,T) in both modes."""
    ann, trunc = passes["blind", "announced"], passes["blind", "truncated"]
    np.testing.assert_array_equal(ann["success"], trunc["success"])
    np.testing.assert_array_equal(ann["grid"], trunc["grid"])


def test_pass_kt_rejects_bad_input(world, cfg, policies, tasks, rcfg):
    kw = dict(t_max=T_MAX, n_samples=N_SAMPLES, env_params=ENV_PARAMS, rcfg=rcfg)
    with pytest.raises(ValueError, match="mode"):
        pass_drivers.pass_kt(world, cfg, policies["base"], tasks, jax.random.key(0), ks=KS, mode="sideways", **kw)
    with pytest.raises(ValueError, match="ks"):
        pass_drivers.pass_kt(world, cfg, policies["base"], tasks, jax.random.key(0), ks=(1, 3), **kw)
    with pytest.raises(ValueError, match="t_max"):
        pass_drivers.pass_kt(world, cfg, policies["base"], tasks, jax.random.key(0), ks=KS, **{**kw, "t_max": 5})


# ----------------------------------------------------------------------------- upper bound
def test_upper_bound_dominates_and_matches_dp(world, tasks, passes):
    ub = pass_drivers.upper_bound(world, tasks, tiers=TIERS, ks=KS, env_params=ENV_PARAMS)
    np.testing.assert_array_equal(ub["min_turns"], [1, 2, 3, 4])
    np.testing.assert_array_equal(ub["p_star"], (np.arange(1, 5)[None] <= np.asarray(TIERS)[:, None]).astype(float))
    for res in passes.values():
        assert (ub["per_task"] >= res["per_task"] - 1e-6).all()
        assert (ub["grid"] >= res["grid"] - 1e-6).all()
    # The max-probability DP agrees with BFS on the deterministic lake; slipping can only lower it.
    dp = np.asarray(pass_drivers.slippery_p_star(jnp.asarray(tasks), 1.0, horizon=T_MAX))[:, list(TIERS)].T
    np.testing.assert_allclose(dp, ub["p_star"], atol=1e-6)
    slip = pass_drivers.upper_bound(world, tasks, tiers=TIERS, ks=KS,
                                    env_params=ENV_PARAMS._replace(success_rate=1 / 3))
    assert (slip["p_star"] <= ub["p_star"] + 1e-6).all() and (slip["p_star"] > 0).any()
    assert (np.diff(slip["p_star"], axis=0) >= -1e-6).all()  # p_star [U, P]: rises with the tier


# ----------------------------------------------------------------------------- exact scoring
def _canonical_turns(world, r):
    """(episode, turn, action) of turns whose sampled reply is exactly a canonical reply."""
    replies, lens = scoring.canonical_replies(world)
    toks, start, span = np.asarray(r.tokens), np.asarray(r.turns.span_start), np.asarray(r.turns.span_len)
    act, forced = np.asarray(r.turns.action), np.asarray(r.turns.forced)
    out = []
    for b, t in zip(*np.nonzero(np.asarray(r.turns.active) & ~forced)):
        a = act[b, t]
        s = start[b, t]
        if a >= 0 and span[b, t] == lens[a] and (toks[b, s:s + lens[a]] == replies[a, :lens[a]]).all():
            out.append((b, t, a))
    return out


def test_reply_logprobs_match_sampler(world, cfg, policies, rollouts):
    r = rollouts[0]
    hits = _canonical_turns(world, r)
    assert len(hits) >= 4
    b, t, a = (np.asarray(x) for x in zip(*hits))
    ctx, start, _, _ = state_drivers.state_contexts(r, b, t)
    lp = np.asarray(scoring.reply_logprobs(world, cfg, policies["base"], ctx, start, score_batch=SCORE))
    got = lp[np.arange(len(a)), a]
    logprobs, span = np.asarray(r.logprobs), np.asarray(r.turns.span_len)
    want = np.asarray([logprobs[i, s:s + n].sum() for i, s, n in zip(b, np.asarray(start), span[b, t])])
    np.testing.assert_allclose(got, want, atol=1e-4)
    probs = np.asarray(scoring.next_action_probs(world, cfg, policies["base"], ctx, start, score_batch=SCORE))
    assert (probs >= 0).all() and (probs[:, :4].sum(1) <= 1 + 1e-6).all()
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    assert probs[:, :4].sum(1).min() > 0.5  # the bigram policy mostly answers canonically


def test_hand_built_tables(world, rollouts):
    """Scoring on hand-made probability tables at real states: optimal beats uniform wherever q varies."""
    r = rollouts[0]
    b, t = np.nonzero(np.asarray(r.turns.active))
    states = jax.tree.map(lambda x: x[b, t], r.env_states)
    h = np.asarray(r.turns.remaining)[b, t]
    q = np.asarray(scoring.q_outcomes(world, states, h, ENV_PARAMS))
    # q matches the solver, the invalid outcome is scored as invalid: the worst value (0), not staying put
    def solve(map_LxL):
        mdp = fls.mdp_from_map(map_LxL, 1.0)
        return fls.q_star(mdp.P_XxAxX, mdp.reward_XxA, mdp.terminal_X, T_MAX, 0.95)
    Q = np.asarray(jax.jit(jax.vmap(solve))(states.map_LxL))  # [S, h, cell, action]
    pos, idx = np.asarray(states.pos), np.arange(len(b))
    np.testing.assert_allclose(q[:, :4], Q[idx, h, pos], atol=1e-6)
    np.testing.assert_array_equal(q[:, 4], 0.0)
    assert (q[:, :4].max(1) > 0).any()  # states where staying put would have been worth gamma V* > 0
    s = len(b)
    optimal = np.eye(5)[q[:, :4].argmax(1)]
    uniform = np.full((s, 5), 0.2)
    varies = q.max(1) - q.min(1) > 1e-6
    assert varies.any()
    ones = np.ones((s, 1), bool)
    e_opt, e_uni = scoring.expected_quality(optimal, q), scoring.expected_quality(uniform, q)
    np.testing.assert_allclose(e_uni, q.mean(1), atol=1e-6)
    res = sq.step_quality(np.asarray(e_uni)[:, None], ones, np.asarray(e_opt)[:, None], ones, state_mask_I=varies)
    assert res["share_rl_better"] == 1.0 and res["share_rl_worse"] == 0.0
    same = sq.step_quality(np.asarray(e_uni)[:, None], ones, np.asarray(e_uni)[:, None], ones)
    assert same["share_equal"] == 1.0
    # inverse-CDF draws, and common random numbers: the optimal policy's G draws are all its best action
    u = jax.random.uniform(jax.random.key(0), (s, 16))
    np.testing.assert_array_equal(scoring.sample_outcomes(u, optimal), np.repeat(q[:, :4].argmax(1)[:, None], 16, 1))
    draws = scoring.sample_outcomes(jnp.asarray([[0.1, 0.25, 0.6, 0.999]]), jnp.asarray([[0.2, 0.3, 0.5]]))
    np.testing.assert_array_equal(draws, [[0, 1, 2, 2]])


# ----------------------------------------------------------------------------- matched step quality
@pytest.fixture(scope="module")
def sq_runs(world, cfg, policies, tasks, rcfg, rollouts):
    kw = dict(t_max=T_MAX, n_states=N_STATES, env_params=ENV_PARAMS, rcfg=rcfg, batch_size=BATCH, score_batch=SCORE)
    return {"self": state_drivers.step_quality_matched(world, cfg, policies["base"], policies["base"], tasks,
                                                       jax.random.key(3), rollouts=rollouts, **kw),
            "pair": state_drivers.step_quality_matched(world, cfg, policies["base"], policies["rl"], tasks,
                                                       jax.random.key(3), rollouts=rollouts, **kw)}


def test_step_quality_self_ties_everywhere(sq_runs):
    res = sq_runs["self"]
    assert res["mask"].all() and res["exact"]["n_states"] == 2 * N_STATES
    for name in ("exact", "sampled", "exact_from_base", "sampled_from_rl"):
        assert res[name]["share_equal"] == 1.0, name
        assert res[name]["mean_q_base"] == res[name]["mean_q_rl"]
    np.testing.assert_array_equal(res["probs_base"], res["probs_rl"])


def test_step_quality_pair(world, cfg, policies, rollouts, sq_runs):
    res = sq_runs["pair"]
    ex = res["exact"]
    assert abs(ex["share_rl_better"] + ex["share_equal"] + ex["share_rl_worse"] - 1) < 1e-6
    assert ex["share_equal"] < 1.0  # different policies, different qualities
    np.testing.assert_allclose(res["q_exact_rl"], (res["probs_rl"] * res["q"]).sum(1), atol=1e-6)
    assert res["q_sampled_base"].shape == (2 * N_STATES, 16)
    assert ((res["depth"] >= 0) & (res["depth"] < 1)).all()
    np.testing.assert_array_equal(res["source"], np.repeat([0, 1], N_STATES))
    by = res["exact_by_depth"]
    assert by["share_rl_better"].shape == (4,) and np.nansum(by["n_states"]) == ex["n_states"]
    # both policies scored on the SAME context: the RL policy at base-drawn states sees base's history
    r_base = rollouts[0]
    b, t = res["episode"][:N_STATES], res["turn"][:N_STATES]
    assert np.asarray(r_base.turns.active)[b, t].all()
    ctx, start, _, h = state_drivers.state_contexts(r_base, b, t)
    np.testing.assert_array_equal(res["remaining"][:N_STATES], h)
    probs_rl = np.asarray(scoring.next_action_probs(world, cfg, policies["rl"], ctx, start, score_batch=SCORE))
    np.testing.assert_allclose(res["probs_rl"][:N_STATES], probs_rl, atol=1e-6)


# ----------------------------------------------------------------------------- error states
@pytest.fixture(scope="module")
def err_runs(world, cfg, policies, tasks, rcfg, rollouts):
    kw = dict(t_max=T_MAX, n_states=N_STATES, env_params=ENV_PARAMS, rcfg=rcfg, batch_size=BATCH, score_batch=SCORE,
              n_continuations=2, n_boot=200, rollouts=rollouts)
    return {"pair": state_drivers.error_states(world, cfg, policies["base"], policies["rl"], tasks, jax.random.key(5),
                                               return_rollouts=True, **kw),
            "self": state_drivers.error_states(world, cfg, policies["base"], policies["base"], tasks, jax.random.key(5),
                                               **kw)}


def test_error_action_is_legal_nonterminating_and_worst(world, rollouts, err_runs):
    res = err_runs["pair"]
    mask = res["mask"]
    assert mask.sum() >= 2
    nxt = fls.next_state_table(4)
    for i in np.flatnonzero(mask):
        r = rollouts[res["source"][i]]
        b, t, a = res["episode"][i], res["turn"][i], res["action"][i]
        assert 0 <= a < 4
        map_ = np.asarray(r.env_states.map_LxL[b, t]).reshape(-1)
        pos = int(r.env_states.pos[b, t])
        q = res["pre_q"][i]
        assert q[a] < q.max()
        non_term = np.asarray([map_[nxt[pos, x]] not in (fls.HOLE, fls.GOAL) for x in range(4)])
        assert non_term[a]
        cands = non_term & (q < q.max())
        assert q[a] == q[cands].min() and a == np.flatnonzero(cands & (q == q[cands].min()))[0]
        assert res["remaining"][i] == int(r.turns.remaining[b, t]) - 1 >= 1


def test_forced_replay_reproduces_states(rollouts, err_runs):
    res = err_runs["pair"]
    nxt = fls.next_state_table(4)
    c = res["success_base"].shape[1]
    assert res["replay_ok"][res["mask"]].all()
    for name in ("continuation_base", "continuation_rl"):
        cont = res["rollouts"][name]
        for i in np.flatnonzero(res["mask"]):
            r = rollouts[res["source"][i]]
            b, t, a = res["episode"][i], res["turn"][i], res["action"][i]
            rows = slice(i * c, (i + 1) * c)
            pos = np.asarray(cont.env_states.pos[rows])
            traj = np.asarray(r.env_states.pos[b, :t + 1])
            np.testing.assert_array_equal(pos[:, :t + 1], np.broadcast_to(traj, (c, t + 1)))
            assert (pos[:, t + 1] == nxt[int(r.env_states.pos[b, t]), a]).all()
            forced = np.asarray(cont.turns.forced[rows])
            assert forced[:, :t + 1].all() and not forced[:, t + 1:].any()
            assert (np.asarray(cont.turns.action[rows, t]) == a).all()
            # (a)'s context ends like the replay's: the injected canonical reply, then turn t + 1's prompt chunk
            ctx, n = res["context"][i], res["context_len"][i]
            tail = ctx[r.turns.span_start[b, t]:n]
            start = np.asarray(cont.turns.span_start[rows])
            for row in range(c):
                got = np.asarray(cont.tokens[i * c + row, start[row, t]:start[row, t] + tail.size])
                np.testing.assert_array_equal(got, tail)
                assert start[row, t] + tail.size == start[row, t + 1]
            np.testing.assert_array_equal(np.asarray(cont.turns.action[rows, :t]),
                                          np.broadcast_to(np.asarray(r.turns.action[b, :t]), (c, t)))
    m = res["metrics"]
    for k in ("share_rl_better", "success_rl", "success_base"):
        assert 0 <= m[k]["lo"] <= m[k]["mean"] <= m[k]["hi"] <= 1
    np.testing.assert_allclose(m["success_rl"]["mean"], res["success_rl"][res["mask"]].mean(), atol=1e-6)


def test_error_states_self_ties(err_runs):
    m, res = err_runs["self"]["metrics"], err_runs["self"]
    assert m["share_rl_better"]["mean"] == 0 and m["share_rl_worse"]["mean"] == 0
    assert m["success_diff"]["mean"] == 0 and m["success_diff"]["lo"] == 0 == m["success_diff"]["hi"]
    assert res["sampled"]["share_equal"] == 1.0


def test_control_continues_the_same_cell_after_the_trajectorys_own_optimal_move(rollouts, err_runs):
    """The control of finding 4: from the same cell, the trajectory's own move (valid, optimal: Q*_h = V* > 0, not
    ending the episode) replayed instead of the error; same path up to t, the trajectory's cell at t + 1."""
    res = err_runs["pair"]
    c = res["success_base"].shape[1]
    ok = res["control_ok"]
    assert ok.any() and not ok[~res["mask"]].any()
    for i in np.flatnonzero(res["mask"]):
        r = rollouts[res["source"][i]]
        b, t = res["episode"][i], res["turn"][i]
        own, q = int(r.turns.action[b, t]), res["pre_q"][i]
        should = (0 <= own < 4 and q[own] == q.max() > 0 and t + 1 < T_MAX and bool(r.turns.active[b, t + 1]))
        assert ok[i] == should, i
        if not ok[i]:
            continue
        rows = slice(i * c, (i + 1) * c)
        for name in ("control_base", "control_rl"):
            cont = res["rollouts"][name]
            pos = np.asarray(cont.env_states.pos[rows])
            np.testing.assert_array_equal(pos[:, :t + 2], np.broadcast_to(np.asarray(r.env_states.pos[b, :t + 2]),
                                                                          (c, t + 2)))
            assert (np.asarray(cont.turns.action[rows])[:, t] == own).all()
    # the same policy on both sides with the same key: the control gap is exactly 0, as the error gap is
    same = err_runs["self"]
    np.testing.assert_array_equal(same["success_control_rl"], same["success_control_base"])


def test_error_states_needs_deterministic_lake(world, cfg, policies, tasks, rcfg):
    with pytest.raises(ValueError, match="deterministic"):
        state_drivers.error_states(world, cfg, policies["base"], policies["rl"], tasks, jax.random.key(0), t_max=T_MAX,
                                   n_states=2, env_params=ENV_PARAMS._replace(success_rate=0.5), rcfg=rcfg)


# ----------------------------------------------------------------------------- likelihood
def test_teacher_forced_equals_sampler(cfg, policies, rollouts):
    r = rollouts[0]
    logp = np.asarray(scoring.teacher_forced_logprobs(policies["base"], cfg, r.tokens, batch_size=BATCH))
    mask = np.asarray(r.policy_mask)
    assert mask.sum() > 10
    np.testing.assert_allclose(logp[mask], np.asarray(r.logprobs)[mask], atol=1e-4)


def test_likelihood_self_is_zero_and_pairs(world, cfg, policies, rollouts):
    r_base, r_rl = rollouts
    same = scoring.likelihood(world, cfg, policies["base"], policies["base"], r_base, r_rl, jax.random.key(0),
                              batch_size=BATCH, n_boot=200)
    np.testing.assert_array_equal(same["llr_base"], 0.0)
    np.testing.assert_array_equal(same["llr_rl"], 0.0)
    if same["n_pairs"] > 0:
        assert same["matched_llr_diff"]["mean"] == 0.0
    # base actions' NLL under base = minus the sampler's log-probs summed per action
    lp, turn_idx, pol = np.asarray(r_base.logprobs), np.asarray(r_base.turn_index), np.asarray(r_base.policy_mask)
    want = [-lp[b][pol[b] & (turn_idx[b] == t)].sum() for b in range(ROW_TASK.size) for t in range(T_MAX)
            if (pol[b] & (turn_idx[b] == t)).any()]
    np.testing.assert_allclose(np.sort(same["nll_base_actions"]), np.sort(want), atol=1e-4)

    res = scoring.likelihood(world, cfg, policies["base"], policies["rl"], r_base, r_rl, jax.random.key(0),
                             task_ids_base=ROW_TASK, task_ids_rl=ROW_TASK, batch_size=BATCH, n_boot=200)
    assert res["success_rl"].any() and res["success_base"].any()
    assert res["mean_llr_success_rl"] == pytest.approx(res["llr_rl"][res["success_rl"]].mean(), abs=1e-4)
    assert res["mean_nll_rl_actions"] > 0 and res["mean_nll_base_actions"] > 0
    # each policy's own trajectories are likelier under itself: E_RL[log RL/base] = KL >= 0 >= E_base[...]
    assert res["llr_rl"].mean() > res["llr_base"].mean()
    match = res["match"]
    for i in np.flatnonzero(match >= 0):  # same task (row index), both successful, within 10%
        j = match[i]
        assert ROW_TASK[i] == ROW_TASK[j] and res["success_rl"][i] and res["success_base"][j]
        n_rl, n_b = res["policy_tokens_rl"][i], res["policy_tokens_base"][j]
        assert abs(n_rl - n_b) <= 0.1 * max(n_rl, n_b)
    assert res["n_pairs"] == (match >= 0).sum()


# ----------------------------------------------------------------------------- first-move optimality
def test_first_move_optimality(world, cfg, policies, tasks, rcfg, rollouts):
    res = state_drivers.first_move_optimality(world, cfg, policies["base"], tasks, t_max=T_MAX, env_params=ENV_PARAMS,
                     width=rcfg.max_context, score_batch=SCORE)
    # the first-turn context is exactly the rollout's
    ctx, n, _ = state_drivers.first_turn_contexts(world, tasks, t_max=T_MAX, env_params=ENV_PARAMS,
                                                  width=rcfg.max_context)
    r = rollouts[0]
    start = np.asarray(r.turns.span_start[:, 0])
    np.testing.assert_array_equal(np.asarray(n)[ROW_TASK], start)
    for row, i in enumerate(ROW_TASK):
        np.testing.assert_array_equal(np.asarray(ctx[i, :start[row]]), np.asarray(r.tokens[row, :start[row]]))
    want = (res["probs"] * res["optimal"]).sum(1).mean()
    assert res["optimal_mass"] == pytest.approx(want, abs=1e-6)
    assert 0 < res["optimal_mass"] < 1 and (res["invalid_mass"] >= 0).all()
    # the task whose goal is one move away: its only optimal action is that move
    assert res["optimal"][0].sum() >= 1
    np.testing.assert_allclose(res["q"].max(1)[0], 1.0, atol=1e-6)


def test_one_compile_each(compiles_before, passes, sq_runs, err_runs):
    roll0, score0 = compiles_before
    assert rollout_jit._cache_size() - roll0 <= 1
    assert scoring.reply_logprobs_jit._cache_size() - score0 <= 1


def test_error_states_more_states_than_candidates(world, cfg, policies, tasks, rcfg, rollouts):
    """n_states past the candidate pools: the unfilled slots (any cell, last turns included) are masked and
    not replayed (this indexed past T_max once, when an unfilled slot fell on the last turn)."""
    n = int(np.asarray(rollouts[0].turns.active).size)  # every (episode, turn) cell is drawn
    res = state_drivers.error_states(world, cfg, policies["base"], policies["rl"], tasks, jax.random.key(5),
                                     t_max=T_MAX, n_states=n, env_params=ENV_PARAMS, rcfg=rcfg, batch_size=BATCH,
                                     score_batch=SCORE, n_continuations=1, n_boot=50, rollouts=rollouts)
    mask = res["mask"]
    assert 0 < mask.sum() < mask.size
    assert (res["turn"][~mask] == T_MAX - 1).any()
    assert not res["replay_ok"][~mask].any() and res["replay_ok"][mask].all()
