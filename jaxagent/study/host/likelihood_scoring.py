"""Finding 5's measurements on a host-env domain (the finding, its metrics and the report rows: `likelihood`): each
full-budget held-out episode's exact tokens kept in the eval log while it runs (`TokenLog`), and every policy token
scored teacher-forced under base and RL (`score_records`, `score_seed`).

Episodes: per GRPO seed s, base's and seed s's held-out evaluation episodes at the full budget tier (the eval logs'
`f5_tokens`). Every policy token y_t (the tokens the policy sampled; prompts, tool outputs and the chat template are
not policy tokens) is scored teacher-forced under pi_base and pi_RL at temperature 1, the evaluation's, with the
params as the eval rollouts sample from them (`rollout_params`: the run's compute dtype, on its mesh).
Quantities per episode tau (PAPER.md, "jaxagent's definitions"):
    action NLL under base   nll(a) = - sum_{t in a} log pi_base(y_t | y_<t)   per action a (one reply of the policy)
    cumulative LLR          llr(tau) = sum_{t policy token of tau} [log pi_RL(y_t | y_<t) - log pi_base(y_t | y_<t)]
    policy-token count      n(tau) = number of policy tokens of tau  (docs/host_study.md, "Finding 5, likelihood").

Dimension legend (CONVENTIONS.md): B rows of a scoring batch (episodes), T tokens of an episode's sequence, M policy
tokens of an episode (all its replies' tokens), U budget tiers, P tasks, Z samples per task and tier.
"""
from __future__ import annotations

import base64
import functools
import zlib
from typing import Callable, Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np

from jaxagent import xla_options
from jaxagent.eval.driver_common import pad_index, row_placement
from jaxagent.rl import logprobs
from jaxagent.sampling.generate import rollout_params

WIDTH_MULTIPLE = 256    # a scoring batch's width: the longest episode rounded up to this (one compile per width)
POSITION_MULTIPLE = 64  # its policy positions: the most policy tokens of an episode rounded up to this
LOG_KEY = "f5_tokens"   # the eval log's entry (`TokenLog.log_entry`)


# ----------------------------------------------------------------------------- the episodes' tokens in the log
def encode_tokens(tokens_T) -> str:
    """int32 token ids -> base64 of their zlib-compressed little-endian bytes (JSON-able, compact)."""
    return base64.b64encode(zlib.compress(np.asarray(tokens_T, "<i4").tobytes(), 6)).decode("ascii")


def decode_tokens(text: str) -> np.ndarray:
    """`encode_tokens`' inverse: int32 [T]."""
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), "<i4").astype(np.int32)


def token_record(tokens_S, policy_mask_S, turn_index_S, length: int) -> dict:
    """One episode's compact record: {"tokens": `encode_tokens` of its first `length` slots, "spans": [[turn,
    start, count], ...]}, one span per turn with policy tokens (a turn's policy tokens are contiguous: its reply)."""
    n = int(length)
    tok, pol, turn = (np.asarray(x)[:n] for x in (tokens_S, policy_mask_S, turn_index_S))
    spans = []
    for t in sorted(set(turn[pol.astype(bool)].tolist())):
        pos = np.flatnonzero(pol.astype(bool) & (turn == t))
        if pos[-1] - pos[0] + 1 != pos.size:
            raise ValueError(f"the policy tokens of turn {t} are not contiguous (slots {pos.tolist()[:8]}...)")
        spans.append([int(t), int(pos[0]), int(pos.size)])
    return {"tokens": encode_tokens(tok), "spans": spans}


def record_policy_positions(record: Mapping) -> np.ndarray:
    """int32 slots of a record's policy tokens, in span (turn) order."""
    parts = [np.arange(s, s + c, dtype=np.int32) for _, s, c in record["spans"]]
    return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


