"""What a SQL reply says: parsing an action (`parse_sql_action`) and the result table an observation shows
(`format_table`), for `sql_env`.

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import re

from jaxagent.envs.host.base import parse_tool_calls, strip_think


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
