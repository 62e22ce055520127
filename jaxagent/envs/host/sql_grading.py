"""How a submitted SQL query is scored against the gold query: jaxagent's exact rule, Spider's official execution
accuracy, InterCode-SQL's reward. `SQLGrader(mode)` is one of them; `SQLEnv(grading=)` picks it and every report
names it (`SQLGrader.note`). Each mode in full (text decoding, how tau ranks rows): docs/host_study.md, "Data".

No dimension legend: host-side Python, no arrays.
Modes (GRADINGS):
  "exact"      jaxagent's rule: the same rows, values compared after rounding floats to 6 decimals, as a list when
               the gold query has ORDER BY, else as a multiset; column order matters. Score 1 or 0.
  "spider"     Spider's official execution accuracy (Yu et al. 2018; the test-suite evaluation of Zhong et al.
               2020, `exec_eval.eval_exec_match` / `result_eq`): after its post-processing (DISTINCT removed unless
               `keep_distinct`), 1 when a permutation of the predicted columns makes the results equal, as lists
               when the gold query's text contains "order by", else as multisets; else 0.
  "intercode"  InterCode-SQL's reward (Yang et al. 2023, `SqlEnv.get_reward`): IoU = |A n B| / |A u B| of the two
               multisets of rows as text (1 when both are empty), scaled by Kendall's tau-b of the shared rows'
               two orders when they share rows, rounded to 2 decimals: in [-1, 1], solved at 1.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re

from scipy import stats as _sps

GRADINGS = ("exact", "spider", "intercode")
NOTES = {
    "exact": "exact: the same rows (floats to 6 decimals), ordered when the gold query has ORDER BY, else as a "
             "multiset; column order matters",
    "spider": "spider: Spider's official execution accuracy (column permutations accepted, rows ordered when the "
              "gold has 'order by', exact values, text decoded with errors='ignore'{distinct})",
    "intercode": "intercode: InterCode-SQL's reward, row IoU x Kendall tau of the shared rows' order (rounded to "
                 "2 decimals); solved when it is 1",
}


def _norm_value(v):
    if isinstance(v, float):
        return round(v, 6) + 0.0
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def normalize_rows(rows: list[tuple]) -> list[tuple]:
    """Rows with floats rounded to 6 decimals (the exact rule's values)."""
    return [tuple(_norm_value(v) for v in r) for r in rows]


def results_match(got: list[tuple], gold: list[tuple], ordered: bool) -> bool:
    """The exact rule: same rows (floats to 6 decimals), as lists if ordered else multisets."""
    a, b = normalize_rows(got), normalize_rows(gold)
    if ordered:
        return a == b
    return collections.Counter(a) == collections.Counter(b)


# ------------------------------------------------------------------------------------------------ Spider
_LITERAL_OR_WORD = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|\bdistinct\b", re.IGNORECASE)


def remove_distinct(query: str) -> str:
    """`query` with every DISTINCT keyword removed (string literals and quoted names kept), as the official
    evaluation's `remove_distinct` does before executing both queries."""
    return _LITERAL_OR_WORD.sub(lambda m: "" if m.group(0).lower() == "distinct" else m.group(0), query)


def spider_postprocess(query: str) -> str:
    """The official evaluation's clean-up of a query before it runs: "> =", "< =", "! =" read as one operator."""
    return query.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")


def _column_permutations(gold: list[tuple], pred: list[tuple]):
    """Permutations perm (tuples of predicted column indices, one per gold column) under which every predicted
    row's values could lie in the gold's columns: a predicted column j may stand for gold column i only when every
    value of j occurs in gold column i (the official `get_constraint_permutation`, checked on every row instead
    of 20 sampled ones, so the search is deterministic; a pruned permutation can never match)."""
    n = len(gold[0])
    gold_cols = [{row[i] for row in gold} for i in range(n)]
    pred_cols = [{row[j] for row in pred} for j in range(n)]
    allowed = [[j for j in range(n) if pred_cols[j] <= gold_cols[i]] for i in range(n)]

    def search(i: int, used: tuple):
        if i == n:
            yield used
            return
        for j in allowed[i]:
            if j not in used:
                yield from search(i + 1, used + (j,))

    return search(0, ())


def spider_result_eq(gold: list[tuple], pred: list[tuple], order_matters: bool) -> bool:
    """Spider's denotation equality (module docstring): equal numbers of rows and columns, and a column
    permutation of `pred` equal to `gold` as a list (order_matters) or as a multiset."""
    if not gold and not pred:
        return True
    if len(gold) != len(pred) or len(gold[0]) != len(pred[0]):
        return False

    def unordered(row):
        return tuple(sorted(row, key=lambda v: str(v) + str(type(v))))

    if order_matters:
        if [unordered(r) for r in gold] != [unordered(r) for r in pred]:
            return False
    elif {unordered(r) for r in gold} != {unordered(r) for r in pred}:
        return False
    gold_counts = collections.Counter(gold)
    for perm in _column_permutations(gold, pred):
        moved = [tuple(row[j] for j in perm) for row in pred]
        if (moved == gold) if order_matters else (collections.Counter(moved) == gold_counts):
            return True
    return False


# ------------------------------------------------------------------------------------------------ InterCode
def kendall_tau_b(x: list, y: list) -> float:
    """Kendall's tau-b of two equally long sequences (ranked by value; NaN when undefined: fewer than 2 items or
    one side all tied), scipy's `kendalltau` as InterCode calls it."""
    if len(x) < 2:
        return math.nan
    return float(_sps.kendalltau(x, y, nan_policy="omit").statistic)


def _shared_in_order(rows: list[str], shared: collections.Counter) -> list[str]:
    """The rows of `rows` that are in the multiset `shared`, in their order, each kept as often as `shared` has it."""
    left, out = collections.Counter(shared), []
    for r in rows:
        if left[r] > 0:
            left[r] -= 1
            out.append(r)
    return out


def intercode_reward(pred: list[tuple], gold: list[tuple]) -> float:
    """InterCode-SQL's reward of a predicted result against the gold one (module docstring)."""
    a, b = [str(tuple(r)) for r in pred], [str(tuple(r)) for r in gold]
    ca, cb = collections.Counter(a), collections.Counter(b)
    shared = ca & cb
    union = ca | cb
    if not union:
        return 1.0
    reward = sum(shared.values()) / sum(union.values())
    if shared:
        tau = kendall_tau_b(_shared_in_order(a, shared), _shared_in_order(b, shared))
        if not math.isnan(tau):
            reward = round(tau * reward, 2)
    return float(reward)


# ------------------------------------------------------------------------------------------------ the grader
@dataclasses.dataclass(frozen=True)
class SQLGrader:
    """One scoring rule (module docstring). `prepare` is applied to the submitted and the gold query before they
    run; `score` compares their results."""

    mode: str = "exact"
    keep_distinct: bool = False   # spider: keep DISTINCT (the official evaluation's --keep_distinct)

    def __post_init__(self):
        if self.mode not in GRADINGS:
            raise ValueError(f"SQL grading must be one of {GRADINGS}, got {self.mode!r}")

    @property
    def note(self) -> str:
        distinct = "; DISTINCT kept" if self.keep_distinct else "; DISTINCT removed from both queries"
        return NOTES[self.mode].format(distinct=distinct)

    def prepare(self, query: str) -> str:
        if self.mode != "spider":
            return query
        query = spider_postprocess(query)
        return query if self.keep_distinct else remove_distinct(query)

    def ordered(self, prepared_gold: str, task_ordered: bool) -> bool:
        """Whether row order counts: spider: the gold text contains "order by"; exact: the task's flag."""
        return "order by" in prepared_gold.lower() if self.mode == "spider" else task_ordered

    def score(self, got: list[tuple], gold: list[tuple], ordered: bool) -> float:
        if self.mode == "spider":
            return float(spider_result_eq(gold, got, ordered))
        if self.mode == "intercode":
            return intercode_reward(got, gold)
        return float(results_match(got, gold, ordered))
