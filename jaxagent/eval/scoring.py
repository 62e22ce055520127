"""Exact scoring on FrozenLake: the next-action distribution of a policy at a context, and teacher-forced
log-probs of whole trajectories (the likelihood diagnostics, `likelihood`).

Exact next-action distribution (`reply_logprobs`, `next_action_probs`): at a context (the episode's tokens up to a
turn's generation prompt), pi(a) = prod_j pi(reply_a[j] | context, reply_a[:j]) for the canonical reply of action a
(its answer string + the first stop token), computed by teacher forcing (the context prefilled once into a KV cache,
the A replies appended as A rows; never token by token) with the sampler's temperature. The remaining mass
1 - sum_a pi(a) is "invalid": scored as the worst outcome `step_quality.INVALID_VALUE` (0, a failed episode), never
as staying put; jaxagent's choice: a non-canonical reply that still parses counts in that mass. Scoring runs in
fixed `score_batch` / `batch_size` chunks (one compile per chunk shape). Why invalid is scored so: docs/study.md,
"jaxagent's definitions" (Step quality).

Dimension legend (CONVENTIONS.md): I states (contexts), S context slots, A env actions (4), O = A + 1
outcomes (the A canonical replies and "anything else" = invalid), M canonical reply tokens, G actions drawn
per state, B rows (I x A replies; trajectories), T tokens, N turns, V vocab.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent import xla_options
from jaxagent.envs.jax import frozenlake_solver as fls
from jaxagent.envs.jax.frozenlake import ACTION_STRINGS
from jaxagent.eval import likelihood as lk
from jaxagent.eval import step_quality as sq
from jaxagent.eval.driver_common import pad_index, row_placement, to_host
from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent.rl.logprobs import token_logprobs
from jaxagent.rollout import types


def canonical_replies(world) -> tuple[np.ndarray, np.ndarray]:
    """Canonical reply of each env action a (ACTION_STRINGS order): its answer tokens + the first stop
    token, as the rollout writes a forced action. Returns (replies int32[A, M] pad-filled, lengths int32[A])."""
    codec, layout = world.codec, world.layout
    table, lens = np.asarray(codec.action_tokens_AxPa), np.asarray(codec.action_lens_A)
    out = np.full((fls.N_ACTIONS, table.shape[1] + 1), layout.pad_id, np.int32)
    out_len = np.zeros(fls.N_ACTIONS, np.int32)
    for a, text in enumerate(ACTION_STRINGS):
        k = codec.actions.index(text)
        out[a, :lens[k]] = table[k, :lens[k]]
        out[a, lens[k]] = layout.stop_ids[0]
        out_len[a] = lens[k] + 1
    return out, out_len


@functools.partial(xla_options.jit, static_argnames=("cfg", "temperature"))
def reply_logprobs_jit(params, ctx_IxS, ctx_len_I, replies_AxM, reply_len_A, *, cfg, temperature):
    s, w = ctx_IxS.shape
    a, r = replies_AxM.shape
    cache = qwen3.init_cache(cfg, s, w + r, jax.tree.leaves(params)[0].dtype)
    # The context once per state: next-token logits at its last token, and its KV rows.
    first_Ix1xV, cache = qwen3.forward(params, cfg, ctx_IxS, cache=cache, n_valid=ctx_len_I,
                                       logits_index=jnp.maximum(ctx_len_I - 1, 0))
    rep = lambda x: jnp.repeat(x, a, axis=0)  # noqa: E731  row s * A + a
    cache_a = {"k": [rep(x) for x in cache["k"]], "v": [rep(x) for x in cache["v"]], "length": rep(cache["length"])}
    toks_BxM = jnp.tile(replies_AxM, (s, 1))
    lens_B = jnp.tile(reply_len_A, s)
    # Replies appended after each context (slot ctx_len on): logits_r[:, j] predicts reply token j + 1.
    logits_BxMxV, _ = qwen3.forward(params, cfg, toks_BxM, cache=cache_a, n_valid=lens_B)
    pred_BxMxV = jnp.concatenate([rep(first_Ix1xV), logits_BxMxV[:, :-1]], axis=1).astype(jnp.float32)
    logp_BxMxV = jax.nn.log_softmax(pred_BxMxV / temperature, axis=-1)
    tok_BxM = jnp.take_along_axis(logp_BxMxV, toks_BxM[..., None], axis=-1)[..., 0]
    tok_BxM = jnp.where(jnp.arange(r)[None, :] < lens_B[:, None], tok_BxM, 0.0)
    return jnp.sum(tok_BxM, axis=-1).reshape(s, a)


def reply_logprobs(world, cfg: Qwen3Config, params, ctx_IxS, ctx_len_I, *, temperature: float = 1.0,
                   score_batch: int = 16, mesh=None) -> jax.Array:
    """log pi(canonical reply of a | context) [I, A]: sum over the reply's tokens of
    log_softmax(logits / temperature), teacher-forced (module docstring); contexts are ctx[s, :ctx_len[s]]
    (right padding ignored), processed in chunks of `score_batch` states (one compile per (score_batch, S)).
    `mesh`: each chunk's states split over the mesh's batch axes, under `jax.set_mesh`
    (`driver_common.row_placement`)."""
    replies, rlens = canonical_replies(world)
    ctx_IxS = jnp.asarray(ctx_IxS, jnp.int32)
    ctx_len = np.asarray(ctx_len_I, np.int32)
    s, w = ctx_IxS.shape
    if ctx_len.shape != (s,) or s == 0:
        raise ValueError(f"ctx_len_I must have shape ({s},) for {s} contexts, got {ctx_len.shape}")
    if ctx_len.min() < 1 or ctx_len.max() + replies.shape[1] > w:
        raise ValueError(f"every context needs 1 <= length and length + {replies.shape[1]} reply tokens <= "
                         f"width {w}; got lengths in [{ctx_len.min()}, {ctx_len.max()}]")
    idx = pad_index(s, int(score_batch))
    place, context, gather = row_placement(mesh, int(score_batch))
    parts = []
    for i in range(0, len(idx), score_batch):
        with context():
            parts.append(gather(reply_logprobs_jit(
                params, *place((ctx_IxS[idx[i:i + score_batch]], jnp.asarray(ctx_len[idx[i:i + score_batch]]))),
                jnp.asarray(replies), jnp.asarray(rlens), cfg=cfg, temperature=float(temperature))))
    return jnp.concatenate(parts, axis=0)[:s]


def next_action_probs(world, cfg: Qwen3Config, params, ctx_IxS, ctx_len_I, *, temperature: float = 1.0,
                      score_batch: int = 16, mesh=None) -> jax.Array:
    """pi over the O = A + 1 outcomes [I, O]: exp(`reply_logprobs`) for the A actions, then the remaining
    mass max(0, 1 - sum_a pi(a)) as "invalid" (module docstring)."""
    p_IxA = jnp.exp(reply_logprobs(world, cfg, params, ctx_IxS, ctx_len_I, temperature=temperature,
                                   score_batch=score_batch, mesh=mesh))
    return jnp.concatenate([p_IxA, jnp.clip(1.0 - p_IxA.sum(-1, keepdims=True), 0.0, 1.0)], axis=-1)


@functools.partial(jax.jit, static_argnames=("env",))
def _q_outcomes_jit(states, h_I, env_params, *, env):
    def one(state, h):
        q_A = env.q_values(state, h, env_params)
        return jnp.concatenate([q_A, jnp.full((1,), sq.INVALID_VALUE, q_A.dtype)])  # invalid: the worst outcome
    return jax.vmap(one)(states, h_I)


def q_outcomes(world, states, h_I, env_params) -> jax.Array:
    """q [I, O]: Q*_h(s, a) for the A actions (h = remaining turns, discount env_params.gamma) and the
    invalid outcome scored as invalid: `step_quality.INVALID_VALUE` (0, the value of a failed episode)."""
    return _q_outcomes_jit(states, jnp.asarray(h_I, jnp.int32), env_params, env=world.env)


def expected_quality(probs_IxO, q_IxO) -> jax.Array:
    """Exact mean quality of a policy at each state [I]: sum_o pi(o | s) q(s, o)."""
    return jnp.sum(jnp.asarray(probs_IxO, jnp.float32) * jnp.asarray(q_IxO, jnp.float32), axis=-1)


def sample_outcomes(u_IxG, probs_IxO) -> jax.Array:
    """Inverse-CDF draws int32[I, G] from pi(. | s) given uniforms u in [0, 1): outcome o with
    cdf[o-1] <= u * cdf[-1] < cdf[o]. Shared uniforms give two policies common random numbers."""
    cdf_IxO = jnp.cumsum(jnp.asarray(probs_IxO, jnp.float32), axis=-1)
    x_IxG = jnp.asarray(u_IxG, jnp.float32) * cdf_IxO[:, -1:]
    o = jnp.sum(x_IxG[:, :, None] >= cdf_IxO[:, None, :], axis=-1)
    return jnp.minimum(o, cdf_IxO.shape[-1] - 1).astype(jnp.int32)


# ----------------------------------------------------------------------------- teacher-forced log-probs
token_logprobs_jit = xla_options.jit(token_logprobs, static_argnums=1, sequence=True)


def teacher_forced_logprobs(params, cfg: Qwen3Config, tokens_BxT, *, batch_size: Optional[int] = None,
                            mesh=None) -> jax.Array:
    """logp [B, T], logp[:, t] = log pi(tokens[t] | tokens[:t]) (temperature 1; `train_step.token_logprobs`),
    one jitted forward per chunk of `batch_size` rows (None: all rows at once). `mesh`: each chunk's rows
    split over the mesh's batch axes, under `jax.set_mesh` (`driver_common.row_placement`)."""
    tokens_BxT = jnp.asarray(tokens_BxT, jnp.int32)
    n = tokens_BxT.shape[0]
    size = n if batch_size is None else int(batch_size)
    idx = pad_index(n, size)
    place, context, gather = row_placement(mesh, size)
    parts = []
    for i in range(0, len(idx), size):
        with context():
            parts.append(gather(token_logprobs_jit(params, cfg, place(tokens_BxT[idx[i:i + size]]))))
    return jnp.concatenate(parts, axis=0)[:n]


