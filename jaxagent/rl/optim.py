"""Optimizer factory: global-norm clipping + AdamW with a learning-rate schedule, behind a guard
that skips (and counts) any update whose gradients hold a NaN or an Inf.

The chain is `apply_if_finite(chain(clip_by_global_norm, adamw(schedule)))`: optax's
`apply_if_finite` checks the raw gradients *before* clipping, so one non-finite entry anywhere
rejects the whole step: the update is all zeros (params unchanged) and the inner state (Adam
moments, the schedule's step count) is kept as it was. `nonfinite_count(opt_state)` reads the
running number of skipped steps, `last_step_skipped(opt_state)` whether the last one was skipped.
"""
from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "cosine", "linear_warmup_cosine")
# apply_if_finite gives up (applies the update anyway) after this many consecutive bad steps; a
# trainer should never apply a NaN update, so the default is "never".
NEVER_GIVE_UP = 2**30


def make_schedule(lr: float, schedule: str = "constant", *, warmup_steps: int = 0,
                  total_steps: Optional[int] = None, final_lr_ratio: float = 0.0) -> optax.Schedule:
    """Learning rate as a function of the applied-update count.

    'constant'             : linear warmup 0 -> lr over warmup_steps (none if 0), then lr.
    'cosine'               : lr * (r + (1 - r) * (1 + cos(pi * s / total_steps)) / 2), r = final_lr_ratio
                             (Loshchilov & Hutter 2017, SGDR, without restarts).
    'linear_warmup_cosine' : linear warmup to lr over warmup_steps, then the cosine above over the
                             remaining total_steps - warmup_steps.
    """
    if lr <= 0:
        raise ValueError(f"learning rate must be positive, got {lr}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if not 0.0 <= final_lr_ratio <= 1.0:
        raise ValueError(f"final_lr_ratio must lie in [0, 1], got {final_lr_ratio}")
    if schedule == "constant":
        if warmup_steps == 0:
            return optax.constant_schedule(lr)
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup_steps),
                                     optax.constant_schedule(lr)], [warmup_steps])
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if total_steps is None or total_steps <= 0:
        raise ValueError(f"schedule {schedule!r} needs a positive total_steps, got {total_steps}")
    if schedule == "cosine":
        if warmup_steps:
            raise ValueError("schedule 'cosine' has no warmup; use 'linear_warmup_cosine'")
        return optax.cosine_decay_schedule(lr, total_steps, alpha=final_lr_ratio)
    if warmup_steps >= total_steps:
        raise ValueError(f"warmup_steps ({warmup_steps}) must be < total_steps ({total_steps})")
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup_steps, total_steps,
                                              end_value=lr * final_lr_ratio)


def make_optimizer(lr: float, *, schedule: str = "constant", warmup_steps: int = 0,
                   total_steps: Optional[int] = None, weight_decay: float = 0.0, b1: float = 0.9,
                   b2: float = 0.999, eps: float = 1e-8, max_grad_norm: Optional[float] = 1.0,
                   final_lr_ratio: float = 0.0, skip_nonfinite: bool = True,
                   max_consecutive_nonfinite: int = NEVER_GIVE_UP) -> optax.GradientTransformation:
    """clip_by_global_norm(max_grad_norm) -> AdamW(schedule, b1, b2, eps, weight_decay), guarded.

    AdamW: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization" (decay applied to
    every parameter, as torch.optim.AdamW does). Global-norm clipping: g <- g * min(1, c / ||g||_2)
    (Pascanu et al. 2013). max_grad_norm=None disables clipping. With skip_nonfinite, a step with
    non-finite gradients is skipped and counted (module doc).
    """
    if max_grad_norm is not None and max_grad_norm <= 0:
        raise ValueError(f"max_grad_norm must be positive or None, got {max_grad_norm}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    for name, b in (("b1", b1), ("b2", b2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"{name} must lie in [0, 1), got {b}")
    sched = make_schedule(lr, schedule, warmup_steps=warmup_steps, total_steps=total_steps,
                          final_lr_ratio=final_lr_ratio)
    parts = [] if max_grad_norm is None else [optax.clip_by_global_norm(max_grad_norm)]
    parts.append(optax.adamw(sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    tx = optax.chain(*parts)
    if skip_nonfinite:
        tx = optax.apply_if_finite(tx, max_consecutive_errors=max_consecutive_nonfinite)
    return tx


def _finite_state(opt_state: Any):
    leaves = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ApplyIfFiniteState))
    found = [x for x in leaves if isinstance(x, optax.ApplyIfFiniteState)]
    if not found:
        return None
    return found[0]


def nonfinite_count(opt_state: Any) -> jax.Array:
    """Total number of skipped (non-finite) updates so far; 0 if the optimizer has no guard."""
    s = _finite_state(opt_state)
    return jnp.zeros((), jnp.int32) if s is None else s.total_notfinite


def last_step_skipped(opt_state: Any) -> jax.Array:
    """1 if the most recent update was skipped for non-finite gradients, else 0 (int32)."""
    s = _finite_state(opt_state)
    return jnp.zeros((), jnp.int32) if s is None else (~s.last_finite).astype(jnp.int32)
