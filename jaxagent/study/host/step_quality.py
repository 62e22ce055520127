"""Finding 3 on a host-env domain: step quality of RL vs base on matched states, scored by the unit-test pass rate
of each sampled submission (the paper, DeepCoder-MT: RL better on only 46.8% of matched states, mean quality
slightly below base; docs/study.md finding 3 and "jaxagent's definitions", Step quality).

States (`states_from_log`, `draw_matched`): per GRPO seed, equal numbers of base's and the seed's non-terminal
states of their full-budget held-out episodes (the prefix of an episode's first t replies). Replies
(`sample_scores`): G = `n_samples` per policy and state, the prefix replayed as forced replies and the episode's
budget announced, each scored q(s, a) = the unit-test pass rate of its submission (`info["pass_rate"]`; no code
block: 0; a reply the env could not score is missing). Per state i (`per_state`): q_pol(i) = mean of pol's scored
replies, delta_i = q_RL(i) - q_base(i); "RL better on X%" = share of used states with delta_i > 0 (ties apart).
Estimate (units = states nested in GRPO seeds): `<d>.f3_step.diff` = mean delta_i, `<d>.f3_step.better` = mean
1[delta_i > 0]. Verdict: direction -1, E = 0.05 pass rate (`findings.f3_step_deepcoder`); a base mean pass rate
below E blocks the size. Domains: `DOMAINS` (coding). The state and reply rules, notes and metric keys:
docs/host_study.md, "How the host findings are measured" (finding 3).

Dimension legend (CONVENTIONS.md): I states, G replies per policy and state, U tiers, P tasks, Z samples, B episodes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jaxagent.eval.findings import SEI, Finding, Row
from jaxagent.rollout.host_loop import host_rollout
from jaxagent.sampling.generate import rollout_params
from jaxagent.study.host.error_recovery import tier_episodes

DOMAINS = ("code",)  # env registry names: every domain on these envs (`host_domains.uses_env`)
EFFECT = 0.05  # jaxagent's smallest effect of interest in pass rate (`findings.f3_step_deepcoder`)
NO_STATE_NOTE = ("Finding 3 (step quality on matched states): the held-out full-budget evaluation episodes of base "
                 "or of every GRPO seed have no state where the policy replied, so this run has no estimate for it.")
_SHARES = ("share_rl_better", "share_equal", "share_rl_worse", "base", "rl")


def finding(d: str, title: str) -> Finding:
    """Finding 3 on domain `d`: mean step quality (unit-test pass rate) RL - base on matched states."""
    f3 = f"{d}.f3_step"
    rows = (Row("matched states (all GRPO seeds)", f"{f3}.n_states", None, 1.0, ".0f"),
            Row("G (replies sampled per policy and state)", f"{f3}.g", None, 1.0, ".0f"),
            Row("RL better (%)", f"{f3}.share_rl_better", "f3_deepcoder_rl_better", 100.0),
            Row("tie (%)", f"{f3}.share_equal", None, 100.0),
            Row("RL worse (%)", f"{f3}.share_rl_worse", None, 100.0),
            Row("mean pass rate, base", f"{f3}.base", None, 1.0, ".3f"),
            Row("mean pass rate, RL", f"{f3}.rl", None, 1.0, ".3f"))
    every = tuple(Row(f"{r.label}, every seed", r.measured.replace(f"{f3}.", f"{f3}.all."), None, r.scale, r.fmt,
                      optional=True) for r in rows[2:])
    return Finding(f3, f"{title}: 3. step quality on matched states (unit-test pass rate of G replies per policy)",
                   rows + every, f"{f3}.diff", "mean pass rate RL - base", -1, None, 1.0, ".3f",
                   effect=EFFECT, effect_source=f"{SEI}: 0.05 pass rate (as DeepCoder-MT's f3_step_deepcoder)",
                   note=("A reply without a code block scores 0; a reply the env could not score is left out. Room: "
                         "a pass rate lies in [0, 1], so mean quality RL - base lies in [-base, 1 - base]: the "
                         "paper's side (RL below base) has room base."), room=True,
                   falsified_by=("a 95% CI of mean pass rate RL - base on matched states above 0, or holding 0 with "
                                 "its lower end above -0.05 (RL's steps no worse than base's)"))


# ----------------------------------------------------------------------------- matched states
@dataclasses.dataclass(frozen=True)
class MatchedState:
    """A non-terminal state of an evaluation episode: the episode's first `len(actions)` replies on `task`."""

    task: Any
    actions: tuple   # the prefix: the replies before this turn
    source: str      # the label of the policy whose episode it is
    episode: int     # the episode's index in that policy's eval log (`episodes`)


