"""Supervised fine-tuning of a study's base policy, shared by both studies (FrozenLake's expert episodes,
`stages.train_base`; the host domains' reference solutions, `host.sft`): the budgets announced in its episodes
(`sft_budgets`) and the AdamW fit on target tokens (`fit_sft`).
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import numpy as np
import optax

from jaxagent import sharding
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.models.config import Qwen3Config
from jaxagent.rl.sft import make_sft_step

BASE_BUDGET_MODES = ("full", "budgetmix")


def sft_budgets(key, n: int, t_max: int, budget_mode: str) -> np.ndarray:
    """int32[n] budgets of SFT episodes: T_max ("full") or BudgetMix draws ("budgetmix"), `BaseSettings`."""
    if budget_mode == "full":
        return np.full((n,), int(t_max), np.int32)
    if budget_mode == "budgetmix":
        return np.asarray(budgets_lib.sample_budgetmix(key, n, 1, t_max), np.int32)
    raise ValueError(f"budget_mode must be one of {BASE_BUDGET_MODES}, got {budget_mode!r}")



def sft_optimizer(lr: float, warmup: int, steps: int):
    """`fit_sft`'s AdamW: the learning rate warmed up linearly over min(warmup, steps // 5) steps to `lr`, then
    cosine-decayed to lr / 10 at `steps`; no weight decay."""
    warmup = min(warmup, steps // 5)
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr * 0.1)
    return optax.adamw(sched, weight_decay=0.0)



def fit_sft(params, cfg: Qwen3Config, toks_ExS, mask_ExS, k_batch, *, steps: int, batch_size: int, lr: float,
            warmup: int, callback: Optional[Callable[[int, dict], None]] = None, mesh=None,
            targets: Optional[int] = None, width_bucket: Optional[int] = None):
    """(params, records): `steps` AdamW updates of `rl.sft` on batches of `batch_size` rows drawn with
    replacement from the E rows (toks_ExS, mask_ExS: the targets), learning rate warmed up linearly over
    min(warmup, steps // 5) steps to `lr`, then cosine-decayed to lr / 10. `targets`: the loss's target
    positions per row (`rl.sft.make_sft_step`). With a `mesh` each batch is split over its batch axes (when they
    divide batch_size; else replicated). A record {step, loss, token_accuracy, grad_norm} per step when there is
    a `callback` (which gets each), else the last step's only. `width_bucket`: each batch is cut to the slots up to
    its rows' last target, rounded up to a multiple of width_bucket (one compile per width; the slots cut hold no
    target and, the attention being causal, change no target's logits); None: every batch at width S."""
    if width_bucket is not None and width_bucket < 1:
        raise ValueError(f"width_bucket must be >= 1 or None, got {width_bucket}")
    ends_E = (np.asarray(mask_ExS).shape[1] - np.argmax(np.asarray(mask_ExS)[:, ::-1], axis=1)
              if width_bucket is not None else None)  # one past each row's last target
    row_sh = None if mesh is None else sharding.batch_sharding(mesh, 2, batch_size=batch_size)
    opt = sft_optimizer(lr, warmup, steps)
    opt_state = opt.init(params)
    step = make_sft_step(cfg, opt, targets)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(k_batch)).ravel()[-1])
    records = []
    for i in range(steps):
        idx = rng.integers(0, len(toks_ExS), batch_size)
        tb, mb = toks_ExS[idx], mask_ExS[idx]
        if ends_E is not None:
            width = min(int(-(-ends_E[idx].max() // width_bucket) * width_bucket), tb.shape[1])
            tb, mb = tb[:, :width], mb[:, :width]
        if row_sh is not None:
            tb, mb = jax.device_put(tb, row_sh), jax.device_put(mb, row_sh)
        params, opt_state, m = step(params, opt_state, tb, mb)
        if callback is not None or i == steps - 1:
            rec = {"step": i, **{k: float(v) for k, v in m.items()}}
            records.append(rec)
            if callback is not None:
                callback(i, rec)
    return params, records