class TokenLog:
    """Collects `token_record`s of the episodes with budget `keep_budget` from each evaluation rollout batch
    (`wrap` a `run_pass_episodes` rollout function); `log_entry` orders them as the [U, P, Z] grid."""

    def __init__(self, keep_budget: int):
        self.keep_budget = int(keep_budget)
        self.batches: list[list] = []

    def wrap(self, rollout_fn: Callable) -> Callable:
        def fn(idx_B, budgets_B, key):
            ro = rollout_fn(idx_B, budgets_B, key)
            self.add(ro, budgets_B)
            return ro
        return fn

    def add(self, ro, budgets_B) -> None:
        tokens, pol, turn, length = (np.asarray(x) for x in (ro.tokens, ro.policy_mask, ro.turn_index, ro.length))
        self.batches.append([token_record(tokens[b], pol[b], turn[b], length[b])
                             if int(budgets_B[b]) == self.keep_budget else None for b in range(tokens.shape[0])])

    def log_entry(self, batch_sizes: Sequence[int], grid_shape: Sequence[int], tier: int = -1) -> dict:
        """{"tier": u, "episodes": the records of tier u's P x Z episodes, task-major}: the first batch_sizes[i]
        rows of batch i (the rest are padding) laid out tier-major over grid_shape = (U, P, Z)."""
        if len(batch_sizes) != len(self.batches):
            raise ValueError(f"{len(self.batches)} rollout batches for {len(batch_sizes)} batch sizes")
        flat = [r for rows, n in zip(self.batches, batch_sizes) for r in rows[:n]]
        n_u, n_p, n_z = (int(x) for x in grid_shape)
        if len(flat) != n_u * n_p * n_z:
            raise ValueError(f"{len(flat)} episodes for a grid of {n_u} x {n_p} x {n_z}")
        u = range(n_u)[tier]
        eps = flat[u * n_p * n_z:(u + 1) * n_p * n_z]
        if any(e is None for e in eps):
            raise ValueError(f"tier {u}'s episodes do not all have budget {self.keep_budget}")
        return {"tier": u, "episodes": eps}


# ----------------------------------------------------------------------------- scoring
@functools.partial(xla_options.jit, static_argnames=("cfg",), sequence=True)
def policy_logprobs_jit(params, tokens_BxT, pos_BxM, *, cfg):
    """logp [B, M], logp[b, j] = log pi(tokens[b, pos[b, j]] | tokens[b, :pos[b, j]]) (temperature 1), 0 where
    pos[b, j] = 0 (the padding): `logprobs.next_token_stats` at the positions (`positions_BxM`), so the vocabulary
    is unembedded only at the states that predict the policy tokens, read back at those positions."""
    h_BxTxD = logprobs.hidden(params, cfg, tokens_BxT)
    logp_BxT, _ = logprobs.next_token_stats(logprobs.head_matrix(params, cfg), cfg, h_BxTxD, tokens_BxT,
                                            positions_BxM=pos_BxM)
    return jnp.take_along_axis(logp_BxT, pos_BxM, axis=1)


