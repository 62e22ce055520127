"""The RL train step's losses: the PPO-clip policy loss (`make_policy_loss`) and the PPO critic's value loss added
to it (`with_value_loss`), each a `loss(params, batch) -> (loss, aux)` over one micro-batch.

Dimension legend: B sequences, S tokens (context slots), D model width, Mb micro-batches, N packed positions.

Batch (a dict of [B, S] arrays, one row per rollout, laid out like `rollout.types.Rollout`): tokens int32,
policy_mask (1 = a policy token, trained on), advantages f32, old_logprobs f32 (the sampler's, or the trainer's
pre-update ones when sampler_logprobs are given), optional ref_logprobs and sampler_logprobs f32, for the critic
returns and old_values f32 (aligned as in `critic`), with a packed `LogitsPlan` policy_index int32 [Mb, N].
Per-token arrays use one index, the action token: logp[:, t] = log pi(tokens[t] | tokens[:t]). Beside its rows,
the batch a loss reads holds `context(state, batch)`'s entries, made once per update on the whole batch: the
aggregation denominators (so micro-batch losses sum to the full-batch loss) and the reference params.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxagent.models.config import Qwen3Config
from jaxagent.rl import critic as critic_lib
from jaxagent.rl import losses
from jaxagent.rl.logits_plan import PACKED_KEY, LogitsPlan
from jaxagent.rl.train_state import LossSettings, ValueSettings

BATCH_KEYS = ("tokens", "policy_mask", "advantages", "old_logprobs")
PPO_KEYS = ("returns", "old_values")
OPTIONAL_KEYS = ("ref_logprobs", "sampler_logprobs")
REFERENCES = ("batch", "params")
DENOMINATORS, REF_PARAMS = "denominators", "ref_params"  # the context's entries (module doc)


def agg_denominator(mask_BxT, mode):
    """The denominator `losses.aggregate` divides by, before its max(., 1)."""
    valid = mask_BxT.astype(jnp.float32)
    if mode == "token-mean":
        return jnp.sum(valid)
    return jnp.sum((jnp.sum(valid, axis=-1) > 0).astype(jnp.float32))


def _check_rows(batch, need, micro_batches, packed):
    if not isinstance(batch, dict):
        raise ValueError(f"batch must be a dict of arrays, got {type(batch).__name__}")
    missing = [k for k in need if k not in batch]
    if missing:
        raise ValueError(f"batch lacks keys {missing} (needs {list(need)})")
    unknown = [k for k in batch if k not in BATCH_KEYS + PPO_KEYS + OPTIONAL_KEYS + ((PACKED_KEY,) if packed else ())]
    if unknown:
        hint = " (policy_index is for a step built with packed_policy=True)" if PACKED_KEY in unknown else ""
        raise ValueError(f"batch has unknown keys {unknown}{hint}")
    shape = batch["tokens"].shape
    if len(shape) != 2:
        raise ValueError(f"batch['tokens'] must be [B, S], got shape {shape}")
    if packed:
        index = batch[PACKED_KEY]
        if index.ndim != 2 or index.shape[0] != micro_batches or not jnp.issubdtype(index.dtype, jnp.integer):
            raise ValueError(f"batch['{PACKED_KEY}'] must be integer [micro_batches = {micro_batches}, N] "
                             f"(`logprobs.packed_policy_positions`), got {index.dtype} {index.shape}")
    for k, v in batch.items():
        if k != PACKED_KEY and v.shape != shape:
            raise ValueError(f"batch[{k!r}] has shape {v.shape}, expected {shape} like tokens")


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
    """`make_policy_loss`'s loss: `loss(params, batch) -> (loss, metrics)` and what a train step asks of it."""
    settings: LossSettings
    plan: LogitsPlan
    reference: str = "batch"

    @property
    def presplit(self) -> tuple:
        """Batch entries already split per micro-batch ([Mb, ...]: the step does not split their rows)."""
        return (PACKED_KEY,) if self.plan.mode == "packed" else ()

    def check(self, state, batch, micro_batches: int, need: tuple = ()):
        """Host-side: the batch's keys and shapes, and the reference the settings need (one-line ValueErrors)."""
        packed = self.plan.mode == "packed"
        _check_rows(batch, BATCH_KEYS + need + self.presplit, micro_batches, packed)
        ls, with_ref = self.settings, self.reference == "params"
        if ls.kl_coef and "ref_logprobs" not in batch and not with_ref:
            raise ValueError("kl_coef is nonzero: give batch['ref_logprobs'] or build the step "
                             "with_ref_params=True (and a state with ref_params)")
        if with_ref and state.ref_params is None:
            raise ValueError("the step was built with_ref_params=True but state.ref_params is None")
        if ls.kl_estimator == "exact" and "ref_logprobs" in batch:
            raise ValueError("kl_estimator='exact' computes the reference's full distribution itself: "
                             "drop batch['ref_logprobs']")

    def context(self, state, batch) -> dict:
        """The whole batch's aggregation denominators and the reference params (None when the batch carries the
        reference's log-probs: its forward is then skipped)."""
        mask = batch["policy_mask"]
        denoms = {"agg": agg_denominator(mask, self.settings.agg_mode), "tokens": jnp.sum(mask.astype(jnp.float32))}
        with_ref = self.reference == "params" and "ref_logprobs" not in batch
        return {DENOMINATORS: denoms, REF_PARAMS: state.ref_params if with_ref else None}

    def summary(self, batch, context) -> dict:
        """Metrics of the whole batch: tokens, and with a per-row plan policy_tokens_over."""
        out = {"tokens": context[DENOMINATORS]["tokens"]}
        if self.plan.mode == "per-row":
            out["policy_tokens_over"] = self.plan.missed(batch["policy_mask"])
        return out

    def __call__(self, params, batch):
        loss, metrics, _ = self.terms(params, batch)
        return loss, metrics

    def terms(self, params, batch):
        """(loss, metrics, (hidden [B, S, D], the micro-batch's token weight)) of one micro-batch; the loss is
        weighted by its aggregation denominator / the whole batch's (module doc of `train_step`). Without
        sampler_logprobs, old_logprobs are the sampler's and this forward is the trainer's pre-update policy (exact
        on the first update after a rollout)."""
        ls = self.settings
        tokens, mask, denoms = batch["tokens"], batch["policy_mask"], batch[DENOMINATORS]
        ref_params, flat = batch[REF_PARAMS], batch.get(PACKED_KEY)
        exact = ls.kl_estimator == "exact" and self.reference == "params"
        st = self.plan(params, tokens, mask, flat, ref_params if exact else None)
        logp, ent = st.logp, st.entropy
        ref_logp = st.ref_logp if exact else batch.get("ref_logprobs")
        if ref_logp is None and ref_params is not None:
            ref_logp = self.plan.reference_logprobs(ref_params, tokens)
        # the trainer's pre-update log-probs vs the sampler's (module doc)
        sampler_logp, old_logp = batch.get("sampler_logprobs"), batch["old_logprobs"]
        if sampler_logp is None:
            sampler_logp = old_logp
            if ls.tis_cap is not None:  # this step's forward is the pre-update trainer policy
                old_logp = jax.lax.stop_gradient(logp)
            train_logp = jax.lax.stop_gradient(logp)
        else:
            train_logp = old_logp
        valid = mask.astype(bool)
        gap = jnp.where(valid, jnp.abs(train_logp.astype(jnp.float32) - sampler_logp.astype(jnp.float32)), 0.0)
        pl, aux = losses.policy_loss(
            logp, old_logp, batch["advantages"], mask, clip_low=ls.clip_low, clip_high=ls.clip_high,
            agg_mode=ls.agg_mode, norm_len=ls.norm_len, kl_coef=ls.kl_coef, ref_logp=ref_logp,
            kl_estimator=ls.kl_estimator, kl_exact_BxT=st.kl, entropy_coef=ls.entropy_coef,
            entropy_BxT=ent if ls.entropy_coef else None,
            sampler_logp=sampler_logp if ls.tis_cap is not None else None, tis_cap=ls.tis_cap)
        w_agg = agg_denominator(mask, ls.agg_mode) / jnp.maximum(denoms["agg"], 1.0)
        w_tok = jnp.sum(mask.astype(jnp.float32)) / jnp.maximum(denoms["tokens"], 1.0)
        ent_mean = losses.aggregate(jax.lax.stop_gradient(ent), mask, "token-mean")
        m = {"loss": w_agg * pl, "pg_loss": w_agg * aux["pg_loss"],
             "kl": w_tok * aux.get("kl_ref_k3", jnp.zeros(())), "entropy": w_tok * ent_mean,
             "clip_frac": w_tok * aux["clip_frac"], "ratio_mean": w_tok * aux["ratio_mean"],
             "drift": w_tok * aux["approx_kl_old_abs"],
             "mismatch_mean": w_tok * losses.aggregate(gap, mask, "token-mean"), "mismatch_max": jnp.max(gap)}
        if self.plan.mode == "packed":
            m["policy_tokens_over"] = self.plan.missed(mask, flat)
        if exact:
            m["kl_exact"] = w_tok * losses.aggregate(jax.lax.stop_gradient(st.kl), mask, "token-mean")
        if ls.tis_cap is not None:
            m.update(tis_weight_mean=w_tok * aux["tis_weight_mean"], tis_trunc_frac=w_tok * aux["tis_trunc_frac"])
        return w_agg * pl, m, (st.hidden, w_tok)


