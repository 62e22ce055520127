"""Device mesh, logical-axis rules and NamedShardings: the one table that maps names to mesh axes.

Every parameter, cache and activation names its logical axes once (`qwen3.logical_axes`,
`qwen3.cache_logical_axes`, the activation names below). `RULES` maps each logical axis to mesh axes
of the (data, fsdp, tensor) mesh; `shardings_for` turns a pytree of logical axes plus shapes into
NamedShardings, replicating any dimension the mesh axes do not divide (a 2-KV-head model on a 4-way
tensor axis keeps its KV heads whole rather than failing).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
MeshAxes = Union[None, str, tuple[str, ...]]

# Logical axis -> mesh axes. Batch-like axes split over data and fsdp; weights are FSDP-sharded on
# their model dimension and tensor-parallel on heads / MLP width / vocab.
RULES: dict[str, MeshAxes] = {
    "batch": ("data", "fsdp"),
    "embed": "fsdp",
    "vocab": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "cache_seq": None,
    "seq": None,
    # activations (`qwen3.RESIDUAL_AXES`, `qwen3.LOGITS_AXES`): rows over data x fsdp, logits' vocab over
    # tensor, the rest whole, so FSDP gathers weights per layer and never splits the residual stream
    "activation_batch": ("data", "fsdp"),
    "activation_seq": None,
    "activation_embed": None,
    "activation_vocab": "tensor",
}


# Sampling (rollouts): every chip decodes its own episodes a token at a time, so FSDP (weights gathered
# for every use) would move the whole model over the fsdp axis at every decode step. The rollout's copy of
# the weights is instead split over tensor only and replicated over data and fsdp (gathered once per
# rollout); activations, the KV cache and the episodes stay split over the batch axes as in `RULES`.
ROLLOUT_RULES: dict[str, MeshAxes] = {**RULES, "embed": None}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Optional[Sequence] = None) -> Mesh:
    """A (data, fsdp, tensor) mesh with Auto axes (GSPMD propagation inside jit)."""
    devices = list(jax.devices() if devices is None else devices)
    n = data * fsdp * tensor
    if n != len(devices):
        raise ValueError(f"mesh {data}x{fsdp}x{tensor} needs {n} devices, {len(devices)} available")
    arr = np.asarray(devices, dtype=object).reshape(data, fsdp, tensor)
    return Mesh(arr, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _axis_size(mesh: Mesh, axes: MeshAxes) -> int:
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in names]))


def spec_for(logical: Sequence[Optional[str]], shape: Sequence[int], mesh: Mesh,
             rules: Optional[Mapping[str, MeshAxes]] = None) -> P:
    """PartitionSpec for one array: rule lookup, divisibility fallback, no mesh axis used twice.

    A dimension whose rule names several mesh axes (batch -> data, fsdp) keeps the longest prefix of
    them whose size divides it; a dimension no prefix divides is replicated. Rule axes missing from
    the mesh count as size 1. Unknown logical names and unknown mesh axis names are errors.
    """
    rules = RULES if rules is None else rules
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    out = []
    for name, dim in zip(logical, shape):
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule (known: {sorted(rules)}); "
                             "map it to None to replicate it")
        axes = rules.get(name) if name is not None else None
        names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
        unknown = [a for a in names if a not in mesh.axis_names and a not in MESH_AXES]
        if unknown:
            raise ValueError(f"rule for logical axis {name!r} names mesh axes {unknown} that the mesh "
                             f"{tuple(mesh.axis_names)} does not have")
        names = tuple(a for a in names if a not in used and mesh.shape.get(a, 1) > 1)
        while names and dim % _axis_size(mesh, names):
            names = names[:-1]
        if names:
            used.update(names)
            out.append(names[0] if len(names) == 1 else names)
        else:
            out.append(None)
    return P(*out)


def is_axes(x: Any) -> bool:
    """Whether `x` is one array's logical axes: a tuple of axis names (str) or None (a leaf of an axes tree)."""
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def shardings_for(axes_tree: Any, shapes_tree: Any, mesh: Mesh,
                  rules: Optional[Mapping[str, MeshAxes]] = None) -> Any:
    """NamedShardings for a pytree, given its logical axes and its arrays (or ShapeDtypeStructs)."""
    return jax.tree.map(lambda ax, x: NamedSharding(mesh, spec_for(ax, np.shape(x), mesh, rules)),
                        axes_tree, shapes_tree, is_leaf=is_axes)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, ndim: int, rules: Optional[Mapping[str, MeshAxes]] = None,
                   batch_size: Optional[int] = None) -> NamedSharding:
    """Sharding of an activation whose leading axis is the batch (the rest replicated)."""
    shape = (batch_size if batch_size is not None else _axis_size(mesh, (RULES if rules is None else
                                                                        rules)["batch"]),) + (1,) * (ndim - 1)
    return NamedSharding(mesh, spec_for(("batch",) + (None,) * (ndim - 1), shape, mesh, rules))


