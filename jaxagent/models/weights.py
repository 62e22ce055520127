"""Hugging Face Qwen3 checkpoints <-> jaxagent params, without torch.

Reads and writes the safetensors format directly (8-byte little-endian header size, JSON header,
raw little-endian tensors; bf16 through ml_dtypes), memory-mapped, one tensor at a time. With a mesh,
each tensor goes straight into its target NamedSharding (`jax.make_array_from_callback`), so no host
ever holds more than one full tensor.

HF layout (torch [out, in]) -> ours: q/k/v_proj [H*E, D] -> [D, H, E]; o_proj [D, H*E] -> [H, E, D];
MLP [F, D] -> [D, F] (down: [D, F] -> [F, D]); lm_head [V, D] -> [D, V]; embed and norms as they are.
"""
from __future__ import annotations

import glob
import json
import os
import struct
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxagent.models import qwen3
from jaxagent.models.config import Qwen3Config

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


# ------------------------------------------------------------------ safetensors format
def read_safetensors_header(path: str) -> tuple[dict, int]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise ValueError(f"{path}: corrupt safetensors header (claims {n} bytes, file has {size})")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: corrupt safetensors header: {e}") from e
    header.pop("__metadata__", None)
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        expect = int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(_DTYPES[info["dtype"]]).itemsize
        if end - begin != expect or 8 + n + end > size:
            raise ValueError(f"{path}: tensor {name!r} is truncated or corrupt "
                             f"(offsets {begin}..{end}, shape {info['shape']}, file {size} bytes)")
    return header, 8 + n