def make_policy_loss(settings: LossSettings, plan: LogitsPlan, reference: str = "batch") -> PolicyLoss:
    """The policy's loss over one micro-batch, `loss(params, batch) -> (loss, metrics)`.

    L_pi = policy_loss(logp, old_logp, A, mask; clip_low, clip_high, agg_mode, norm_len,
    kl_coef * KL_ref(kl_estimator), entropy_coef * H) (`losses.policy_loss`: PPO-clip, Schulman et al. 2017
    eq. 7; DAPO's clip-higher, Yu et al. 2025; GRPO's KL to a reference, Shao et al. 2024 eq. 3-4; with
    settings.tis_cap, truncated importance weights min(pi_old / pi_sampler, C) on the sampler's log-probs, Yao et
    al. 2025), logp and H from `plan`. `reference` 'batch': the KL reference's log-probs come in
    batch['ref_logprobs'] (none: no KL term); 'params': from the state's ref_params (the reference's forward runs
    in the step, unless the batch carries ref_logprobs; with kl_estimator 'exact' its full distribution beside the
    policy's, `LogitsPlan(ref_params=)`).

    metrics (f32 scalars, micro-batch shares of the whole batch's): loss, pg_loss, kl (token-mean k3 estimate of
    KL(pi || pi_ref) on policy tokens whatever the estimator; 0 without a reference), entropy, clip_frac,
    ratio_mean, drift (token-mean |old_logp - logp|), mismatch_mean / mismatch_max (|log p_train - log p_sampler|
    over policy tokens), with the exact KL kl_exact, with tis_cap tis_weight_mean and tis_trunc_frac, with a packed
    plan policy_tokens_over (the policy tokens its list misses).
    """
    if not isinstance(settings, LossSettings):
        raise ValueError(f"loss_settings must be a LossSettings, got {type(settings).__name__}")
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
    if settings.kl_estimator == "exact" and settings.kl_coef != 0 and reference != "params":
        raise ValueError("kl_estimator='exact' needs the reference model in the step: build it "
                         "with_ref_params=True (precomputed ref_logprobs carry one token per state)")
    return PolicyLoss(settings, plan, reference)