def candidate_states(log: Mapping, label: str, tasks: Sequence, tier: int = -1) -> list[MatchedState]:
    """Every state where the policy replied in the episodes of tier index `tier` of an eval log (`episodes`,
    tier-major over the [U, P, Z] grid): per episode, the prefixes of its first t replies, t = 0 .. steps - 1."""
    out = []
    for p, e, ep in tier_episodes(log, label, tier):
        acts = [str(a) for a in ep["actions"]]
        out += [MatchedState(tasks[p], tuple(acts[:t]), label, e) for t in range(len(acts))]
    return out


def draw_matched(cand_base: Sequence, cand_rl: Sequence, seed: int, n_max: int | None = None) -> list:
    """n = min(n_max, #cand_base, #cand_rl) (n_max None: no cap) drawn uniformly without replacement from each list
    (numpy generator `seed`), each draw in its list's order; base's first."""
    if n_max is not None and n_max < 1:
        raise ValueError(f"n_max must be >= 1 or None, got {n_max}")
    n = min(len(cand_base), len(cand_rl), len(cand_base) if n_max is None else n_max)
    rng = np.random.default_rng(seed)
    pick = lambda c: [c[i] for i in sorted(rng.choice(len(c), size=n, replace=False))] if n else []  # noqa: E731
    return pick(cand_base) + pick(cand_rl)


def states_from_log(evals: Mapping[str, Mapping], base_label: str, rl_label: str, tasks: Sequence, seed: int,
                    n_states: int | None = None, tier: int = -1) -> list[MatchedState]:
    """The matched states of base's and `rl_label`'s episodes of tier index `tier`, at most `n_states` from each
    (module docstring)."""
    return draw_matched(candidate_states(evals[base_label], base_label, tasks, tier),
                        candidate_states(evals[rl_label], rl_label, tasks, tier), seed, n_states)


# ----------------------------------------------------------------------------- sampling and scoring
@dataclasses.dataclass
class _Node:
    state: Any
    key: tuple  # (task key, replies so far)


class StopAfter:
    """`env` seen from states at turn `n`: the episode ends (done) right after its reply at turn n, and the forced
    prefix's steps are replayed from a cache shared by every row of its prefix length (the host envs are
    deterministic and ignore the reset seed, `envs.host.base`), so the G rows of one state run the prefix's env
    steps once. Cached
    states are cloned on the way in and out. Every other attribute is the wrapped env's."""

    def __init__(self, env, n: int):
        self.env, self.n = env, int(n)
        self._cache: dict = {}
        self._lock = threading.Lock()

    def reset(self, seed, task):
        state, obs = self.env.reset(seed, task)
        return _Node(state, (getattr(task, "id", None) or id(task), ())), obs

    def step(self, node: _Node, action_text):
        key = (node.key[0], node.key[1] + (action_text,))
        t = len(node.key[1])
        if t < self.n:
            with self._lock:
                hit = self._cache.get(key)
            if hit is None:
                hit = self.env.step(self.env.clone(node.state), action_text)
                with self._lock:
                    self._cache.setdefault(key, (self.env.clone(hit[0]),) + tuple(hit[1:]))
            state, obs, reward, done, info = hit
            return _Node(self.env.clone(state), key), obs, reward, done, dict(info)
        state, obs, reward, done, info = self.env.step(node.state, action_text)
        return _Node(state, key), obs, reward, done or t >= self.n, info

    def __getattr__(self, name):
        if name == "env" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.env, name)


