"""Supervised fine-tuning on rollout token buffers: next-token cross-entropy on policy tokens only.

Legend: B sequences, S token slots, V vocab.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
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


def make_sft_step(cfg: Qwen3Config, optimizer: optax.GradientTransformation):
    """One jitted SFT update; params and optimizer state are donated."""

    @functools.partial(xla_options.jit, donate_argnums=(0, 1))
    def step(params, opt_state, tokens_BxS, mask_BxS):
        (loss, aux), grads = jax.value_and_grad(sft_loss, has_aux=True)(params, cfg, tokens_BxS, mask_BxS)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux,
                                                                 "grad_norm": optax.tree.norm(grads)}

    return step
