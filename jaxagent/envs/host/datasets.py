"""What the dataset loaders share: reading JSON / JSONL records from a local directory, the report of what was
kept and left out, and the cache directory. The loaders: `spider` (Spider / InterCode-SQL for `SQLEnv`) and
`deepcoder` (DeepCoder-style problems for `CodeEnv`). Nothing here downloads anything: a path that does not
exist is an error naming it.

No dimension legend: host-side Python, no arrays.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Iterator

from jaxagent.envs.host.base import stable_hash


def cache_root() -> Path:
    """$JAXAGENT_CACHE, else ~/.cache/jaxagent."""
    root = os.environ.get("JAXAGENT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxagent")
    return Path(root)


def data_path(path, what: str) -> Path:
    """`path` as a Path that exists, else a ValueError naming it (and that nothing is downloaded)."""
    if path is None or (isinstance(path, str) and not path.strip()):
        raise ValueError(f"{what}: no data path given")
    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"{what}: {str(p)!r} does not exist (data is read from local files only; nothing is "
                         "downloaded)")
    return p


def read_records(path: Path) -> Iterator[tuple[int, object]]:
    """(position, record) of a JSON file holding a list of records, or of a JSONL file (one record per
    non-empty line). ValueError naming the file (and line) for text that is not JSON."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl" or (path.suffix != ".json" and not text.lstrip().startswith("[")):
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}: line {i + 1} is not JSON ({e})") from None
        return
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    yield from enumerate(data)


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
    """What a loader read: the layout it recognised, how it split, how many tasks each split kept, and the
    records left out, counted by reason (with the first few record ids of each reason)."""

    source: str
    layout: str
    split_rule: str
    records: int = 0
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
        return (f"{self.layout} from {self.source}: {self.records} records; kept {kept}; left out {out}; split: "
                f"{self.split_rule}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)
