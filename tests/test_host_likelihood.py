"""Finding 5 on a host domain (`jaxagent.study.host.likelihood`): the episodes' token records in the eval log, the
teacher-forced scoring checked against a direct computation with the model, the length-matched pairing rule on
hand-made numbers, the seed-aware metrics and the report section, and the ci-bfcl miniature end to end."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import sharding
from jaxagent.eval import likelihood as lk, recipe, stats
from jaxagent.eval.findings import LLR_THRESHOLD, finding_verdict, room_from_metrics
from jaxagent.models import qwen3, weights
from jaxagent.models.config import Qwen3Config
from jaxagent.study.host import (likelihood as hl, likelihood_scoring as hls, metrics as host_metrics,
                                 report as host_report, stages as host_stages)


def _record(tokens, spans):
    """A record from token ids and (turn, start, count) spans, through `token_record`."""
    s = len(tokens) + 3
    tok = np.zeros(s, np.int32)
    tok[:len(tokens)] = tokens
    pol, turn = np.zeros(s, bool), np.full(s, -1, np.int32)
    for t, start, n in spans:
        pol[start:start + n] = True
        turn[start:start + n + 2] = t  # observation tokens of the turn carry its index too (not policy tokens)
    return hls.token_record(tok, pol, turn, len(tokens))


def test_token_record_round_trip_and_spans():
    toks = [151643, 5, 7, 151645, 9, 11, 13, 2, 151936 - 1, 4]
    rec = _record(toks, [(0, 2, 2), (1, 6, 3)])
    assert hls.decode_tokens(rec["tokens"]).tolist() == toks
    assert rec["spans"] == [[0, 2, 2], [1, 6, 3]]
    assert hls.record_policy_positions(rec).tolist() == [2, 3, 6, 7, 8]
    assert json.loads(json.dumps(rec)) == rec
    pol = np.zeros(10, bool)
    pol[[2, 4]] = True
    with pytest.raises(ValueError, match="not contiguous"):
        hls.token_record(np.arange(10), pol, np.zeros(10, np.int32), 10)


def test_token_log_keeps_the_full_tier_in_grid_order():
    """Through `run_pass_episodes` with a padded last batch: the full tier's P x Z records, task-major."""
    def rollout_fn(idx_B, budgets_B, key):
        b = len(idx_B)
        tokens = np.stack([np.array([i, t, 7, 8, 0, 0]) for i, t in zip(idx_B, budgets_B)]).astype(np.int32)
        pol = np.zeros((b, 6), bool)
        pol[:, 2:4] = True
        return types.SimpleNamespace(tokens=tokens, policy_mask=pol, turn_index=np.where(pol, 0, -1),
                                     length=np.full(b, 4, np.int32), status=np.zeros(b, np.int32),
                                     turns_used=np.ones(b, np.int32))

    log = hls.TokenLog(keep_budget=2)
    raw = host_stages.run_pass_episodes(log.wrap(rollout_fn), 3, [1, 2], 2, jax.random.key(0), batch_size=5)
    sizes = [5, 5, 2]
    entry = log.log_entry(sizes, raw["status"].shape)
    assert entry["tier"] == 1 and len(entry["episodes"]) == 6
    dec = [hls.decode_tokens(e["tokens"]).tolist() for e in entry["episodes"]]
    assert [d[0] for d in dec] == [0, 0, 1, 1, 2, 2] and all(d[1] == 2 and len(d) == 4 for d in dec)
    assert all(e["spans"] == [[0, 2, 2]] for e in entry["episodes"])
    with pytest.raises(ValueError, match="budget 2"):
        log.log_entry(sizes, raw["status"].shape, tier=0)


# ----------------------------------------------------------------------------- scoring vs the model
CFG = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16)


_log_softmax = jax.jit(lambda params, tokens_BxT: jax.nn.log_softmax(qwen3.forward(params, CFG, tokens_BxT)[0], -1))


def _direct_logp(params, tokens):
    """log pi(y_t | y_<t) at every t >= 1 of one sequence, straight from `qwen3.forward` (on the sequence padded to
    24 tokens: one compile; causal, so the padding never changes an earlier position)."""
    n = len(tokens)
    ls = np.asarray(_log_softmax(params, jnp.asarray(np.pad(tokens, (0, 24 - n)), jnp.int32)[None])[0], np.float64)
    return np.concatenate([[0.0], ls[np.arange(n - 1), np.asarray(tokens[1:])]])