class SafetensorsFile:
    """Memory-mapped read access to one .safetensors file."""

    def __init__(self, path: str):
        self.path = path
        self.header, self._base = read_safetensors_header(path)
        self._mm = np.memmap(path, dtype=np.uint8, mode="r")

    def keys(self) -> Iterable[str]:
        return self.header.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        begin, end = info["data_offsets"]
        buf = self._mm[self._base + begin:self._base + end]
        return buf.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict | None = None) -> None:
    """Writes tensors (C-contiguous, little-endian) atomically (temp file + rename)."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    arrays = {}
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype not in _NAMES:
            raise ValueError(f"cannot write tensor {name!r} of dtype {a.dtype}")
        header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        arrays[name] = a
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # align tensor data to 8 bytes
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(arrays):
            f.write(arrays[name].tobytes())
    os.replace(tmp, path)


# ------------------------------------------------------------------ key mapping
def _hf_layout(cfg: Qwen3Config) -> dict[str, tuple[tuple, Callable, Callable]]:
    """HF key -> (our params path, hf->ours transform, ours->hf transform)."""
    d, h, k, e = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    ident = (lambda x: x, lambda x: x)
    proj = lambda n: (lambda w: w.T.reshape(d, n, e), lambda w: w.reshape(d, n * e).T)
    out = {"model.embed_tokens.weight": (("embed",),) + ident,
           "model.norm.weight": (("norm", "weight"),) + ident}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (("lm_head",), lambda w: w.T, lambda w: w.T)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (("layers", i, "input_norm", "weight"),) + ident
        out[p + "post_attention_layernorm.weight"] = (("layers", i, "post_norm", "weight"),) + ident
        for name, n in (("q", h), ("k", k), ("v", k)):
            out[p + f"self_attn.{name}_proj.weight"] = (("layers", i, "attn", f"{name}_proj"),) + proj(n)
        out[p + "self_attn.o_proj.weight"] = (("layers", i, "attn", "o_proj"),
                                              lambda w: w.T.reshape(h, e, d), lambda w: w.reshape(h * e, d).T)
        out[p + "self_attn.q_norm.weight"] = (("layers", i, "attn", "q_norm", "weight"),) + ident
        out[p + "self_attn.k_norm.weight"] = (("layers", i, "attn", "k_norm", "weight"),) + ident
        if cfg.attention_bias:
            for name, n in (("q", h), ("k", k), ("v", k)):
                out[p + f"self_attn.{name}_proj.bias"] = (("layers", i, "attn", f"{name}_bias"),
                                                         lambda b, n=n: b.reshape(n, e), lambda b: b.reshape(-1))
            out[p + "self_attn.o_proj.bias"] = (("layers", i, "attn", "o_bias"),) + ident
        for name in ("gate", "up", "down"):
            out[p + f"mlp.{name}_proj.weight"] = (("layers", i, "mlp", f"{name}_proj"),
                                                  lambda w: w.T, lambda w: w.T)
    return out


def _get(tree, path):
    for p in path:
        tree = tree[p]
    return tree


def _set(tree, path, value):
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


def _checkpoint_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({os.path.join(path, v) for v in weight_map.values()})
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"safetensors index names missing shard files: {missing}")
        return files
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in checkpoint directory {path!r}")
    return files


def load(path, *, dtype=jnp.float32, mesh=None, rules=None):
    """(cfg, params) from a local HF Qwen3 directory; tensors cast to `dtype`, sharded if `mesh`.

    Errors name the offending key: a tensor the model needs but the files lack, a tensor the files
    have but the model does not know (a tied checkpoint's redundant `lm_head.weight` is accepted),
    and a tensor whose shape differs from the config's (both shapes given).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint directory {path!r} does not exist")
    cfg = Qwen3Config.from_dir(path)
    layout = _hf_layout(cfg)
    files = [SafetensorsFile(f) for f in _checkpoint_files(path)]
    where = {}
    for f in files:
        for key in f.keys():
            where[key] = f
    extra = sorted(set(where) - set(layout) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set()))
    if extra:
        raise ValueError(f"checkpoint {path!r} has tensors the Qwen3 config does not expect: {extra[:8]}"
                         f"{' ...' if len(extra) > 8 else ''}")
    missing = sorted(set(layout) - set(where))
    if missing:
        raise ValueError(f"checkpoint {path!r} lacks tensors: {missing[:8]}{' ...' if len(missing) > 8 else ''}")

    shapes = qwen3.param_shapes(cfg)
    shardings = None
    if mesh is not None:
        from jaxagent import sharding as shd
        shardings = shd.shardings_for(qwen3.logical_axes(cfg), shapes, mesh, rules)
    params: dict = {}
    for key, (ours, to_ours, _) in layout.items():
        expect = _get(shapes, ours).shape
        hf_shape = where[key].shape(key)
        try:
            host = to_ours(where[key].get(key))
        except ValueError:
            host = None
        if host is None or host.shape != expect:
            raise ValueError(f"tensor {key!r} has shape {hf_shape} in the checkpoint but the config "
                             f"implies {tuple(expect)} (as {ours}); checkpoint and config.json disagree")
        host = np.asarray(host).astype(jnp.dtype(dtype))
        if shardings is None:
            value = jnp.asarray(host)
        else:
            value = jax.make_array_from_callback(host.shape, _get(shardings, ours), lambda idx, h=host: h[idx])
        _set(params, ours, value)
    return cfg, params


def save(path, cfg: Qwen3Config, params, *, max_shard_bytes: int = 4 << 30) -> None:
    """Writes config.json and model(-0000i-of-0000n).safetensors (+ index when sharded) in HF layout."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    tensors = {}
    dtype_name = "float32"
    for key, (ours, _, to_hf) in _hf_layout(cfg).items():
        host = np.asarray(jax.device_get(_get(params, ours)))
        dtype_name = {np.dtype(ml_dtypes.bfloat16): "bfloat16", np.dtype(np.float16): "float16"}.get(
            host.dtype, "float32")
        tensors[key] = to_hf(host)
    shards, cur, size = [], {}, 0
    for key in sorted(tensors):
        if cur and size + tensors[key].nbytes > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[key] = tensors[key]
        size += tensors[key].nbytes
    shards.append(cur)
    for stale in glob.glob(os.path.join(path, "*.safetensors")) + glob.glob(os.path.join(path, "*.index.json")):
        os.remove(stale)
    if len(shards) == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), shards[0])
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(path, name), shard)
            weight_map.update({k: name for k in shard})
        total = sum(t.nbytes for t in tensors.values())
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(dtype_name), f, indent=1)
