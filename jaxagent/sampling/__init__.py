"""Sampling: samplers over logits and the KV-cache prefill/decode loop."""
from jaxagent.sampling.samplers import GREEDY, Sampler, policy_logprobs, sample
from jaxagent.sampling.generate import Generation, append, bucket, decode, generate, right_align, rollout_params

__all__ = ["GREEDY", "Sampler", "policy_logprobs", "sample", "Generation", "append", "bucket", "decode",
           "generate", "right_align", "rollout_params"]