@pytest.fixture(scope="module")
def scored():
    pa, pb = qwen3.init(CFG, jax.random.key(1)), qwen3.init(CFG, jax.random.key(2))
    rng = np.random.default_rng(0)
    recs = [_record(rng.integers(0, 64, n).tolist(), spans) for n, spans in
            ((20, [(0, 5, 4), (1, 12, 3)]), (9, [(0, 4, 5)]), (14, [(0, 3, 2), (1, 8, 1), (2, 11, 3)]))]
    lp = {name: hls.score_records(p, CFG, recs, batch_size=2, max_width=40) for name, p in (("a", pa), ("b", pb))}
    return pa, pb, recs, lp


def test_score_records_equal_a_direct_forward(scored):
    pa, pb, recs, lp = scored
    for r, la, lb in zip(recs, lp["a"], lp["b"]):
        toks = hls.decode_tokens(r["tokens"])
        pos = hls.record_policy_positions(r)
        da, db = _direct_logp(pa, toks)[pos], _direct_logp(pb, toks)[pos]
        assert la.shape == lb.shape == pos.shape
        np.testing.assert_allclose(la, da, atol=2e-5)
        # the per-token LLR of the trajectory and its sum, with b as pi_RL and a as pi_base
        np.testing.assert_allclose(lb - la, db - da, atol=4e-5)
        nums = hls.episode_numbers(r, la, lb)
        assert nums["llr"] == pytest.approx(float(np.sum(db - da)), abs=1e-4)
        assert nums["n_tokens"] == pos.size and len(nums["nll_actions"]) == len(r["spans"])
        cuts = np.cumsum([c for _, _, c in r["spans"]])[:-1]
        assert nums["nll_actions"] == pytest.approx([-x.sum() for x in np.split(da, cuts)], abs=1e-4)
        assert nums["logp_base"] - nums["logp_rl"] == pytest.approx(-nums["llr"], abs=1e-4)
    with pytest.raises(ValueError, match="max_width"):
        hls.score_records(pa, CFG, recs, batch_size=2, max_width=16)


def test_score_records_on_a_mesh(scored):
    """Rows over the batch axes of a (2, 2, 2) mesh of the 8 fake CPU devices, params as the rollouts place them."""
    pa, _, recs, lp = scored
    on_mesh = hls.score_records(pa, CFG, recs, batch_size=4, mesh=sharding.make_mesh(2, 2, 2), max_width=40)
    for x, y in zip(on_mesh, lp["a"]):
        np.testing.assert_allclose(x, y, atol=2e-5)


def test_score_seed_sides_tiers_and_memo(scored):
    pa, pb, recs, lp = scored
    base_log = {"success": [[[False], [False], [False]], [[True], [False], [True]]],
                hls.LOG_KEY: {"tier": 1, "episodes": recs}}
    rl_log = {"success": [[[True], [True], [True]], [[False], [True], [False]]],
              hls.LOG_KEY: {"tier": 1, "episodes": recs[::-1]}}
    memo = {}
    out = hls.score_seed(pa, pb, CFG, base_log, rl_log, batch_size=2, max_width=40, memo=memo)
    assert out["base"]["success"] == [True, False, True] and out["rl"]["success"] == [False, True, False]
    assert out["base"]["task"] == [0, 1, 2] and out["rl"]["tier"] == 1
    assert out["base"]["llr"] == pytest.approx([float(np.sum(b - a)) for a, b in zip(lp["a"], lp["b"])], abs=1e-4)
    assert out["rl"]["llr"] == pytest.approx(out["base"]["llr"][::-1], abs=1e-5)
    assert len(memo["base"]) == 3
    memo["base"] = [x + 1.0 for x in memo["base"]]  # the memo is reused, not recomputed
    again = hls.score_seed(pa, pb, CFG, base_log, rl_log, batch_size=2, max_width=40, memo=memo)
    assert again["base"]["llr"] == pytest.approx([x - n for x, n in zip(out["base"]["llr"], out["base"]["n_tokens"])],
                                                 abs=1e-4)
    with pytest.raises(ValueError, match="re-evaluate"):
        hls.score_seed(pa, pb, CFG, {"success": base_log["success"]}, rl_log, batch_size=2)