def sample_scores(params, cfg, world, ts, states: Sequence[MatchedState], key, batch_size: int, n_samples: int,
                  budget: int, *, sampler, compute_dtype=None, mesh=None, score_key: str = "pass_rate") -> np.ndarray:
    """float64 [I, G]: the score (`info[score_key]` of the env step) of each of G = n_samples replies of the policy
    at each state, NaN where the env gave none (module docstring). Rows (state, g) grouped by prefix length, in
    rollout batches of `batch_size` (the last padded with copies of its first row, dropped after) with the
    evaluation's episode groups (`ts.overlap_groups`), so the rollouts reuse the evaluation's compiled programs;
    the prefix is replayed as forced replies with `budget` announced, and the episode ends after the reply."""
    if n_samples < 1 or batch_size < 1:
        raise ValueError(f"need n_samples and batch_size >= 1, got {n_samples} and {batch_size}")
    out = np.full((len(states), n_samples), np.nan)
    if not states:
        return out
    rcfg = ts.rollout_config(sampler)
    params = rollout_params(params, cfg, mesh=mesh, compute_dtype=compute_dtype)
    context = contextlib.nullcontext if mesh is None else (lambda: jax.set_mesh(mesh))
    by_len: dict[int, list[tuple[int, int]]] = {}
    for i, s in enumerate(states):
        if len(s.actions) >= budget:
            raise ValueError(f"state {i} has {len(s.actions)} replies: no turn left in a budget of {budget}")
        by_len.setdefault(len(s.actions), []).extend((i, g) for g in range(n_samples))
    for n, cells in sorted(by_len.items()):
        env = StopAfter(world.env, n)
        for c, start in enumerate(range(0, len(cells), batch_size)):
            rows = cells[start:start + batch_size]
            n_real = len(rows)
            rows = rows + [rows[0]] * (batch_size - n_real)
            with context():
                ro = host_rollout(params, cfg, env, world.tokenizer, [states[i].task for i, _ in rows],
                                  np.full((batch_size,), budget, np.int32), jax.random.fold_in(key, n * 100003 + c),
                                  rcfg, forced_actions=[list(states[i].actions) for i, _ in rows])
            for j, (i, g) in enumerate(rows[:n_real]):
                infos = ro.trace.infos[j]
                v = infos[n].get(score_key) if len(infos) > n else None
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[i, g] = float(v)
    return out


def record(states: Sequence[MatchedState], base_IxG, rl_IxG) -> dict:
    """JSON-able record of one GRPO seed: G, per state the G scores of each policy (None: missing), the source
    policy, the turn and the task id."""
    j = lambda a: [[None if not np.isfinite(x) else float(x) for x in row] for row in np.asarray(a)]  # noqa: E731
    return {"g": int(np.shape(base_IxG)[1]), "base": j(base_IxG), "rl": j(rl_IxG), "source": [s.source for s in states],
            "turn": [len(s.actions) for s in states], "task_id": [str(getattr(s.task, "id", "")) for s in states],
            "episode": [int(s.episode) for s in states]}


# ----------------------------------------------------------------------------- the comparison and the metrics
def _scores(rows) -> np.ndarray:
    """float64 [I, G] from rows of scores (None: missing -> NaN)."""
    a = np.asarray([[np.nan if x is None else float(x) for x in r] for r in rows], np.float64)
    return a if a.ndim == 2 else np.zeros((len(rows), 0))


