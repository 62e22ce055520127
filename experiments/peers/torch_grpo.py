"""The study's GRPO train-step loss in PyTorch (the peer of `jaxagent.rl.train_step` with `LossSettings` clip
0.2 / 0.28): PPO-clip on the policy tokens, token-mean over the whole batch.

    L = sum_{b,t} mask_bt max(-r_bt A_bt, -clip(r_bt, 1 - 0.2, 1 + 0.28) A_bt) / sum mask,
    r_bt = exp(clamp(log pi(x_bt | x_<t) - old_bt, -20, 20))

(Schulman et al. 2017, eq. 7; DAPO's clip-higher; the log-ratio clamp of `jaxagent.rl.losses.LOG_RATIO_CLAMP`).
Per-token arrays use the action token's index, as jaxagent's (`logp[:, t] = log pi(tokens[t] | tokens[:t])`), so
the logits of position t - 1 score token t. Both peers (CPU `bench_train`, accelerator `bench_accel`) call this.

Dimension legend: B rows, T tokens, V vocab.
"""
from __future__ import annotations

CLIP_LOW, CLIP_HIGH, LOG_RATIO_CLAMP = 0.2, 0.28, 20.0


def ppo_clip_terms(logits_BxTxV, tokens_BxT, old_BxT, adv_BxT, mask_BxT):
    """(masked loss sum, mask sum, metrics) of one batch or micro-batch; `old`, `adv`, `mask` are indexed by action
    token (their column 0 is never used). Metrics (no gradient): entropy, clip fraction and drift sums over the
    policy tokens, the same work the jax step does beside its loss."""
    import torch

    logsm = torch.log_softmax(logits_BxTxV[:, :-1].float(), dim=-1)
    tok = tokens_BxT[:, 1:]
    logp = logsm.gather(-1, tok[:, :, None]).squeeze(-1)
    old, adv, mask = old_BxT[:, 1:], adv_BxT[:, 1:], mask_BxT[:, 1:].float()
    ratio = torch.exp(torch.clamp(logp - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -ratio * adv
    clipped = -torch.clamp(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH) * adv
    loss_sum = (torch.maximum(unclipped, clipped) * mask).sum()
    with torch.no_grad():
        ent = -(logsm.exp() * logsm).sum(-1)
        metrics = [(ent * mask).sum(), ((clipped > unclipped).float() * mask).sum(), ((logp - old).abs() * mask).sum()]
    return loss_sum, mask.sum(), metrics