# ----------------------------------------------------------------------------- pairing and metrics
def _side(task, success, n_tokens, llr, nll=None):
    return {"task": task, "success": success, "n_tokens": n_tokens, "llr": llr,
            "nll_actions": nll if nll is not None else [[1.0] for _ in task]}


def test_matched_pairs_same_task_both_successful_within_ten_percent():
    rl = _side([0, 0, 1, 2, 3, 3, 4], [True, True, True, False, True, True, True],
               [100, 50, 80, 10, 90, 200, 30], [0.0] * 7)
    base = _side([0, 0, 1, 2, 3, 5, 4], [True, False, True, True, True, True, True],
                 [95, 50, 60, 10, 100, 200, 33], [0.0] * 7)
    # rl0 ~ base0 (task 0, 5 <= 10); rl1: base1 failed; rl2: 20 > 8; rl3 failed; rl4 ~ base4 (exactly 10% of 100);
    # rl5: its length-200 partner is another task's; rl6 ~ base6 (3 <= 3.3)
    assert hl.matched_pairs(rl, base) == [(0, 0), (4, 4), (6, 6)]
    # one-to-one and greedy in RL order: the closest still-unused base success of the task
    rl2 = _side([0, 0], [True, True], [100, 99], [0.0] * 2)
    base2 = _side([0, 0, 0], [True, True, False], [98, 120, 99], [0.0] * 3)
    assert hl.matched_pairs(rl2, base2) == [(0, 0)]
    assert hl.matched_pairs(_side([0], [False], [5], [0.0]), base2) == []
    # the same matching as `likelihood.length_matched_pairs` on random episodes
    rng = np.random.default_rng(3)
    r = _side(rng.integers(0, 4, 40), rng.random(40) < 0.7, rng.integers(50, 70, 40), [0.0] * 40)
    b = _side(rng.integers(0, 4, 30), rng.random(30) < 0.7, rng.integers(50, 70, 30), [0.0] * 30)
    ref = jax.jit(lk.length_matched_pairs)(r["task"], r["success"], r["n_tokens"], b["task"], b["success"],
                                           b["n_tokens"])
    want = [(i, int(j)) for i, j in enumerate(np.asarray(ref["match"])) if j >= 0]
    assert len(want) > 5 and hl.matched_pairs(r, b) == want


def _seed(shift):
    """A seed's record: 4 tasks x 2 episodes per side; RL's llr = base's + shift on the matched pairs."""
    base = _side([0, 0, 1, 1, 2, 2, 3, 3], [True, False, True, True, False, False, True, False],
                 [100, 40, 60, 61, 30, 30, 50, 50], [1.0, -3.0, 2.0, 0.0, -1.0, -1.0, 3.0, 9.0],
                 [[10.0, 12.0]] * 8)
    rl = _side([0, 0, 1, 1, 2, 2, 3, 3], [True, True, True, False, True, False, False, False],
               [105, 70, 58, 200, 30, 30, 50, 50], [1.0 + shift, 7.0, 2.0 + shift, 4.0, 5.0, 5.0, 5.0, 5.0],
               [[13.0, 15.0]] * 8)
    return {"base": base, "rl": rl}


