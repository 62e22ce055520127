"""Compiled kernels XLA does not provide, behind pure JAX functions (see `cpu`)."""
