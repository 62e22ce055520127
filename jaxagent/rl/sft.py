"""Supervised fine-tuning on rollout token buffers: next-token cross-entropy on policy tokens only.

Legend: B sequences, S token slots, M target positions per row, D model width, V vocab.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config
from jaxagent import xla_options


def sft_loss(params, cfg: Qwen3Config, tokens_BxS, mask_BxS):
    """Mean over masked targets of -log pi(x_t | x_<t): L = -sum_t m_t log p(x_t|x_<t) / sum_t m_t.

    mask_BxS marks the tokens to learn (the expert's replies); position t is predicted from t-1.
    """
    logits, _ = qwen3.forward(params, cfg, tokens_BxS[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    tgt = jnp.take_along_axis(logp, tokens_BxS[:, 1:, None], axis=-1)[..., 0]
    m = mask_BxS[:, 1:].astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    acc = jnp.sum((jnp.argmax(logits, -1) == tokens_BxS[:, 1:]) * m) / n
    return -jnp.sum(tgt * m) / n, {"token_accuracy": acc}


def target_positions(mask_BxS, m: int):
    """(index int32[B, M], valid bool[B, M]): the first M positions t in [0, S-1) of each row whose next token
    is a target (mask[:, t + 1]), in order, padded with non-targets (valid False). M below a row's target count
    drops its last targets: `sft_loss_at_targets` callers size M from the data (`max_targets`)."""
    m_next = mask_BxS[:, 1:].astype(bool)
    index = jnp.argsort(~m_next, axis=1, stable=True)[:, :m].astype(jnp.int32)  # targets first, in order
    return index, jnp.take_along_axis(m_next, index, axis=1)


def max_targets(mask_BxS, multiple: int = 8) -> int:
    """The most target tokens (mask[:, 1:]) in any row, rounded up to `multiple` (a host-side count: the M of
    `sft_loss_at_targets` that keeps every target)."""
    n = int(np.max(np.sum(np.asarray(mask_BxS)[:, 1:], axis=1), initial=0))
    return max(multiple, -(-n // multiple) * multiple)


def sft_loss_at_targets(params, cfg: Qwen3Config, tokens_BxS, mask_BxS, m: int):
    """`sft_loss` with the vocabulary projection at the M target positions of each row only
    (`target_positions`): the same L = -sum_t m_t log p(x_t|x_<t) / sum_t m_t when M covers every row's targets.
    The [B, S, V] logits of `sft_loss` become [B, M, V]: with a 151,936-token vocabulary and short replies in
    long prompts (the host study's SFT rows) the projection is most of the step."""
    h_BxSxD, _ = qwen3.hidden_states(params, cfg, tokens_BxS[:, :-1])
    index_BxM, valid_BxM = target_positions(mask_BxS, m)
    logits = qwen3.unembed(params, cfg, jnp.take_along_axis(h_BxSxD, index_BxM[..., None], axis=1))
    tgt_BxM = jnp.take_along_axis(tokens_BxS[:, 1:], index_BxM, axis=1)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tgt_BxM[..., None], axis=-1)[..., 0]
    w = valid_BxM.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    acc = jnp.sum((jnp.argmax(logits, -1) == tgt_BxM) * w) / n
    return -jnp.sum(logp * w) / n, {"token_accuracy": acc}


def make_sft_step(cfg: Qwen3Config, optimizer: optax.GradientTransformation, targets: int | None = None):
    """One jitted SFT update; params and optimizer state are donated. `targets` M: the loss projects onto the
    vocabulary at M target positions per row only (`sft_loss_at_targets`); None: at every position (`sft_loss`)."""
    loss_fn = sft_loss if targets is None else functools.partial(sft_loss_at_targets, m=targets)

    @functools.partial(xla_options.jit, donate_argnums=(0, 1), sequence=True)
    def step(params, opt_state, tokens_BxS, mask_BxS):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, cfg, tokens_BxS, mask_BxS)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux,
                                                                 "grad_norm": optax.tree.norm(grads)}

    return step