def test_likelihood_metrics_hand_made_numbers_and_report():
    m = {}
    scored = {0: _seed(10.0), 1: _seed(20.0), 2: _seed(30.0), 3: _seed(500.0)}
    m.update(hl.likelihood_metrics("bfcl", scored, [0, 1, 2], host_metrics.put_estimate))
    # pairs: rl0-base0 (task 0, 105 vs 100) and rl2-base2 (task 1, 58 vs 60); rl1 has no base partner of 70 tokens
    assert m["bfcl.f5_matched.seed0.n_pairs"] == 2 and m["bfcl.f5_matched.seed0.n_tasks"] == 2
    assert m["bfcl.f5_matched.n_pairs"] == 6 and m["bfcl.f5_matched.n_tasks"] == 2
    # the raw pair difference is printed; the judged difference is raw - LLR_THRESHOLD (1 nat)
    assert m["bfcl.f5_matched.raw.mean"] == pytest.approx(20.0)
    assert m["bfcl.f5_matched.diff.mean"] == pytest.approx(20.0 - LLR_THRESHOLD)
    assert m["bfcl.f5_matched.diff.method"] == stats.T_SEEDS and m["bfcl.f5_matched.diff.n_seeds"] == 3
    assert m["bfcl.f5_matched.diff.all.mean"] == pytest.approx(140.0 - LLR_THRESHOLD)
    assert m["bfcl.f5_matched.threshold"] == m["bfcl.f5_llr_rl.threshold"] == LLR_THRESHOLD == 1.0
    assert "excluded: 3" in m["bfcl.f5_matched.diff.seeds"]
    # NLL: RL actions 14, base actions 11 (mean over actions), difference 3
    assert (m["bfcl.f5_nll.rl"], m["bfcl.f5_nll.base"]) == (14.0, 11.0)
    assert m["bfcl.f5_nll.diff.mean"] == pytest.approx(3.0)
    assert m["bfcl.f5_nll.n_rl_actions"] == 3 * 16 and m["bfcl.f5_nll.n_base_actions"] == 16
    # LLR of successes: RL (1 + s, 7, 2 + s, 5) vs base (1, 2, 0, 3)
    for s in (10.0, 20.0, 30.0):
        assert np.mean([1 + s, 7, 2 + s, 5]) - 1.5 == pytest.approx(s / 2 + 2.25)
    # judged: RL's successes minus the threshold; printed: RL's successes minus base's (the Jeffreys contrast)
    assert m["bfcl.f5_llr_rl.diff.mean"] == pytest.approx(np.mean([np.mean([1 + s, 7, 2 + s, 5]) for s in (10, 20, 30)])
                                                          - LLR_THRESHOLD)
    assert m["bfcl.f5_llr_success.jeffreys.mean"] == pytest.approx(20 / 2 + 2.25)
    assert "bfcl.f5_llr_success.diff.mean" not in m
    assert "12.25 nats" in m["bfcl.note.f5_jeffreys"] and "Jeffreys" in m["bfcl.note.f5_jeffreys"]
    assert m["bfcl.f5_llr_success.n_rl"] == 12 and m["bfcl.f5_llr_success.n_base"] == 4
    assert m["bfcl.f5_llr_success.base"] == pytest.approx(1.5)
    assert m["bfcl.f5_llr_success.all_base"] == pytest.approx(10 / 8)
    assert "bfcl.note.f5_matched" not in m
    findings = host_metrics.domain_findings("bfcl", "BFCL")
    keys = [f.key for f in findings]
    assert {"bfcl.f5_nll", "bfcl.f5_llr_rl", "bfcl.f5_matched"} <= set(keys) and "bfcl.f5_llr_success" not in keys
    assert keys.index("bfcl.f4_correction") < keys.index("bfcl.f5_matched") < keys.index("bfcl.f7_gigpo")
    assert not any(k.startswith("sql.f5") for k in (f.key for f in host_metrics.domain_findings("sql", "SQL")))
    text = "\n".join(host_report.domain_section("bfcl", "BFCL", m, findings, policies=["base", "grpo"], tiers=[1, 2],
                                                ks=[1], t_max=2, splits=("train", "test"))[0])
    verdicts = "|".join(map(re.escape, stats.VERDICTS))
    assert re.search(rf"\| BFCL: 5\. length-matched LLR control .* \| 19\.0 \| \[.*\] .*\| ({verdicts}) \| .* \| "
                     r"grpo seeds 0, 1, 2; excluded: 3 \|", text)
    assert "| pairs (paper, BFCL: 283) | 6 |" in text and "| RL actions: mean NLL under base (nats) | 14.00 |" in text
    assert "KL(RL, base) + KL(base, RL)" in text and m["bfcl.note.f5_jeffreys"] in text
    assert "| raw mean pair difference (nats; >= 0 in expectation by construction, not judged) | 20.0 |" in text
    assert text.count("Would have been not reproduced with:") == text.count("Verdict: **") == 3


def _llr_seed(llr_rl, llr_base, n=8):
    """A seed whose RL and base successes (every episode, tasks 0..n-1, equal lengths: every pair matches) have
    LLRs `llr_rl` and `llr_base`."""
    task = list(range(n))
    return {"rl": _side(task, [True] * n, [50] * n, list(llr_rl)),
            "base": _side(task, [True] * n, [50] * n, list(llr_base))}


