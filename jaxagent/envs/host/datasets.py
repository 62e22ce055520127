"""What the dataset loaders share: reading JSON / JSONL records from a local directory, the report of what was
kept and left out, and the cache directory. The loaders: `spider` (Spider / InterCode-SQL for `SQLEnv`) and
`deepcoder` (DeepCoder-style problems for `CodeEnv`). Nothing here downloads anything: a path that does not
exist is an error naming it. A file that cannot be used as a whole (missing, not UTF-8, not JSON, nested deeper
than the JSON parser goes) is a `DataError`: one line naming the file (and line) and the problem. A record that
cannot be used is left out and counted in the `DatasetReport` by a reason that names its field.

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Iterator

from jaxagent.envs.host.base import stable_hash


class DataError(ValueError):
    """A data path or file that cannot be used at all; the message names it and says why (one line)."""


def cache_root() -> Path:
    """$JAXAGENT_CACHE, else ~/.cache/jaxagent."""
    root = os.environ.get("JAXAGENT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxagent")
    return Path(root)


def data_path(path, what: str) -> Path:
    """`path` as a Path that exists, else a ValueError naming it (and that nothing is downloaded)."""
    if path is None or (isinstance(path, str) and not path.strip()):
        raise DataError(f"{what}: no data path given")
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{what}: {str(p)!r} does not exist (data is read from local files only; nothing is "
                        "downloaded)")
    return p


def _loads(text: str, where: str):
    try:
        return json.loads(text)
    except ValueError as e:
        raise DataError(f"{where} not JSON ({e})") from None
    except RecursionError:
        raise DataError(f"{where} JSON nested too deeply to read") from None


def read_records(path: Path) -> Iterator[tuple[int, object]]:
    """(position, record) of a JSON file holding a list of records, or of a JSONL file (one record per
    non-empty line). DataError naming the file (and line) for a file that cannot be read, is not UTF-8 text, or
    holds text that is not JSON or is nested deeper than the parser goes."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); convert it to UTF-8") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror})") from None
    if path.suffix == ".jsonl" or (path.suffix != ".json" and not text.lstrip().startswith("[")):
        for i, line in enumerate(text.splitlines()):
            if line.strip():
                yield i, _loads(line, f"{path}: line {i + 1} is")
        return
    data = _loads(text, f"{path}:")
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    yield from enumerate(data)


def nesting_depth(value, limit: int) -> int:
    """The nesting depth of a JSON value (a scalar is 0, [] and [1] are 1), counted without recursion; stops
    counting at limit + 1."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, tuple)):
            children = v
        elif isinstance(v, dict):
            children = v.values()
        else:
            continue
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((x, d + 1) for x in children)
    return deepest


def record_files(root: Path) -> list[Path]:
    """The *.json and *.jsonl files of a directory (sorted by name), or the file itself."""
    if root.is_file():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix in (".json", ".jsonl"))


def held_out_by_hash(key, every: int = 4) -> bool:
    """The split rule for a single pool of records: held out when stable_hash(key) % every == every - 1
    (process- and order-independent)."""
    return stable_hash(key) % every == every - 1


@dataclasses.dataclass
class DatasetReport:
    """What a loader read: the layout it recognised (the format named or detected), how it split, how many tasks
    each split kept, the records left out, counted by reason (with the first few record ids of each reason), and
    warnings about the data's use (e.g. training on a benchmark's test questions)."""

    source: str
    layout: str
    split_rule: str
    records: int = 0
    warnings: list = dataclasses.field(default_factory=list)
    kept: dict = dataclasses.field(default_factory=dict)       # split -> tasks kept
    left_out: dict = dataclasses.field(default_factory=dict)   # reason -> records left out
    examples: dict = dataclasses.field(default_factory=dict)   # reason -> up to 5 record ids

    def leave_out(self, reason: str, record_id: str) -> None:
        self.left_out[reason] = self.left_out.get(reason, 0) + 1
        ids = self.examples.setdefault(reason, [])
        if len(ids) < 5:
            ids.append(record_id)

    def keep(self, split: str, n: int = 1) -> None:
        self.kept[split] = self.kept.get(split, 0) + n

    def summary(self) -> str:
        kept = ", ".join(f"{n} {s}" for s, n in sorted(self.kept.items())) or "none"
        out = ", ".join(f"{n} {r}" for r, n in sorted(self.left_out.items())) or "none"
        warn = "".join(f"; WARNING: {w}" for w in self.warnings)
        return (f"{self.layout} from {self.source}: {self.records} records; kept {kept}; left out {out}; split: "
                f"{self.split_rule}{warn}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
