"""Compiled CPU kernels XLA does not provide, behind pure JAX functions (see `cpu`): the CPU
implementations of the model's ops seam (`jaxagent.models.ops`), which selects them only in programs
lowered for CPU."""