def test_llr_rows_are_reported_not_judged_at_any_gap():
    """The LLR rows measure the recipe's KL budget at toy scale (`recipe.llr_not_comparable`): RL successes 0.2 nat
    above base (which the threshold rule called "not reproduced (opposite)") and 30 nats above (which it called
    "reproduced") are both "untestable here (recipe)", with their estimates still written: the two-group contrast
    > 0 (a Jeffreys divergence) and LLR - 1 at the gap. Neither row has a structural room; the contrast is never
    judged."""
    rng = np.random.default_rng(5)
    f = {x.key: x for x in hl.findings("bfcl", "BFCL")}
    assert not any(x.room for x in f.values()) and all(x.falsified_by for x in f.values())
    for gap, rule in ((0.2, stats.OPPOSITE), (30.0, stats.REPRODUCED)):
        scored = {s: _llr_seed(gap + 0.05 * rng.normal(size=8), 0.01 * rng.normal(size=8)) for s in range(5)}
        m = hl.likelihood_metrics("bfcl", scored, list(range(5)), host_metrics.put_estimate)
        assert m["bfcl.f5_llr_success.jeffreys.mean"] == pytest.approx(gap, abs=0.05)
        assert m["bfcl.f5_llr_success.jeffreys.lo"] > 0  # the contrast holds by definition, whatever the gap
        assert m["bfcl.f5_llr_rl.diff.mean"] == pytest.approx(gap - LLR_THRESHOLD, abs=0.05)
        assert m["bfcl.f5_matched.raw.mean"] == pytest.approx(gap, abs=0.05)
        for key in ("bfcl.f5_llr_rl", "bfcl.f5_matched"):
            assert room_from_metrics(f[key], m) is None
            assert finding_verdict(f[key], m) == (stats.RECIPE, recipe.LLR_SCALE_REASON), (key, gap)
            assert finding_verdict(dataclasses.replace(f[key], recipe=None), m)[0] == rule, (key, gap)
        _, verdicts = host_report.domain_section("bfcl", "BFCL", m, tuple(f.values()), policies=["base"], tiers=[1],
                                                 ks=[1], t_max=1, splits=("train", "test"))
        assert verdicts["bfcl.f5_llr_rl"] == stats.RECIPE and "bfcl.f5_llr_success" not in verdicts


def test_no_pair_note_and_measured_rows_without_successes():
    seed = _seed(10.0)
    for side in ("base", "rl"):
        seed[side]["success"] = [False] * 8
    m = hl.likelihood_metrics("bfcl", {0: seed}, [0], host_metrics.put_estimate)
    assert m["bfcl.f5_matched.n_pairs"] == 0 and math.isnan(m["bfcl.f5_matched.diff.mean"])
    assert "no RL and no base" in m["bfcl.note.f5_matched"]
    assert m["bfcl.f5_nll.diff.mean"] == pytest.approx(3.0) and m["bfcl.f5_llr_success.n_rl"] == 0
    assert m["bfcl.f5_llr_success.all_rl"] == pytest.approx(np.mean(seed["rl"]["llr"]))
    findings = host_metrics.domain_findings("bfcl", "BFCL")
    text = "\n".join(host_report.domain_section("bfcl", "BFCL", m, findings, policies=["base", "grpo"], tiers=[1, 2],
                                                ks=[1], t_max=2, splits=("train", "test"))[0])
    assert m["bfcl.note.f5_matched"] in text and "| RL actions: mean NLL under base (nats) | 14.00 |" in text
    assert f"| every RL trajectory: mean LLR (nats) | {np.mean(seed['rl']['llr']):.2f} |" in text
    assert "| pairs (paper, BFCL: 283) | 0 |" in text and "bfcl.note.f5_seeds" not in m
    # every seed excluded by the health rule: no estimate, the rows over every seed with a note
    ex = hl.likelihood_metrics("bfcl", {0: seed}, [], host_metrics.put_estimate)
    assert ex["bfcl.f5_nll.rl"] == 14.0 and "over every seed (0)" in ex["bfcl.note.f5_seeds"]
    assert math.isnan(ex["bfcl.f5_nll.diff.mean"]) and ex["bfcl.f5_nll.diff.all.mean"] == pytest.approx(3.0)
    # successes on different tasks; then on one task but too far apart in length
    seed["rl"]["success"][0], seed["base"]["success"][2] = True, True
    note = hl.likelihood_metrics("bfcl", {0: seed}, [0], host_metrics.put_estimate)["bfcl.note.f5_matched"]
    assert "no task has a successful episode of both" in note
    seed["rl"]["success"][3] = True
    note = hl.likelihood_metrics("bfcl", {0: seed}, [0], host_metrics.put_estimate)["bfcl.note.f5_matched"]
    assert "within 10%" in note and "1 task(s)" in note