def per_state(base_IxG, rl_IxG) -> dict:
    """Per state i (NaN = a missing reply): q_pol[i] = mean of pol's scored replies, used[i] = both have one,
    diff[i] = q_rl[i] - q_base[i], better / equal / worse = used & (diff > 0 / == 0 / < 0) (module docstring;
    docs/study.md, "jaxagent's definitions", Step quality)."""
    b, r = _scores(base_IxG), _scores(rl_IxG)
    if b.shape[0] != r.shape[0]:
        raise ValueError(f"base has {b.shape[0]} states and RL {r.shape[0]}")
    mean = lambda a: np.divide(np.nansum(a, 1), np.isfinite(a).sum(1),  # noqa: E731
                               out=np.full(a.shape[0], np.nan), where=np.isfinite(a).sum(1) > 0)
    q_b, q_r = mean(b), mean(r)
    used = np.isfinite(q_b) & np.isfinite(q_r)
    diff = np.where(used, q_r - q_b, np.nan)
    return {"q_base": q_b, "q_rl": q_r, "used": used, "diff": diff, "better": used & (diff > 0),
            "equal": used & (diff == 0), "worse": used & (diff < 0)}


def _summary(c: dict) -> dict:
    u = c["used"]
    if not u.any():
        return {k: float("nan") for k in _SHARES}
    return {"share_rl_better": float(c["better"][u].mean()), "share_equal": float(c["equal"][u].mean()),
            "share_rl_worse": float(c["worse"][u].mean()), "base": float(c["q_base"][u].mean()),
            "rl": float(c["q_rl"][u].mean())}


def step_quality_metrics(d: str, scored: Mapping[int, Mapping], included: Sequence[int], put) -> dict:
    """The finding-3 metrics (module docstring) from `record`'s dict per GRPO seed; `put` is `metrics.put_estimate`.
    No used state in any seed: only `<d>.f3_step.n_states` = 0, `.g` and the note `<d>.note.f3_step`."""
    f3 = f"{d}.f3_step"
    m: dict = {}
    comp = {s: per_state(r["base"], r["rl"]) for s, r in sorted(scored.items())}
    g = {int(r["g"]) for r in scored.values() if "g" in r}
    m[f"{f3}.g"] = g.pop() if len(g) == 1 else float("nan")
    m[f"{f3}.n_states"] = n_all = int(sum(c["used"].sum() for c in comp.values()))
    if n_all == 0:
        m[f"{d}.note.f3_step"] = NO_STATE_NOTE
        return m
    summ = {}
    for s, c in comp.items():
        summ[s] = _summary(c)
        m[f"{f3}.seed{s}.n_states"] = int(c["used"].sum())
        m[f"{f3}.seed{s}.n_from_base"] = int(sum(src == "base" and u for src, u in zip(scored[s]["source"], c["used"])))
        for k, v in summ[s].items():
            m[f"{f3}.seed{s}.{k}"] = v
    put(m, f"{f3}.diff", {s: c["diff"][c["used"]] for s, c in comp.items()}, included)
    put(m, f"{f3}.better", {s: c["better"][c["used"]].astype(np.float64) for s, c in comp.items()}, included)

    def seed_mean(k, seeds):
        v = [summ[s][k] for s in seeds if np.isfinite(summ[s][k])]
        return float(np.mean(v)) if v else float("nan")

    ok = [s for s in comp if s in included]
    for k in _SHARES:
        m[f"{f3}.{k}"] = seed_mean(k, ok)
        if len(ok) < len(comp):
            m[f"{f3}.all.{k}"] = seed_mean(k, list(comp))
    # room: RL's mean pass rate per state lies in [0, 1], so the seed mean of q_RL - q_base lies in
    # [-base, 1 - base], base the seed mean of q_base over the included seeds (as the estimate; every seed when
    # none is, so the row still shows it)
    b = seed_mean("base", ok or list(comp))
    if np.isfinite(b):
        m[f"{f3}.room_lo"], m[f"{f3}.room_hi"] = -b, 1.0 - b
    return m
