"""The SQL env's noisy expert (`SQLExpert`): the slips of a gold query the toy base imitates (`slip_query`,
`query_slips`), a reference that runs a query before it submits (`SQLExpert.checked_actions`), and the mistake
kinds of a submission (`submission_mistake`) for the mistake tables.

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import random
import re
from typing import Callable

from jaxagent.envs.host.sql_actions import parse_sql_action
from jaxagent.envs.host.sql_env import SQLEnv
from jaxagent.envs.host.tasks import SQLTask
from jaxagent.study.host.experts.base import NoisyExpert, check_slip_fix

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


class SQLExpert(NoisyExpert):
    """The noisy expert of `SQLEnv` (module docstring)."""

    env_class = SQLEnv
    mistake_kinds = MISTAKE_KINDS

    def slipped_actions(self, task: SQLTask, seed: int, fix: float = 1.0) -> list[str] | None:
        """A noisy expert's slip on the reference (`slip_query` of the gold query, submitted at once), or None
        where no slip applies to it. `fix` plays no part: the submission ends the episode."""
        check_slip_fix(fix)
        slipped = slip_query(task.gold, seed)
        return None if slipped is None else [f"<answer>{slipped[1]}</answer>"]

    def checked_actions(self, task: SQLTask, seed: int, slip: bool) -> list[str]:
        """A two-turn reference: run a query first (the gold one, or with `slip` its `slip_query` where one
        applies), then submit the gold query."""
        slipped = slip_query(task.gold, seed) if slip else None
        first = task.gold if slipped is None else slipped[1]
        return [f"```sql\n{first}\n```", f"<answer>{task.gold}</answer>"]

    def submission_mistake(self, task: SQLTask, actions: list, solved: bool) -> str:
        """`submission_mistake` of the task's gold query (module function)."""
        return submission_mistake(task.gold, actions, solved)