# ----------------------------------------------------------------------------- the ci-bfcl miniature
def check_ci_bfcl_finding5(root: str) -> None:
    """Finding 5 in the ci-bfcl miniature's run under `root` (called by tests/test_host_domains.py's
    end-to-end test, which runs the miniature once for every check)."""
    from jaxagent.study.host import run as host_run
    from jaxagent.study.host.presets import HOST_PRESETS

    run_dir = os.path.join(root, "ci-bfcl")
    p = HOST_PRESETS["ci-bfcl"]
    n_full = 2 * p.eval.n_samples  # 2 held-out tasks
    logs = {}
    for label in ("base", "grpo_seed0"):
        logs[label] = json.load(open(os.path.join(run_dir, "eval", f"{label}.json")))
        entry = logs[label][hls.LOG_KEY]
        assert entry["tier"] == len(p.eval.fractions) - 1 and len(entry["episodes"]) == n_full
        turns = np.asarray(logs[label]["turns"])[-1].reshape(-1)
        assert [len(e["spans"]) for e in entry["episodes"]] == turns.tolist()  # one policy span per reply
    f5 = json.load(open(os.path.join(run_dir, "eval", "f5_grpo_seed0.json")))
    assert len(f5["base"]["llr"]) == len(f5["rl"]["llr"]) == n_full
    # one RL episode's LLR recomputed with the two models directly, at its policy tokens
    run = host_run.HostRun(p, root)
    base = weights.load(run.checkpoint)[1]
    rl = weights.load(os.path.join(run_dir, "arms", "grpo", "seed0", "policy"))[1]
    rec = logs["grpo_seed0"][hls.LOG_KEY]["episodes"][0]
    toks = hls.decode_tokens(rec["tokens"])
    pos = hls.record_policy_positions(rec)
    direct = {}
    for name, prm in (("base", base), ("rl", rl)):
        h = qwen3.hidden_states(prm, run.cfg, jnp.asarray(toks)[None])[0][0]
        z = jnp.einsum("pd,vd->pv", h[pos - 1], prm["embed"], preferred_element_type=jnp.float32)
        direct[name] = np.asarray(jax.nn.log_softmax(z, -1)[np.arange(pos.size), toks[pos]])
    assert f5["rl"]["n_tokens"][0] == pos.size
    assert f5["rl"]["llr"][0] == pytest.approx(float(np.sum(direct["rl"] - direct["base"])), abs=1e-3)
    assert f5["rl"]["logp_base"][0] == pytest.approx(float(direct["base"].sum()), abs=1e-3)
    assert f5["rl"]["logp_rl"][0] == pytest.approx(float(direct["rl"].sum()), abs=1e-3)
    # the report's finding-5 section with the measured numbers
    m = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert math.isfinite(m["bfcl.f5_nll.rl"]) and math.isfinite(m["bfcl.f5_nll.base"])
    assert math.isfinite(m["bfcl.f5_llr_success.all_rl"]) and m["bfcl.f5_nll.n_base_actions"] > 0
    text = open(os.path.join(run_dir, "report.md")).read()
    verdicts = "|".join(map(re.escape, stats.VERDICTS))
    for title in ("per-action NLL under base", "cumulative LLR", "length-matched LLR control"):
        assert re.search(rf"\| BFCL multi-turn: 5\. {title}.*\| ({verdicts}) \| [^|]* \| grpo seeds ", text), title
    assert f"| RL actions: mean NLL under base (nats) | {m['bfcl.f5_nll.rl']:.2f} |" in text
    if m["bfcl.f5_matched.n_pairs"] == 0:
        assert m["bfcl.note.f5_matched"] in text
    assert "- finding 5 likelihood:" in text