@dataclasses.dataclass(frozen=True)
class ValueLoss:
    """`with_value_loss`'s loss: `loss((params, critic_params), batch) -> (loss, metrics)`."""
    policy: PolicyLoss
    settings: ValueSettings
    critic_cfg: Qwen3Config

    @property
    def presplit(self) -> tuple:
        return self.policy.presplit

    def check(self, state, batch, micro_batches: int):
        self.policy.check(state, batch, micro_batches, need=PPO_KEYS)
        if state.critic_params is None:
            raise ValueError("PPO step (value_settings given) needs state.critic_params")

    def context(self, state, batch) -> dict:
        ctx = self.policy.context(state, batch)
        ctx[DENOMINATORS]["vagg"] = agg_denominator(batch["policy_mask"], self.settings.agg_mode)
        return ctx

    def summary(self, batch, context) -> dict:
        return self.policy.summary(batch, context)

    def __call__(self, params_and_critic, batch):
        params, critic_params = params_and_critic
        vs, plan = self.settings, self.policy.plan
        total, m, (h, w_tok) = self.policy.terms(params, batch)
        mask, denoms = batch["policy_mask"], batch[DENOMINATORS]
        if vs.shared_backbone:
            v = critic_lib.head_values(critic_params["value_head"], h)
        else:
            v = critic_lib.values(plan.cast(critic_params), self.critic_cfg, batch["tokens"], remat=plan.remat,
                                  mesh=plan.mesh, scan_layers=plan.scan_layers)
        vl, vaux = losses.value_loss(v, batch["old_values"], batch["returns"], mask, clip_eps=vs.clip_eps,
                                     agg_mode=vs.agg_mode, norm_len=self.policy.settings.norm_len)
        w_v = agg_denominator(mask, vs.agg_mode) / jnp.maximum(denoms["vagg"], 1.0)
        # a separate critic is trained on L_V alone; a shared one adds vf_coef * L_V to the policy's
        total = total + (vs.vf_coef if vs.shared_backbone else 1.0) * w_v * vl
        m.update(vf_loss=w_v * vl, vf_clip_frac=w_tok * vaux["vf_clip_frac"], vf_mse=w_tok * vaux["vf_mse"],
                 value_mean=w_tok * losses.aggregate(jax.lax.stop_gradient(v), mask, "token-mean"))
        return total, m


def with_value_loss(policy: PolicyLoss, settings: ValueSettings, critic_cfg: Qwen3Config) -> ValueLoss:
    """`policy`'s loss plus the PPO critic's clipped value loss, over (params, critic_params).

    L_V = agg(0.5 max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2)) (`losses.value_loss`: the PPO value
    clipping of OpenAI baselines' ppo2; Andrychowicz et al. 2021, Sec. 3). A separate critic (`critic_cfg`, its own
    optimizer) minimises L_V alone: the total is L_pi + L_V, whose gradient in each parameter set is its own loss's.
    A shared-backbone head (settings.shared_backbone) on the policy's hidden states: L_pi + vf_coef * L_V.
    Adds metrics vf_loss, vf_clip_frac, vf_mse, value_mean; the batch adds returns and old_values."""
    return ValueLoss(policy, settings, critic_cfg)
