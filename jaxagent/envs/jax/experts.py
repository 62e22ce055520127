"""Scripted policies over jittable envs (for one episode; the rollout vmaps them)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class NoisyExpert:
    """FrozenLake's epsilon-noisy optimal policy under the remaining budget.

    With probability 1 - epsilon it plays argmax_a Q*_h(s, a), h = the turns left (ties broken
    uniformly at random), else a uniformly random action, so its trajectories contain mistakes and
    recoveries from them: the toy stand-in for a pretrained base model's behaviour (see experiments).
    """

    epsilon: float = 0.2

    def __call__(self, env, key, state, remaining, env_params):
        k_noise, k_tie, k_rand = jax.random.split(key, 3)
        q_A = env.q_values(state, remaining, env_params)
        best_A = q_A >= jnp.max(q_A) - 1e-6
        greedy = jax.random.categorical(k_tie, jnp.where(best_A, 0.0, -jnp.inf))
        random = jax.random.randint(k_rand, (), 0, q_A.shape[0])
        return jnp.where(jax.random.uniform(k_noise) < self.epsilon, random, greedy).astype(jnp.int32)
