"""Token samplers over a batch of logits: greedy, temperature, top-k, top-p (nucleus).

Legend: B batch, V vocab. The sampler is a frozen dataclass (static under jit); its settings compose:
temperature scales logits, then top-k keeps the k largest, then top-p keeps the smallest prefix of
the sorted distribution whose mass reaches p (always at least one token).
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp

_NEG = -1e30


@dataclasses.dataclass(frozen=True)
class Sampler:
    temperature: float = 1.0
    top_k: int = 0          # 0 = off
    top_p: float = 1.0      # 1.0 = off
    greedy: bool = False

    def __post_init__(self):
        if not self.greedy and not 0 < self.temperature < math.inf:
            raise ValueError(f"temperature must be finite and > 0 (use greedy=True for argmax), "
                             f"got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


GREEDY = Sampler(greedy=True)


def policy_logprobs(logits_BxV, sampler: Sampler):
    """log pi(.|context) of the policy being sampled: log_softmax(logits / temperature).

    This is the distribution RL treats as the behaviour policy (top-k/top-p truncation is a sampling
    device, not part of pi, as in verl); greedy uses temperature 1.
    """
    t = 1.0 if sampler.greedy else sampler.temperature
    return jax.nn.log_softmax(logits_BxV.astype(jnp.float32) / t, axis=-1)


def _filter(logits_BxV, sampler: Sampler):
    """Masks (to _NEG) the tokens outside top-k / top-p. The kept set is decided by token index (ranks
    from one sort), never by comparing a recomputed logit with a threshold: XLA may recompute the
    logits inside different fusions with different rounding, and a threshold test could then drop
    every token, the top one included (seen on XLA:CPU at -O0)."""
    x = logits_BxV
    b, v = x.shape
    rows = jnp.arange(b)[:, None]
    if sampler.top_k and sampler.top_k < v:
        _, top_idx = jax.lax.top_k(x, sampler.top_k)
        keep = jnp.zeros((b, v), bool).at[rows, top_idx].set(True)
        x = jnp.where(keep, x, _NEG)
    if sampler.top_p < 1.0:
        order_BxV = jnp.argsort(-x, axis=-1, stable=True)  # descending; ties keep index order
        sorted_desc = jnp.take_along_axis(x, order_BxV, axis=-1)
        probs = jax.nn.softmax(sorted_desc, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each sorted token
        keep_sorted = (before < sampler.top_p).at[:, 0].set(True)  # the top token always stays
        keep = jnp.zeros((b, v), bool).at[rows, order_BxV].set(keep_sorted)
        x = jnp.where(keep, x, _NEG)
    return x


def sample(key, logits_BxV, sampler: Sampler, gumbel_BxV=None):
    """(tokens [B] int32, logprobs [B] under `policy_logprobs`).

    Non-greedy tokens are argmax(filtered log pi + g) with g standard Gumbel noise (the Gumbel-max
    trick, as `jax.random.categorical`): g is drawn from `key`, or given as `gumbel_BxV` (pre-drawn
    for many steps at once by `decode`; `key` is then unused)."""
    logp_BxV = policy_logprobs(logits_BxV, sampler)
    if sampler.greedy:
        tokens = jnp.argmax(logits_BxV, axis=-1)
    else:
        if gumbel_BxV is None:
            gumbel_BxV = jax.random.gumbel(key, logp_BxV.shape, jnp.float32)
        tokens = jnp.argmax(_filter(logp_BxV, sampler) + gumbel_BxV, axis=-1)
    tokens = tokens.astype(jnp.int32)
    return tokens, jnp.take_along_axis(logp_BxV, tokens[:, None], axis=-1)[:, 0]
