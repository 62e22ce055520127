"""Training dynamics: trajectory reward R_multi vs single-step reward R_single, and a JSONL log of both.

Dimension legend (CONVENTIONS.md): B episodes of the training batch, I held-out states, A actions,
It logged records (iterations).

docs/study.md finding 6 and "jaxagent's definitions": R_multi = mean trajectory success on the training batch;
R_single = the single-turn success on fixed held-out tasks (FrozenLake: plan-mode success, `study.plan_mode`; the
host domains: the first reply's success, `study.host.dynamics`); the log stores both per logged iteration.
`optimal_action_mass` is a step-quality diagnostic, not R_single: it rises with trajectory success by construction.
R_multi's change (`r_multi_windows`): the first and the last W = min(R_MULTI_WINDOW, n // 2) of the n logged training
batches, each batch expanded to its 0/1 episode successes (W x B episodes per end); a window biases the change
toward 0, against the paper's direction. Training stability (`training_drawdown`, finding 7): a seed's fall from
its best W-iteration window of training-batch success to its last W, W = min(STABILITY_WINDOW, n // 2): 0 at its
best, up to 1; jaxagent's definition (the paper shows curves, no number). Why windows and not one batch per end:
docs/host_study.md, "Data" (Finding 6 on coding).
"""
from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.eval import value_checks

R_MULTI_WINDOW = 5  # training iterations averaged at each end of R_multi's change (module docstring)
STABILITY_WINDOW = 3  # training iterations per window of `training_drawdown` (module docstring)


def r_multi(success_B, mask_B=None) -> jax.Array:
    """R_multi = sum_b mask_b success_b / sum_b mask_b: mean trajectory success of the batch."""
    success_B = jnp.asarray(success_B, jnp.float32).reshape(-1)
    mask_B = jnp.ones_like(success_B) if mask_B is None else jnp.asarray(mask_B, jnp.float32).reshape(-1)
    return jnp.sum(success_B * mask_B) / mask_B.sum()


def optimal_action_mask(q_IxA, valid_IxA=None, *, tol: float = 0.0) -> jax.Array:
    """Q*-optimal actions bool[I, A]: valid a with Q*(s, a) >= max_{a' valid} Q*(s, a') - tol."""
    value_checks.require_ndim(q_IxA, 2, "q_IxA")
    q_IxA = jnp.asarray(q_IxA, jnp.float32)
    valid_IxA = jnp.ones(q_IxA.shape, bool) if valid_IxA is None else jnp.asarray(valid_IxA, bool)
    best_Ix1 = jnp.max(jnp.where(valid_IxA, q_IxA, -jnp.inf), axis=-1, keepdims=True)
    return valid_IxA & (q_IxA >= best_Ix1 - tol)


def optimal_action_mass(probs_IxA, optimal_IxA, state_mask_I=None) -> jax.Array:
    """mean_s sum_a pi(a | s) 1[a is Q*-optimal at s] over the (masked) held-out states."""
    value_checks.require_ndim(probs_IxA, 2, "probs_IxA")
    value_checks.require_same_shape(probs_IxA, optimal_IxA, "probs_IxA", "optimal_IxA")
    mass_I = jnp.sum(jnp.asarray(probs_IxA, jnp.float32) * jnp.asarray(optimal_IxA, jnp.float32), axis=-1)
    mask_I = jnp.ones_like(mass_I) if state_mask_I is None else jnp.asarray(state_mask_I, jnp.float32)
    return jnp.sum(mass_I * mask_I) / mask_I.sum()


def dynamics_deltas(r_multi_It, r_single_It) -> dict[str, jax.Array]:
    """Change over training, last logged value minus first (finding 6: R_multi +0.331, R_single -0.097)."""
    r_multi_It, r_single_It = jnp.asarray(r_multi_It, jnp.float32), jnp.asarray(r_single_It, jnp.float32)
    return {"r_multi_delta": r_multi_It[-1] - r_multi_It[0], "r_single_delta": r_single_It[-1] - r_single_It[0]}


class DynamicsLog:
    """Host-side append-only JSONL log of {step, r_multi, r_single} records (one JSON object a line)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)

    def append(self, step: int, r_multi: float, r_single: float) -> dict:
        """Append one record (values brought to the host as Python numbers) and return it."""
        record = {"step": int(step), "r_multi": float(r_multi), "r_single": float(r_single)}
        for name in ("r_multi", "r_single"):
            if not math.isfinite(record[name]):
                raise ValueError(f"{name} must be finite, got {record[name]} at step {record['step']}")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def read(self) -> list[dict]:
        """All records in file order; an absent file reads as no records."""
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def arrays(self) -> dict[str, np.ndarray]:
        """The records as arrays: step int64[Lg], r_multi float64[Lg], r_single float64[Lg]."""
        records = self.read()
        return {
            "step": np.asarray([r["step"] for r in records], np.int64),
            "r_multi": np.asarray([r["r_multi"] for r in records], np.float64),
            "r_single": np.asarray([r["r_single"] for r in records], np.float64),
        }


def _window_episodes(rates, n: int) -> np.ndarray:
    """The 0/1 successes of training batches of n episodes with these success rates: round(rate x n) ones per
    batch (a rate is its batch's mean success, so this is each batch up to order), concatenated."""
    ks = [int(round(float(r) * n)) for r in rates]
    return np.concatenate([np.concatenate([np.ones(k), np.zeros(n - k)]) for k in ks])


def r_multi_windows(rates, n: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(last window's episodes, first window's, W) from one seed's per-iteration training success rates (in
    iteration order) and its batch size n (module docstring); None with fewer than 2 iterations (no change)."""
    rates = [float(r) for r in rates]
    if len(rates) < 2 or n < 1:
        return None
    w = min(R_MULTI_WINDOW, len(rates) // 2)
    return _window_episodes(rates[-w:], n), _window_episodes(rates[:w], n), w


def training_drawdown(rates, window: int = STABILITY_WINDOW) -> tuple[float, int] | None:
    """(D, W) from one seed's per-iteration training success rates in iteration order (module docstring):
    D = max_i mean(rates[i : i + W]) - mean(rates[-W:]) >= 0 over the windows of W = min(window, n // 2)
    consecutive iterations; None with fewer than 2 rates."""
    r = np.asarray([float(x) for x in rates], np.float64)
    if r.size < 2 or window < 1:
        return None
    w = min(window, r.size // 2)
    means = np.convolve(r, np.ones(w) / w, mode="valid")  # mean of every run of w consecutive iterations
    return float(means.max() - means[-1]), w
