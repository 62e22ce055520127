"""Where a train step projects the vocabulary: a `LogitsPlan` turns (params, tokens, policy mask[, a packed list
of policy positions]) into per-token log-probs and entropies (and, with a reference, the reference's log-probs
and the exact KL), running the policy's forward on the way.

Dimension legend: B sequences, T tokens, M policy positions per row, N packed positions, D model width.

Modes, each giving the same values at the policy tokens (the loss reads no other position):
  full     every position (`logprobs.next_token_stats`);
  per-row  each row's first `policy_tokens` policy positions (`logprobs.policy_positions`);
  packed   one list of flat positions per micro-batch, batch[PACKED_KEY] (`logprobs.packed_policy_positions`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxagent.models.config import Qwen3Config
from jaxagent.rl.logprobs import (DEFAULT_LOGITS_CHUNK, head_matrix, hidden, next_token_stats, policy_positions,
                                  token_logprobs)

MODES = ("full", "per-row", "packed")
PACKED_KEY = "policy_index"  # int32 [Mb, N]: each micro-batch's policy positions in one list ('packed')


class TokenStats(NamedTuple):
    """A plan's outputs, [B, T] each (0 where not computed) but `hidden` [B, T, D] (the policy's final states)."""
    logp: jax.Array
    entropy: jax.Array
    hidden: jax.Array
    ref_logp: Optional[jax.Array] = None   # with ref_params: the reference's log-probs
    kl: Optional[jax.Array] = None         # with ref_params: KL(pi || pi_ref) over the vocabulary (`losses.exact_kl`)


@dataclasses.dataclass(frozen=True)
class LogitsPlan:
    """The log-prob computation of a train step (module doc); `compute_dtype` None: params used as they are;
    `remat`, `scan_layers`: how the forwards run their layers (`qwen3.hidden_states`)."""
    cfg: Qwen3Config
    mode: str = "full"
    policy_tokens: Optional[int] = None
    logits_chunk: Optional[int] = DEFAULT_LOGITS_CHUNK
    remat: Optional[str] = None
    compute_dtype: Any = None
    mesh: Optional[Mesh] = None
    scan_layers: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if (self.mode == "per-row") != (self.policy_tokens is not None):
            raise ValueError(f"policy_tokens goes with mode 'per-row' alone, got {self.policy_tokens!r} for "
                             f"{self.mode!r}")

    def cast(self, tree):
        """Params in the compute dtype (the forward passes'), or as they are."""
        if self.compute_dtype is None:
            return tree
        return jax.tree.map(lambda x: x.astype(self.compute_dtype), tree)

    def __call__(self, params, tokens_BxT, mask_BxT, index_N=None, ref_params=None) -> TokenStats:
        """The stats of the policy `params` (and, given `ref_params`, of the reference beside it, chunk by chunk,
        its forward and log-probs under stop_gradient) at this plan's positions; `index_N`: the packed list."""
        p = self.cast(params)
        h = hidden(p, self.cfg, tokens_BxT, self.remat, self.mesh, self.scan_layers)
        pos = flat = None
        if self.mode == "per-row" and self.policy_tokens < tokens_BxT.shape[1]:
            pos, _ = policy_positions(mask_BxT, self.policy_tokens)
        if self.mode == "packed":
            flat = index_N
        kw = dict(logits_chunk=self.logits_chunk, mesh=self.mesh, positions_BxM=pos, flat_positions_N=flat)
        if ref_params is None:
            return TokenStats(*next_token_stats(head_matrix(p, self.cfg), self.cfg, h, tokens_BxT, **kw), h)
        rp = jax.lax.stop_gradient(self.cast(ref_params))
        ref = (head_matrix(rp, self.cfg), jax.lax.stop_gradient(hidden(rp, self.cfg, tokens_BxT, self.remat,
                                                                        self.mesh, self.scan_layers)))
        logp, ent, ref_logp, kl = next_token_stats(head_matrix(p, self.cfg), self.cfg, h, tokens_BxT, ref=ref, **kw)
        return TokenStats(logp, ent, h, ref_logp, kl)

    def reference_logprobs(self, ref_params, tokens_BxT):
        """The reference's log-probs at every position (no gradient): the sampled-token KL estimators' input."""
        return jax.lax.stop_gradient(token_logprobs(self.cast(ref_params), self.cfg, tokens_BxT,
                                                    logits_chunk=self.logits_chunk, remat=self.remat, mesh=self.mesh,
                                                    scan_layers=self.scan_layers))

    def missed(self, mask_BxT, index_N=None):
        """The policy tokens of `mask_BxT` whose stats this plan does not compute (a scalar; 0 means none): per-row,
        those beyond `policy_tokens` in a row (int32); packed, those `index_N` does not list (f32; its padding
        reads position 0, never a policy token). None for 'full'."""
        if self.mode == "per-row":
            return policy_positions(mask_BxT, self.policy_tokens)[1]  # positions unused: dropped
        if self.mode == "packed":
            return (jnp.sum(mask_BxT.astype(jnp.int32))
                    - jnp.sum(mask_BxT.reshape(-1)[index_N].astype(jnp.int32))).astype(jnp.float32)
        return None