def score_records(params, cfg, records: Sequence[Mapping], *, batch_size: int, mesh=None, compute_dtype=None,
                  max_width: Optional[int] = None) -> list[np.ndarray]:
    """Per record, log pi(y_t | y_<t) of each policy token (float32 [n(tau)], span order), teacher-forced at
    temperature 1 (`policy_logprobs_jit`: the logits only at the policy tokens, so the vocabulary's unembedding
    never runs over prompts and tool outputs) on the params as the eval rollouts use them (`rollout_params`: cast
    to `compute_dtype`, placed on `mesh`). The sequences are right-padded to one width, the longest rounded up to
    `WIDTH_MULTIPLE` (at most `max_width`; causal attention: padding never changes an earlier position), the policy
    positions to the most policy tokens rounded up to `POSITION_MULTIPLE`, in chunks of `batch_size` rows (the last
    padded with copies of its last row; one compile per shape). `mesh`: each chunk's rows over the mesh's batch
    axes, under `jax.set_mesh` (`driver_common.row_placement`)."""
    if not records:
        return []
    toks = [decode_tokens(r["tokens"]) for r in records]
    pos = [record_policy_positions(r) for r in records]
    if any(p.size and (p.min() < 1 or p.max() >= t.size) for p, t in zip(pos, toks)):
        raise ValueError("a record's policy spans fall outside its tokens (or on its first token)")
    longest = max(max(t.size for t in toks), 2)
    width = -(-longest // WIDTH_MULTIPLE) * WIDTH_MULTIPLE
    if max_width is not None:
        if longest > max_width:
            raise ValueError(f"an episode has {longest} tokens, more than max_width={max_width}")
        width = min(width, int(max_width))
    n_pos = -(-max(max(p.size for p in pos), 1) // POSITION_MULTIPLE) * POSITION_MULTIPLE
    tokens_BxT = np.zeros((len(toks), width), np.int32)
    pos_BxM = np.zeros((len(toks), n_pos), np.int32)  # 0: padding (`policy_logprobs_jit`)
    for i, (t, p) in enumerate(zip(toks, pos)):
        tokens_BxT[i, :t.size] = t
        pos_BxM[i, :p.size] = p
    prm = rollout_params(params, cfg, mesh=mesh, compute_dtype=compute_dtype)
    size = int(batch_size)
    idx = pad_index(len(toks), size)
    place, context, gather = row_placement(mesh, size)
    parts = []
    for i in range(0, len(idx), size):
        rows = idx[i:i + size]
        with context():
            parts.append(np.asarray(gather(policy_logprobs_jit(
                prm, *place((jnp.asarray(tokens_BxT[rows]), jnp.asarray(pos_BxM[rows]))), cfg=cfg)), np.float32))
    logp_BxM = np.concatenate(parts, axis=0)
    return [logp_BxM[i, :p.size] for i, p in enumerate(pos)]


def episode_numbers(record: Mapping, logp_base, logp_rl) -> dict:
    """One episode's finding-5 numbers from its policy tokens' log-probs under base and RL (span order):
    n (policy tokens), llr = sum(logp_rl - logp_base), logp_base / logp_rl (their sums) and nll_actions
    (per span, -sum of logp_base over it)."""
    lb, lr = np.asarray(logp_base, np.float64), np.asarray(logp_rl, np.float64)
    cuts = np.cumsum([c for _, _, c in record["spans"]])[:-1]
    return {"n_tokens": int(lb.size), "llr": float(np.sum(lr - lb)), "logp_base": float(lb.sum()),
            "logp_rl": float(lr.sum()), "nll_actions": [float(-x.sum()) for x in np.split(lb, cuts)]
            if record["spans"] else []}


def _side(log: Mapping, label: str) -> tuple[list, np.ndarray, np.ndarray]:
    """(records, task index [P*Z], success [P*Z]) of one eval log's kept tier."""
    entry = log.get(LOG_KEY)
    if entry is None:
        raise ValueError(f"the eval log of {label!r} has no episode tokens ({LOG_KEY!r}); re-evaluate it")
    succ = np.asarray(log["success"], bool)[entry["tier"]]
    n_p, n_z = succ.shape
    if len(entry["episodes"]) != n_p * n_z:
        raise ValueError(f"the eval log of {label!r} has {len(entry['episodes'])} token records for {n_p} x {n_z}")
    return entry["episodes"], np.repeat(np.arange(n_p), n_z), succ.reshape(-1)


def score_seed(base_params, rl_params, cfg, base_log: Mapping, rl_log: Mapping, *, batch_size: int, mesh=None,
               compute_dtype=None, max_width: Optional[int] = None, memo: Optional[dict] = None) -> dict:
    """Finding 5's per-episode numbers of one GRPO seed (JSON-able): for "base" (base's kept episodes) and "rl"
    (the seed's), per episode the task index, success, tier and `episode_numbers`, every policy token scored under
    both policies (`score_records`). `memo` (a dict shared over seeds) keeps base's episodes scored under base."""
    kw = dict(batch_size=batch_size, mesh=mesh, compute_dtype=compute_dtype, max_width=max_width)
    memo = {} if memo is None else memo
    out = {}
    for side, log in (("base", base_log), ("rl", rl_log)):
        recs, task, succ = _side(log, side)
        if side == "base":
            if "base" not in memo:
                memo["base"] = score_records(base_params, cfg, recs, **kw)
            lp_base = memo["base"]
        else:
            lp_base = score_records(base_params, cfg, recs, **kw)
        lp_rl = score_records(rl_params, cfg, recs, **kw)
        nums = [episode_numbers(r, b, x) for r, b, x in zip(recs, lp_base, lp_rl)]
        out[side] = {"task": task.tolist(), "success": succ.tolist(), "tier": int(log[LOG_KEY]["tier"]),
                     **{k: [x[k] for x in nums] for k in ("n_tokens", "llr", "logp_base", "logp_rl", "nll_actions")}}
    return out
