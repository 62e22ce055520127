"""The pure-JAX world: jittable envs (interface in `base`), FrozenLake and its exact solver, interaction
budgets, the text codec and scripted experts. Everything here runs inside `jax.jit`."""
