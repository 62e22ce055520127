"""What a SQL reply says and what is wrong with it: parsing an action (`parse_sql_action`), the result table an
observation shows (`format_table`), the toy base's noisy-expert slips of a gold query (`slip_query`,
`query_slips`) and the mistake kinds of a submission (`submission_mistake`), for `sql_env`.

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import random
import re
from typing import Callable

from jaxagent.envs.host.base import parse_tool_calls, strip_think

_LITERAL_RE = re.compile(r"'(?:[^']|'')*'")
_AGGREGATES = ("AVG", "SUM", "MIN", "MAX")
_AGGREGATE_RE = re.compile(r"\b(AVG|SUM|MIN|MAX)\(")
_COMPARISON_RE = re.compile(r" (<=|>=|<|>) ")
_FLIPPED = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
_CONDITION_RE = re.compile(r" WHERE .*?(?= GROUP BY | ORDER BY |$)")
SLIP_KINDS = ("drop_condition", "swap_aggregate", "flip_comparison")


def _slip_options(query: str) -> tuple[list, Callable[[str], str]]:
    """([(kind, [candidate text, ...]), ...] in SLIP_KINDS order for the slips that apply to `query`, with its
    string literals hidden; and the function that puts them back)."""
    literals: list[str] = []

    def hide(m):
        literals.append(m.group(0))
        return f"\x00{len(literals) - 1}\x00"

    text = _LITERAL_RE.sub(hide, query)
    options = []
    if "(SELECT" not in text.upper() and _CONDITION_RE.search(text):
        options.append(("drop_condition", [_CONDITION_RE.sub("", text, count=1)]))
    m = _AGGREGATE_RE.search(text)
    if m:
        options.append(("swap_aggregate", [text[:m.start(1)] + a + text[m.end(1):]
                                           for a in _AGGREGATES if a != m.group(1)]))
    if _COMPARISON_RE.search(text):
        options.append(("flip_comparison",
                        [_COMPARISON_RE.sub(lambda c: f" {_FLIPPED[c.group(1)]} ", text, count=1)]))
    return options, lambda t: re.sub(r"\x00(\d+)\x00", lambda g: literals[int(g.group(1))], t)


def slip_query(query: str, seed: int) -> tuple[str, str] | None:
    """(kind, query'): the query with one generic mistake a noisy expert makes, chosen by `seed` among those
    that apply (SLIP_KINDS): drop_condition cuts the top-level WHERE clause (not in a query with a subquery),
    swap_aggregate replaces the first AVG/SUM/MIN/MAX with another of them, flip_comparison turns the first
    comparison around (< and >, <= and >=). String literals are left as they are. None where no slip applies.
    The toy host base imitates these slips at a rate (`study.host.sft.HostSFTSettings.noise`), as the FrozenLake
    toy base imitates an epsilon-noisy expert: a mistake that is the same on every task, which RL can unlearn."""
    options, restore = _slip_options(query)
    if not options:
        return None
    rng = random.Random(seed)
    kind, candidates = options[rng.randrange(len(options))]
    return kind, restore(rng.choice(candidates) if len(candidates) > 1 else candidates[0])


def query_slips(query: str) -> set[str]:
    """Every query `slip_query` can make of `query` (each kind, each other aggregate), literals left as they are."""
    options, restore = _slip_options(query)
    return {restore(c) for _, candidates in options for c in candidates}


MISTAKE_KINDS = ("solved", "slip", "slip and value", "value", "other", "no submission")


def submission_mistake(gold: str, actions: list[str], solved: bool) -> str:
    """What is wrong with an episode's submission (MISTAKE_KINDS): 'solved'; 'no submission' (no <answer> or submit
    call in its replies); 'slip' (the gold query with one of `query_slips`' mistakes); 'slip and value' (that,
    with other string or number literals); 'value' (the gold query's form with other literals: a value copied
    wrong); 'other'. Whitespace is compared as written: the toy model writes the reference's spacing."""
    if solved:
        return "solved"
    submitted = None
    for text in actions:
        kind, query, _ = parse_sql_action(text)
        if kind == "submit":
            submitted = query
    if submitted is None:
        return "no submission"
    slips = query_slips(gold)
    if submitted in slips:
        return "slip"

    def form(q):
        return _LITERAL_RE.sub("?", re.sub(r"\b\d+(\.\d+)?\b", "?", q))

    if form(submitted) in {form(q) for q in slips}:
        return "slip and value"
    return "value" if form(submitted) == form(gold) else "other"


def format_table(cols: list[str], rows: list[tuple], truncated: bool, max_cell: int = 80) -> str:
    def cell(v):
        s = "NULL" if v is None else (repr(v) if isinstance(v, (bytes, float)) else str(v))
        s = " ".join(s.split()) if isinstance(v, str) else s
        return s if len(s) <= max_cell else s[: max_cell - 3] + "..."

    if not cols:
        return "(query returned no columns)"
    lines = [" | ".join(cell(c) for c in cols)]
    lines.append("-" * min(len(lines[0]), 120))
    lines.extend(" | ".join(cell(v) for v in r) for r in rows)
    n = f"{len(rows)}+ rows, only the first {len(rows)} shown" if truncated else f"{len(rows)} row" + (
        "" if len(rows) == 1 else "s")
    lines.append(f"({n})")
    return "\n".join(lines)


_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_SQL_BLOCK_RE = re.compile(r"```(?:sql|sqlite)?[ \t]*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


def _strip_fences(q: str) -> str:
    m = _SQL_BLOCK_RE.search(q)
    return (m.group(1) if m else q).strip()


def parse_sql_action(text: str) -> tuple[str | None, str | None, str | None]:
    """(kind, query, error) with kind 'execute' | 'submit'; error says why no query was found."""
    text = strip_think(text)
    calls = parse_tool_calls(text)
    if calls:
        if len(calls) != 1:
            return None, None, "make exactly one call per message"
        c = calls[0]
        if c.error:
            return None, None, c.error
        kind = {"execute_sql": "execute", "execute": "execute", "query": "execute",
                "submit": "submit", "submit_answer": "submit"}.get(c.name)
        if kind is None:
            return None, None, f"unknown function {c.name!r}; use execute_sql or submit"
        q = c.arguments.get("query", c.arguments.get("sql"))
        if not isinstance(q, str) or not q.strip():
            return None, None, f"{c.name} needs a non-empty string argument 'query'"
        return kind, q.strip(), None
    answers = _ANSWER_RE.findall(text)
    if answers:
        q = _strip_fences(answers[-1])
        if not q:
            return None, None, "empty <answer>"
        return "submit", q, None
    blocks = [b.strip() for b in _SQL_BLOCK_RE.findall(text)]
    blocks = [b for b in blocks if b]
    if blocks:
        return "execute", blocks[-1], None
    return None, None, ("no SQL found: put a query in a ```sql code block to run it, or inside "
                        "<answer></answer> to submit it")
