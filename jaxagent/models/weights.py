"""Hugging Face Qwen3 checkpoints <-> jaxagent params, without torch (`load`, `save`, `check_checkpoint`).

Reads and writes the safetensors format directly (`safetensors_io`), memory-mapped, one tensor at a
time. With a mesh, each tensor goes straight into its target NamedSharding (`jax.make_array_from_callback`),
so no host ever holds more than one full tensor.

HF layout (torch [out, in]) -> ours: q/k/v_proj [H*E, D] -> [D, H, E]; o_proj [D, H*E] -> [H, E, D];
MLP [F, D] -> [D, F] (down: [D, F] -> [F, D]); lm_head [V, D] -> [D, V]; embed and norms as they are.

Integrity: `save` writes a checksum manifest (MANIFEST_NAME: sha256 and size of every file it wrote) last,
atomically; `load` verifies it when present and, by default, rejects non-finite weights; `write_manifest` /
`verify_manifest` are shared with the orbax train-state checkpoints (`jaxagent.rl.checkpoint`). `load` first runs
`check_checkpoint`, which checks from the headers alone, before any tensor is read, that the directory is the Qwen3
its config.json describes; each violation is a `CheckpointError` naming the file and the tensor or field (what is
checked: docs/api.md, "A mesh and a checkpoint").
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
from typing import Callable, Iterable, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxagent import checks
from jaxagent import sharding as shd
from jaxagent.models import qwen3
from jaxagent.models.config import CheckpointError, Qwen3Config
from jaxagent.models.safetensors_io import SafetensorsFile, write_safetensors

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # the safetensors dtypes a Qwen3 weight may have
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
    write_json_atomic(os.path.join(directory, MANIFEST_NAME), manifest)
    return manifest


def write_json_atomic(path: str, obj) -> None:
    """Writes `obj` as JSON to `path` through a synced temporary file renamed over it: a reader sees the old
    file or the new one, never a part."""
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_manifest(directory: str) -> Optional[dict]:
    """The manifest of `directory`, or None when it has none; CheckpointError when it is unreadable."""
    path = os.path.join(os.fspath(directory), MANIFEST_NAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checksum manifest {path} is corrupt (not JSON: {e}); the files it covers "
                              "cannot be verified") from e
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) and isinstance(v.get("sha256"), str)
                                              and isinstance(v.get("bytes"), int) for v in files.values()):
        raise CheckpointError(f"checksum manifest {path} is malformed (expected "
                              "{'files': {path: {'sha256': str, 'bytes': int}}})")
    return manifest


def verify_manifest(directory: str, *, required: Iterable[str] = (), what: str = "directory") -> bool:
    """Checks every file listed in `directory`'s manifest (size, then sha256); False if there is no
    manifest, True if all match. CheckpointError naming the file when one is missing, truncated or altered,
    or when a file in `required` (relative paths the caller will read) is not covered."""
    directory = os.fspath(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        return False
    files = manifest["files"]
    for rel in required:
        if rel.replace(os.sep, "/") not in files:
            raise CheckpointError(f"{what} {directory}: file {rel} is not covered by its checksum manifest "
                                  f"({MANIFEST_NAME}); it was added or renamed after the save")
    for rel, info in sorted(files.items()):
        full = os.path.join(directory, *rel.split("/"))
        if not os.path.isfile(full):
            raise CheckpointError(f"{what} {directory} is incomplete: file {rel} is missing (listed in "
                                  f"{MANIFEST_NAME})")
        size = os.path.getsize(full)
        if size != info["bytes"]:
            raise CheckpointError(f"{what} {directory} is corrupt: file {rel} has {size} bytes but was saved "
                                  f"with {info['bytes']} (truncated or overwritten)")
        digest = file_sha256(full)
        if digest != info["sha256"]:
            raise CheckpointError(f"{what} {directory} is corrupt: file {rel} does not match its checksum "
                                  f"(sha256 {digest[:16]}... vs {info['sha256'][:16]}... at save time)")
    return True


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
        try:
            with open(index) as f:
                weight_map = json.load(f).get("weight_map", {})
        except (ValueError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index (a JSON object with a weight_map): {e}") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v and os.path.basename(v) == v
                                                       for v in weight_map.values()):
            raise CheckpointError(f"{index}: field weight_map must map tensor names to file names in {path}")
        files = sorted({os.path.join(path, v) for v in weight_map.values()})
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"safetensors index names missing shard files: {missing}")
        return files
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in checkpoint directory {path!r}")
    return files


def _open_checkpoint(path: str, verify: bool):
    """(cfg, layout, tensor name -> its SafetensorsFile) of a checkpoint directory whose config, headers, tensor
    names, dtypes and shapes were checked (module doc); no tensor data is read."""
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
        raise CheckpointError(f"checkpoint {path!r} has tensors the Qwen3 config does not expect: {extra[:8]}"
                              f"{' ...' if len(extra) > 8 else ''}")
    missing = sorted(set(layout) - set(where))
    if missing:
        raise CheckpointError(f"checkpoint {path!r} lacks tensors: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    shapes = qwen3.param_shapes(cfg)
    for key, (ours, _, to_hf) in layout.items():
        dtype = where[key].header[key]["dtype"]
        if dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"{where[key].path}: tensor {key!r} has dtype {dtype}; a Qwen3 weight is floating "
                                  f"point ({', '.join(FLOAT_DTYPES)}), and an integer or boolean tensor is not cast")
        expect = _get(shapes, ours).shape
        want = jax.eval_shape(to_hf, jax.ShapeDtypeStruct(expect, jnp.float32)).shape
        if where[key].shape(key) != want:
            raise CheckpointError(f"{where[key].path}: tensor {key!r} has shape {where[key].shape(key)} in the "
                                  f"checkpoint but the config implies {tuple(expect)} (as {ours}; {tuple(want)} in the "
                                  "file's layout): checkpoint and config.json disagree")
    return cfg, layout, where


def check_checkpoint(path) -> Qwen3Config:
    """The config of the HF Qwen3 directory `path` once its config.json and every safetensors header are checked
    (module doc) without reading a tensor: CheckpointError naming the file and the field or tensor,
    FileNotFoundError for a missing directory, config.json or weights file."""
    return _open_checkpoint(os.fspath(path), verify=False)[0]


def load(path, *, dtype=jnp.float32, mesh=None, rules=None, verify: bool = True, check_finite: bool = True):
    """(cfg, params) from a local HF Qwen3 directory; tensors cast to `dtype`, sharded if `mesh`.

    The checks of `check_checkpoint` come first, so errors name the offending file and key: a tensor the
    model needs but the files lack, a tensor the files have but the model does not know (a tied
    checkpoint's redundant `lm_head.weight` is accepted), a tensor whose shape differs from the config's
    (both shapes given), a non-float tensor, a header whose tensors overlap or leave gaps.
    verify: check the files against the directory's checksum manifest when it has one (`save` writes
    it); CheckpointError naming a missing, truncated or altered file. check_finite: CheckpointError naming
    the first tensor with a NaN or Inf (after the cast to `dtype`).
    """
    dtype = checks.float_dtype("weights.load: dtype", dtype)
    path = os.fspath(path)
    cfg, layout, where = _open_checkpoint(path, verify)
    shapes = qwen3.param_shapes(cfg)
    shardings = None
    if mesh is not None:
        shardings = shd.shardings_for(qwen3.logical_axes(cfg), shapes, mesh, rules)
    params: dict = {}
    for key, (ours, to_ours, _) in layout.items():
        host = to_ours(where[key].get(key))
        with np.errstate(over="ignore"):  # an overflow to Inf is reported below, by tensor name
            host = np.asarray(host).astype(jnp.dtype(dtype))
        if check_finite and not np.isfinite(host).all():
            n_bad = int(host.size - np.count_nonzero(np.isfinite(host)))
            raise CheckpointError(f"tensor {key!r} in {where[key].path} has {n_bad} non-finite values (NaN/Inf) "
                                  f"of {host.size} after the cast to {jnp.dtype(dtype)}; load(..., "
                                  "check_finite=False) loads it anyway")
        if shardings is None:
            value = jnp.asarray(host)
        else:
            value = jax.make_array_from_callback(host.shape, _get(shardings, ours), lambda idx, h=host: h[idx])
        _set(params, ours, value)
    return cfg, params


LAYER_PREFIX = "model.layers."


def cut_layers(src, dst, n_layers: int) -> Qwen3Config:
    """Writes to the new directory `dst` a copy of the HF Qwen3 checkpoint `src` (checked first, `check_checkpoint`)
    with only its first `n_layers` decoder layers: every other tensor (embedding, final norm, lm_head) as it is, in
    its file dtype, one tensor read at a time; config.json with num_hidden_layers = n_layers (and its per-layer
    `layer_types` cut, `max_window_layers` capped); every other file (tokenizer, chat template, generation config)
    copied; a fresh checksum manifest. Returns the cut config. What it is for: a rehearsal of a large checkpoint on
    a host whose memory holds the real width and vocabulary but not every layer (docs/first_run.md). ValueError for
    n_layers outside [1, the checkpoint's layers]; FileExistsError when `dst` exists."""
    src, dst = os.fspath(src), os.fspath(dst)
    cfg, _, where = _open_checkpoint(src, verify=True)
    if not 1 <= n_layers <= cfg.num_hidden_layers:
        raise ValueError(f"n_layers must lie in [1, {cfg.num_hidden_layers}] (the layers of {src!r}), got {n_layers}")
    keep = [k for k in where if not k.startswith(LAYER_PREFIX) or int(k[len(LAYER_PREFIX):].split(".")[0]) < n_layers]
    os.makedirs(dst)
    weights = {os.path.basename(f.path) for f in where.values()} | {"model.safetensors.index.json"}
    for name in sorted(os.listdir(src)):
        if name in weights or name == "config.json" or name.startswith(MANIFEST_NAME):
            continue
        if os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
    with open(os.path.join(src, "config.json")) as f:
        hf = json.load(f)
    hf["num_hidden_layers"] = n_layers
    if isinstance(hf.get("layer_types"), list):
        hf["layer_types"] = hf["layer_types"][:n_layers]
    if isinstance(hf.get("max_window_layers"), int):
        hf["max_window_layers"] = min(hf["max_window_layers"], n_layers)
    write_json_atomic(os.path.join(dst, "config.json"), hf)
    write_safetensors(os.path.join(dst, "model.safetensors"), {k: where[k].get(k) for k in sorted(keep)})
    write_manifest(dst)
    return check_checkpoint(dst)


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


def tiny_checkpoint(path, words: Sequence[str], *, seed: int = 0, hidden_size: int = 32,
                    num_hidden_layers: int = 1) -> Qwen3Config:
    """A random tiny Qwen3 written to `path` as a checkpoint directory (config.json, model.safetensors) with a
    word-level tokenizer over `words` (`tokenizer.build_word_tokenizer`, which adds Qwen3's chat tokens):
    `load(path)` and `Tokenizer.from_dir(path)` read it back. Offline; for tests, docs and plumbing runs (it knows
    nothing). 4 query and 2 KV heads of hidden_size / 4; returns its config."""
    from jaxagent.models.tokenizer import build_word_tokenizer
    if hidden_size < 4 or hidden_size % 4:
        raise ValueError(f"tiny_checkpoint: hidden_size must be a positive multiple of 4, got {hidden_size}")
    tok = build_word_tokenizer(words, path)
    cfg = Qwen3Config(vocab_size=tok.vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=hidden_size // 4)
    save(path, cfg, qwen3.init(cfg, jax.random.key(seed)))
    return cfg
