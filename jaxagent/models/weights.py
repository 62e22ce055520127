"""Hugging Face Qwen3 checkpoints <-> jaxagent params, without torch.

Reads and writes the safetensors format directly (8-byte little-endian header size, JSON header,
raw little-endian tensors; bf16 through ml_dtypes), memory-mapped, one tensor at a time. With a mesh,
each tensor goes straight into its target NamedSharding (`jax.make_array_from_callback`), so no host
ever holds more than one full tensor.

HF layout (torch [out, in]) -> ours: q/k/v_proj [H*E, D] -> [D, H, E]; o_proj [D, H*E] -> [H, E, D];
MLP [F, D] -> [D, F] (down: [D, F] -> [F, D]); lm_head [V, D] -> [D, V]; embed and norms as they are.

Integrity: `save` writes a checksum manifest (MANIFEST_NAME: sha256 and size of every file it wrote)
last, atomically; `load` verifies it when present (a directory without one, e.g. from Hugging Face,
loads unverified) and, by default, rejects non-finite weights. `write_manifest` / `verify_manifest`
are shared with the orbax train-state checkpoints (`jaxagent.rl.checkpoint`).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import struct
import tempfile
from typing import Any, Callable, Iterable, Optional

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
MANIFEST_NAME = "jaxagent_checksums.json"
MANIFEST_FORMAT = 1


# ------------------------------------------------------------------ checksum manifests
def file_sha256(path: str, chunk_bytes: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk_bytes), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: str, files: Optional[Iterable[str]] = None) -> dict:
    """Writes <directory>/MANIFEST_NAME: {"files": {relative path: {"sha256", "bytes"}}} for `files`
    (relative paths; default every regular file under `directory`), atomically (temp + rename)."""
    directory = os.fspath(directory)
    if files is None:
        files = sorted(os.path.relpath(os.path.join(root, f), directory)
                       for root, _, names in os.walk(directory) for f in names
                       if f != MANIFEST_NAME and not f.startswith(MANIFEST_NAME + "."))
    entries = {}
    for rel in files:
        full = os.path.join(directory, rel)
        entries[rel.replace(os.sep, "/")] = {"sha256": file_sha256(full), "bytes": os.path.getsize(full)}
    manifest = {"format": MANIFEST_FORMAT, "algorithm": "sha256", "files": entries}
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=MANIFEST_NAME + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(directory, MANIFEST_NAME))
    return manifest


def read_manifest(directory: str) -> Optional[dict]:
    """The manifest of `directory`, or None when it has none; ValueError when it is unreadable."""
    path = os.path.join(os.fspath(directory), MANIFEST_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"checksum manifest {path} is corrupt (not JSON: {e}); the files it covers "
                         "cannot be verified") from e
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) and isinstance(v.get("sha256"), str)
                                              and isinstance(v.get("bytes"), int) for v in files.values()):
        raise ValueError(f"checksum manifest {path} is malformed (expected "
                         "{'files': {path: {'sha256': str, 'bytes': int}}})")
    return manifest


def verify_manifest(directory: str, *, required: Iterable[str] = (), what: str = "directory") -> bool:
    """Checks every file listed in `directory`'s manifest (size, then sha256); False if there is no
    manifest, True if all match. ValueError naming the file when one is missing, truncated or altered,
    or when a file in `required` (relative paths the caller will read) is not covered."""
    directory = os.fspath(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        return False
    files = manifest["files"]
    for rel in required:
        if rel.replace(os.sep, "/") not in files:
            raise ValueError(f"{what} {directory}: file {rel} is not covered by its checksum manifest "
                             f"({MANIFEST_NAME}); it was added or renamed after the save")
    for rel, info in sorted(files.items()):
        full = os.path.join(directory, *rel.split("/"))
        if not os.path.isfile(full):
            raise ValueError(f"{what} {directory} is incomplete: file {rel} is missing (listed in "
                             f"{MANIFEST_NAME})")
        size = os.path.getsize(full)
        if size != info["bytes"]:
            raise ValueError(f"{what} {directory} is corrupt: file {rel} has {size} bytes but was saved "
                             f"with {info['bytes']} (truncated or overwritten)")
        digest = file_sha256(full)
        if digest != info["sha256"]:
            raise ValueError(f"{what} {directory} is corrupt: file {rel} does not match its checksum "
                             f"(sha256 {digest[:16]}... vs {info['sha256'][:16]}... at save time)")
    return True


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
    if not isinstance(header, dict):
        raise ValueError(f"{path}: corrupt safetensors header (a JSON {type(header).__name__}, not an object)")
    header.pop("__metadata__", None)
    for name, info in header.items():
        _check_header_entry(path, name, info)
        begin, end = info["data_offsets"]
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        expect = int(np.prod(info["shape"], dtype=np.int64)) * np.dtype(_DTYPES[info["dtype"]]).itemsize
        if end - begin != expect or 8 + n + end > size:
            raise ValueError(f"{path}: tensor {name!r} is truncated or corrupt "
                             f"(offsets {begin}..{end}, shape {info['shape']}, file {size} bytes)")
    return header, 8 + n


def _check_header_entry(path: str, name: str, info) -> None:
    """A header entry is {"dtype": str, "shape": [int >= 0, ...], "data_offsets": [begin, end]}."""
    if not isinstance(info, dict):
        raise ValueError(f"{path}: corrupt safetensors header: the entry of tensor {name!r} is not an object")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
    if missing:
        raise ValueError(f"{path}: corrupt safetensors header: tensor {name!r} lacks {missing} "
                         "(each tensor needs dtype, shape and data_offsets)")
    offs, shape = info["data_offsets"], info["shape"]

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not (isinstance(offs, list) and len(offs) == 2 and all(map(is_int, offs)) and offs[0] <= offs[1]):
        raise ValueError(f"{path}: corrupt safetensors header: tensor {name!r} has data_offsets {offs!r} "
                         "(expected [begin, end] with 0 <= begin <= end)")
    if not (isinstance(shape, list) and all(map(is_int, shape))):
        raise ValueError(f"{path}: corrupt safetensors header: tensor {name!r} has shape {shape!r} "
                         "(expected a list of non-negative ints)")
    if not isinstance(info["dtype"], str):
        raise ValueError(f"{path}: corrupt safetensors header: tensor {name!r} has dtype {info['dtype']!r}")


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


def load(path, *, dtype=jnp.float32, mesh=None, rules=None, verify: bool = True, check_finite: bool = True):
    """(cfg, params) from a local HF Qwen3 directory; tensors cast to `dtype`, sharded if `mesh`.

    Errors name the offending key: a tensor the model needs but the files lack, a tensor the files
    have but the model does not know (a tied checkpoint's redundant `lm_head.weight` is accepted),
    and a tensor whose shape differs from the config's (both shapes given).
    verify: check the files against the directory's checksum manifest when it has one (`save` writes
    it); ValueError naming a missing, truncated or altered file. check_finite: ValueError naming the
    first tensor with a NaN or Inf (after the cast to `dtype`).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint directory {path!r} does not exist")
    shard_paths = _checkpoint_files(path) if os.path.isfile(os.path.join(path, "config.json")) else []
    if verify:
        index = "model.safetensors.index.json"
        needed = ["config.json"] + [os.path.relpath(f, path) for f in shard_paths]
        needed += [index] if os.path.isfile(os.path.join(path, index)) else []
        verify_manifest(path, required=needed, what="model directory")
    cfg = Qwen3Config.from_dir(path)
    layout = _hf_layout(cfg)
    files = [SafetensorsFile(f) for f in shard_paths or _checkpoint_files(path)]
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
        with np.errstate(over="ignore"):  # an overflow to Inf is reported below, by tensor name
            host = np.asarray(host).astype(jnp.dtype(dtype))
        if check_finite and not np.isfinite(host).all():
            n_bad = int(host.size - np.count_nonzero(np.isfinite(host)))
            raise ValueError(f"tensor {key!r} in {where[key].path} has {n_bad} non-finite values (NaN/Inf) "
                             f"of {host.size} after the cast to {jnp.dtype(dtype)}; load(..., "
                             "check_finite=False) loads it anyway")
        if shardings is None:
            value = jnp.asarray(host)
        else:
            value = jax.make_array_from_callback(host.shape, _get(shardings, ours), lambda idx, h=host: h[idx])
        _set(params, ours, value)
    return cfg, params


def save(path, cfg: Qwen3Config, params, *, max_shard_bytes: int = 4 << 30) -> None:
    """Writes config.json and model(-0000i-of-0000n).safetensors (+ index when sharded) in HF layout,
    then the checksum manifest of those files (last, so a directory with a manifest is complete)."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    if os.path.exists(os.path.join(path, MANIFEST_NAME)):  # an interrupted save must not look verified
        os.remove(os.path.join(path, MANIFEST_NAME))
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
    written = ["config.json"]
    if len(shards) == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), shards[0])
        written.append("model.safetensors")
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(path, name), shard)
            weight_map.update({k: name for k in shard})
            written.append(name)
        total = sum(t.nbytes for t in tensors.values())
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
        written.append("model.safetensors.index.json")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(dtype_name), f, indent=1)
    write_manifest(path, written)
