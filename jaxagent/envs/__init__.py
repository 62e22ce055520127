"""Environments: `envs.jax` holds the pure-JAX world (the functional env interface, FrozenLake and its exact
solver, budgets, the text codec, scripted experts); `envs.host` the host (Python) world (the host env
interface, SQL, sandboxed code, BFCL v4 and their data)."""