def likelihood(world, cfg: Qwen3Config, params_base, params_rl, rollouts_base: types.Rollout,
               rollouts_rl: types.Rollout, key, *, task_ids_base=None, task_ids_rl=None, rel_tol: float = 0.1,
               n_boot: int = 1000, batch_size: Optional[int] = None, mesh=None) -> dict:
    """Likelihood diagnostics (docs/study.md finding 5 and "jaxagent's definitions"), teacher-forced at
    temperature 1 in batched jitted passes over each rollout's whole token buffer.

    nll_rl_actions / nll_base_actions: per-action NLL under pi_base (sum of -log pi_base over the action's
    policy tokens, `likelihood.action_nll`) of RL's and of base's actions: flat arrays of every action and
    their means. llr_rl / llr_base (one per trajectory): cumulative log pi_RL(tau) - log pi_base(tau) over each
    trajectory's policy tokens; mean_llr_success_rl / _base over successful trajectories (NaN without).
    Length-matched pairs (same task, both successful, policy-token counts within rel_tol of the longer;
    `likelihood.length_matched_pairs`) and the mean paired LLR difference RL - base with a bootstrap CI
    (`likelihood.matched_difference`). Task ids default to the row index (row i ran task i); pass
    task_ids_* when rows repeat tasks (e.g. np.repeat(np.arange(P), Z)). `mesh`: as `teacher_forced_logprobs`.
    """
    tid = {}
    for name, r, ids in (("base", rollouts_base, task_ids_base), ("rl", rollouts_rl, task_ids_rl)):
        n = r.tokens.shape[0]
        tid[name] = np.arange(n, dtype=np.int32) if ids is None else np.asarray(ids, np.int32)
        if tid[name].shape != (n,):
            raise ValueError(f"task_ids_{name} must have shape ({n},), got {tid[name].shape}")
    n_turns = rollouts_base.turns.active.shape[1]
    tf = functools.partial(teacher_forced_logprobs, cfg=cfg, batch_size=batch_size, mesh=mesh)
    out = {}
    for name, r in (("base", rollouts_base), ("rl", rollouts_rl)):
        turn_ids = lk.policy_turn_ids(r.turn_index, r.policy_mask)
        logp_base, logp_rl = tf(params_base, tokens_BxT=r.tokens), tf(params_rl, tokens_BxT=r.tokens)
        nll = lk.action_nll(logp_base, turn_ids, n_turns)
        llr = lk.cumulative_llr(logp_rl, logp_base, turn_ids)
        ok = r.success.astype(jnp.float32)
        out[f"nll_{name}_actions"] = np.asarray(nll["nll"])[np.asarray(nll["action_mask"])]
        out[f"mean_nll_{name}_actions"] = nll["mean_nll"]
        out[f"llr_{name}"] = llr
        out[f"mean_llr_success_{name}"] = jnp.sum(llr * ok) / jnp.sum(ok)
        out[f"success_{name}"] = r.success
        out[f"policy_tokens_{name}"] = lk.policy_token_counts(turn_ids)
    pairs = lk.length_matched_pairs(tid["rl"], out["success_rl"], out["policy_tokens_rl"], tid["base"],
                                    out["success_base"], out["policy_tokens_base"], rel_tol=rel_tol)
    out.update(match=pairs["match"], n_pairs=pairs["n_pairs"], n_pair_tasks=pairs["n_tasks"],
               matched_llr_diff=lk.matched_difference(out["llr_rl"], out["llr_base"], pairs["match"], key,
                                                      n_boot=n_boot))
    return to_host(out)
