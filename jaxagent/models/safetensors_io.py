"""The safetensors file format, read and written without torch: an 8-byte little-endian header size, a JSON
header {tensor name: {dtype, shape, data_offsets}} (plus an optional `__metadata__`), then the raw
little-endian tensors; bf16 through ml_dtypes. Reads are memory-mapped, one tensor at a time.

A file is what its header claims, checked before any tensor is read (`read_safetensors_header`): each entry
is well formed; each tensor's byte range matches its dtype and shape; the tensors tile the file's data
exactly (sorted by offset, each begins where the previous ends, the first at 0, the last at the end of the
file: no overlap, no gap, as the format requires). Each violation is a `CheckpointError` naming the file and
the tensor.
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Any, Iterable

import ml_dtypes
import numpy as np

from jaxagent.models.config import CheckpointError

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_safetensors_header(path: str) -> tuple[dict, int]:
    """(header without `__metadata__`, offset of the data) of a safetensors file; CheckpointError naming the file
    and the tensor when the header is malformed or its tensors do not tile the data exactly (module docstring)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise CheckpointError(f"{path}: corrupt safetensors header (claims {n} bytes, file has {size})")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: corrupt safetensors header: {e}") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (a JSON {type(header).__name__}, not an object)")
    header.pop("__metadata__", None)
    for name, info in header.items():
        _check_header_entry(path, name, info)
        begin, end = info["data_offsets"]
        if info["dtype"] not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        expect = math.prod(info["shape"]) * np.dtype(_DTYPES[info["dtype"]]).itemsize  # exact: no int64 overflow
        if end - begin != expect or 8 + n + end > size:
            raise CheckpointError(f"{path}: tensor {name!r} is truncated or corrupt "
                                  f"(offsets {begin}..{end}, shape {info['shape']}, file {size} bytes)")
    _check_tiling(path, header, size - 8 - n)
    return header, 8 + n


def _check_tiling(path: str, header: dict, data_bytes: int) -> None:
    """The tensors' byte ranges, sorted, must cover [0, data_bytes) exactly: an overlap would read one tensor's
    bytes as another's, a gap or a tail holds bytes no tensor owns."""
    pos, prev = 0, None
    for name, info in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, end = info["data_offsets"]
        if begin < pos:
            raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} (data_offsets {begin}..{end}) "
                                  f"overlaps tensor {prev!r}, which ends at {pos}")
        if begin > pos:
            raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} begins at {begin} but the "
                                  f"previous tensor ({prev!r}) ends at {pos}: {begin - pos} bytes belong to no tensor")
        pos, prev = end, name
    if pos != data_bytes:
        raise CheckpointError(f"{path}: corrupt safetensors header: the tensors end at byte {pos} of the data but "
                              f"the file holds {data_bytes} bytes of data ({data_bytes - pos} belong to no tensor)")


def _check_header_entry(path: str, name: str, info) -> None:
    """A header entry is {"dtype": str, "shape": [int >= 0, ...], "data_offsets": [begin, end]}."""
    if not isinstance(info, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: the entry of tensor {name!r} is not an object")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in info]
    if missing:
        raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} lacks {missing} "
                              "(each tensor needs dtype, shape and data_offsets)")
    offs, shape = info["data_offsets"], info["shape"]

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not (isinstance(offs, list) and len(offs) == 2 and all(map(is_int, offs)) and offs[0] <= offs[1]):
        raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} has data_offsets {offs!r} "
                              "(expected [begin, end] with 0 <= begin <= end)")
    if not (isinstance(shape, list) and all(map(is_int, shape))):
        raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} has shape {shape!r} "
                              "(expected a list of non-negative ints)")
    if not isinstance(info["dtype"], str):
        raise CheckpointError(f"{path}: corrupt safetensors header: tensor {name!r} has dtype {info['dtype']!r}")


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