def batch_axes(mesh: Mesh) -> Optional[tuple[str, ...]]:
    """The mesh axes (of size > 1) that batch rows are split over, per `RULES['batch']`; None if none."""
    rule = RULES["batch"]
    names = (rule,) if isinstance(rule, str) else tuple(rule or ())
    names = tuple(a for a in names if mesh.shape.get(a, 1) > 1)
    return names if names else None


def batch_divisor(mesh: Optional[Mesh]) -> int:
    """How many ways a batch is split on `mesh` (1 without one): a batch size must be a multiple."""
    return 1 if mesh is None else _axis_size(mesh, batch_axes(mesh))


def row_sharding(mesh: Mesh) -> NamedSharding:
    """Batch rows over `batch_axes(mesh)`, every other axis replicated (any rank)."""
    return NamedSharding(mesh, P(batch_axes(mesh)))


def constrain(x: jax.Array, logical: Sequence[Optional[str]], mesh=None,
              rules: Optional[Mapping[str, MeshAxes]] = None) -> jax.Array:
    """x pinned (`with_sharding_constraint`) to the rule-table sharding of its logical axes on `mesh`, or
    on the abstract mesh of an enclosing `jax.set_mesh`; x unchanged when there is neither."""
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh is None or mesh.empty:
            return x
        return jax.lax.with_sharding_constraint(x, spec_for(logical, x.shape, mesh, rules))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec_for(logical, x.shape, mesh, rules)))


def shard(tree: Any, shardings: Any) -> Any:
    """Places a pytree of host/device arrays onto the given shardings."""
    return jax.tree.map(jax.device_put, tree, shardings)


def map_row_chunks(fn, x: Any, chunks: int, mesh=None) -> Any:
    """fn applied to `chunks` row chunks of the pytree x (leading axis B) one after another (`lax.map`),
    the results put back in row order: bounds the activation memory of a row-independent fn to B / chunks
    rows. The split is strided (row i in chunk i mod chunks), so each device's shard of the rows feeds
    every chunk and no data moves; each chunk's rows are pinned to the batch axes (`constrain`).
    chunks = 1 calls fn on x directly."""
    leaves = jax.tree.leaves(x)
    b = leaves[0].shape[0]
    if chunks < 1 or b % chunks:
        raise ValueError(f"row chunks must be >= 1 and divide the {b} rows, got {chunks}")
    if chunks == 1:
        return fn(x)

    def split(a):  # [B, ...] -> [chunks, B / chunks, ...]
        a = jnp.swapaxes(a.reshape((b // chunks, chunks) + a.shape[1:]), 0, 1)
        return constrain(a, (None, "activation_batch") + (None,) * (a.ndim - 2), mesh)

    def merge(a):  # inverse of split
        a = constrain(a, (None, "activation_batch") + (None,) * (a.ndim - 2), mesh)
        a = jnp.swapaxes(a, 0, 1)
        return a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])

    return jax.tree.map(merge, jax.lax.map(fn, jax.tree.map(split, x)))
