"""Held-out splits by structure for the built-in SQL and coding sets, and the overlap between two splits.

No dimension legend: host-side Python, no arrays.

Every built-in task records the template (SQL) or family (coding) it was made from, `task.template` (a
hand-written task is its own), and SQL tasks their database. `structural_splits` makes three disjoint splits:
  "test"            (STRUCTURAL) every task of a held-out template, and every task on a held-out database: the
                    template, or the schema and its values, never appears in training (Spider's cross-database
                    rule, and new question forms);
  "test_constants"  (CONSTANTS) every `every`-th task of the rest whose template (on its database) keeps another
                    task in train: train's templates on the same databases with other constants;
  "train"           the rest (a hand-written task is trained on unless held out); "all" is the whole list.
`overlap` counts the held-out tasks that share a template, a database, or both with a train task: no "test" task
shares both, every "test_constants" task does (tests/test_host_splits.py measures them). What is held out, and the
measured overlap: docs/host_study.md, "Data" (Splits by structure).
"""
from __future__ import annotations

import collections
from typing import Callable, Iterable, Optional

STRUCTURAL = "test"
CONSTANTS = "test_constants"
SPLITS = ("train", STRUCTURAL, CONSTANTS, "all")
SPLIT_NOTES = {
    STRUCTURAL: "held-out templates / families and databases: none of them appears in the train split",
    CONSTANTS: "the train split's templates / families on the same databases with other constants (every 4th such "
               "task)",
}


def notes(rule: str) -> dict:
    """{split: what it holds} for reports: SPLIT_NOTES, the structural split's with the set's own `rule` (the names
    held out)."""
    return {STRUCTURAL: f"{SPLIT_NOTES[STRUCTURAL]} ({rule})", CONSTANTS: SPLIT_NOTES[CONSTANTS]}


def structural_splits(tasks: list, held_templates: Iterable[str], held_dbs: Iterable[str] = (),
                      db_of: Optional[Callable] = None, every: int = 4) -> dict:
    """{"train", "test", "test_constants", "all": [task]} of `tasks` (module docstring), each split in list order.
    `db_of(task)` names a task's database (None: the tasks have none). ValueError for a held-out template or
    database that no task has (a typo would silently hold out nothing)."""
    held_t, held_d = set(held_templates), set(held_dbs)
    dbs = {db_of(t) for t in tasks} if db_of is not None else set()
    missing = sorted(held_t - {t.template for t in tasks}) + sorted(held_d - dbs)
    if missing:
        raise ValueError(f"held-out templates / databases that no task has: {missing}")
    out = {"train": [], STRUCTURAL: [], CONSTANTS: [], "all": list(tasks)}
    rest = []
    for t in tasks:
        held = t.template in held_t or (db_of is not None and db_of(t) in held_d)
        (out[STRUCTURAL] if held else rest).append(t)
    key = (lambda t: (t.template, db_of(t))) if db_of is not None else (lambda t: t.template)
    shared = collections.Counter(key(t) for t in rest)
    pool = [i for i, t in enumerate(rest) if shared[key(t)] > 1]
    picked = set(pool[every - 1::every])
    trained = {key(t) for i, t in enumerate(rest) if i not in picked}
    for i, t in enumerate(rest):  # a picked task whose template (on its database) would have no train task trains
        out[CONSTANTS if i in picked and key(t) in trained else "train"].append(t)
    return out


def overlap(train: list, heldout: list, db_of: Optional[Callable] = None) -> dict:
    """{"template": held-out tasks whose template a train task has, "db": held-out tasks whose database a train task
    uses, "both": held-out tasks whose template a train task has on the same database (without `db_of`: as
    "template"), "tasks": len(heldout)}."""
    db_of = db_of or (lambda t: "")
    templates, dbs = {t.template for t in train}, {db_of(t) for t in train}
    pairs = {(t.template, db_of(t)) for t in train}
    return {"template": sum(t.template in templates for t in heldout), "db": sum(db_of(t) in dbs for t in heldout),
            "both": sum((t.template, db_of(t)) in pairs for t in heldout), "tasks": len(heldout)}
