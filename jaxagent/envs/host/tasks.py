"""The task records of the host domains, shared by each env and its dataset loader: `SQLTask` (`sql_env`, built
from Spider by `spider`) and `CodeTask` (`code_env`, built from DeepCoder-style problems by `deepcoder`).

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import dataclasses
import re

# a gold query with ORDER BY is judged as an ordered result (row order counts), one without as a multiset
ORDER_BY_RE = re.compile(r"\border\s+by\b", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class SQLTask:
    """One SQL question: answer `question` on database `db`; the reply's result rows must equal those of the
    `gold` query (in order when `ordered`, else as a multiset)."""
    id: str
    db: str
    question: str
    gold: str
    ordered: bool
    template: str = ""    # the template (built-in generated), the task's own id (hand-written), "" (loaded)


@dataclasses.dataclass(frozen=True)
class CodeTask:
    """One coding problem: a program for `prompt`, judged by running `tests` in the sandbox (`code_env`'s module
    docstring has the styles and how outputs compare)."""
    id: str
    entry_point: str                              # the function (or Solution method) tested; "" for stdin
    prompt: str
    reference: str                                # a solution that passes every test ("" if none is known)
    tests: tuple = dataclasses.field(hash=False)  # ((args list, expected JSON value) | ([stdin text], stdout), ...)
    style: str = "function"                       # "function" | "call" | "stdin" (module docstring)
    lenient_list: bool = False                    # "call": an expected [v] also accepts v (TACO's outputs)
    starter_code: str = ""
    template: str = ""                            # the family (built-in generated), the task's own id
                                                  # (hand-written), "" (loaded)
