"""Environments: `envs.jax` holds the pure-JAX world (the functional env interface, FrozenLake and its exact
solver, budgets, the text codec, scripted experts); `envs.host` the host (Python) world (the host env
interface, SQL, sandboxed code, BFCL v4 and their data; `envs.host.base.make('sql')`).

The jittable env interface is re-exported here; a new env: docs/custom_env.md."""
from jaxagent.envs.jax import Env, EnvStep, FrozenLake, FrozenLakeParams, Obs, TextCodec, parse_action, render

__all__ = ["Env", "EnvStep", "Obs", "TextCodec", "parse_action", "render", "FrozenLake", "FrozenLakeParams"]
