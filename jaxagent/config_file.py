"""Frozen dataclass configs as TOML files: `dumps(config)` writes one (a study preset, `rl.TrainConfig`), `load(cls,
source, overrides)` reads it back with command-line style overrides ("rl.n_tasks=4", "lr=3e-4", "eval_ks=[1, 2]").

A nested dataclass field is a TOML table; tuples and lists are arrays (read back as the field's tuple type); a
field left out of the file keeps its default, so a file may hold only what differs; None is written as a left-out
key, which reads back as the default, except in an Optional field whose default is not None (e.g. a worker count
whose None means "one per core"): there it is the string "none" (`NONE`), which such a field (not a string field)
reads back as None, also from `--set workers=none`. A string field whose default is not None cannot be None in a
file: `dumps` refuses it. Keys the dataclass does not have, and values of the wrong type, are a ValueError naming the key path. An
explicit I/O module: it reads files (`tomllib`, the standard library's reader); writing TOML needs no package.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import tomllib
import types
import typing
from typing import Any, Iterable, Mapping, Union

NONE = "none"  # None in an Optional, non-string field whose default is not None (TOML has no null)


def to_dict(config) -> dict:
    """The dataclass `config` as a dict of plain TOML values; None fields left out (see the module doc)."""
    out, hints = {}, typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        if v is None:
            if f.default is not None and f.default is not dataclasses.MISSING:
                if _none_word(hints[f.name]):
                    out[f.name] = NONE
                    continue
                raise ValueError(f"{type(config).__name__}.{f.name} is None, which TOML cannot hold and whose "
                                 f"default is {f.default!r}")
            continue
        out[f.name] = to_dict(v) if dataclasses.is_dataclass(v) else _plain(v, f.name)
    return out


def _plain(v, name):
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (list, tuple)):
        return [_plain(x, name) for x in v]
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Mapping):
        return {str(k): _plain(x, name) for k, x in v.items()}
    raise ValueError(f"field {name}: a {type(v).__name__} has no TOML form")


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")) if not math.isfinite(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"


def dumps(config, *, header: str = "") -> str:
    """TOML text of the dataclass `config` (nested dataclasses as tables); `header`: comment lines on top."""
    lines = [f"# {line}" for line in header.splitlines()]

    def table(d: dict, path: str):
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict) or not _is_table(config, path, k)}
        if path:
            lines.extend(["", f"[{path}]"])
        lines.extend(f"{k} = {_value(v)}" for k, v in scalars.items())
        for k, v in d.items():
            if k not in scalars:
                table(v, f"{path}.{k}" if path else k)

    table(to_dict(config), "")
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_table(config, path: str, key: str) -> bool:
    obj = config
    for part in [p for p in path.split(".") if p]:
        obj = getattr(obj, part)
    return dataclasses.is_dataclass(getattr(obj, key))


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=value' -> (['a', 'b'], value); the value read as TOML (numbers, true/false, [arrays], "strings"),
    else taken as a bare string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {text!r} must look like key=value (e.g. rl.n_tasks=4)")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


def load(cls, source: Union[str, os.PathLike, Mapping], overrides: Iterable[str] = ()):
    """An instance of the dataclass `cls` from a TOML file path (str / PathLike), or an already parsed mapping,
    with `overrides` ('key.path=value') applied on top; a missing field keeps its default."""
    if isinstance(source, Mapping):
        data, where = dict(source), "config"
    else:
        where = os.fspath(source)
        try:
            with open(where, "rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise ValueError(f"config file {where}: cannot be read ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config file {where}: not TOML ({e})") from None
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {text!r}: {part} is not a table")
        node[path[-1]] = value
    return _build(cls, data, where, "")


def _build(cls, data, where: str, path: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where}: {path or 'the file'} must be a table of {cls.__name__}'s fields")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ValueError(f"{where}: {cls.__name__} has no field {path}{unknown[0]} (its fields: "
                         f"{', '.join(sorted(fields))})")
    kwargs = {k: _convert(hints[k], v, where, f"{path}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {path.rstrip('.') or cls.__name__}: {e}") from None


def _none_word(hint) -> bool:
    """Whether a field of type `hint` reads the string `NONE` as None: an Optional without a string option."""
    args = typing.get_args(hint)
    return (typing.get_origin(hint) in (Union, types.UnionType) and type(None) in args
            and not any(a is str or a is Any for a in args))


def _convert(hint, v, where: str, path: str):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if v == NONE and _none_word(hint):
            return None
        options = [a for a in args if a is not type(None)]
        return _convert(options[0], v, where, path) if len(options) == 1 else v
    if dataclasses.is_dataclass(hint):
        return _build(hint, v, where, f"{path}.")
    if origin is tuple or hint is tuple:
        if not isinstance(v, list):
            raise ValueError(f"{where}: {path} must be an array, got {v!r}")
        item = args[0] if args else Any
        return tuple(_convert(item, x, where, path) for x in v)
    if hint is Any and isinstance(v, list):  # an untyped tuple field's items: frozen dataclasses hold tuples
        return tuple(_convert(Any, x, where, path) for x in v)
    if hint is float and isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    if hint in (int, float, bool, str) and not (isinstance(v, hint) and (hint is bool or not isinstance(v, bool))):
        article = "an" if hint.__name__[0] in "aeiou" else "a"
        raise ValueError(f"{where}: {path} must be {article} {hint.__name__}, got {v!r}")
    return v
