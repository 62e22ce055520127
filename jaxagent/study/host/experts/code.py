"""The coding env's noisy expert (`CodeExpert`): the slips of a reference program the toy base imitates
(`slip_program`, `program_slips`), the episode of a slip and then, after the test feedback, the fix or giving up
(`CodeExpert.slipped_actions`), and the mistake kinds of a submission (`program_mistake`) for the mistake tables.

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import io
import random
import tokenize

from jaxagent.envs.host.code_env import CodeEnv, extract_code
from jaxagent.envs.host.tasks import CodeTask
from jaxagent.study.host.experts.base import NoisyExpert, check_slip_fix

CODE_SLIP_KINDS = ("flip_comparison", "off_by_one", "swap_builtin")
_FLIPPED = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
_SWAPPED = {"min": "max", "max": "min", "any": "all", "all": "any"}


def _first_sites(source: str) -> dict:
    """{kind: (start, end, replacement)} at the first place each of CODE_SLIP_KINDS applies to `source`, found
    on Python's own tokens (so strings and comments are never changed): flip_comparison the first comparison
    operator, off_by_one the first integer literal, swap_builtin the first call of min/max/any/all. {} when the
    source does not tokenize."""
    starts = [0]
    for line in io.StringIO(source).readlines():  # the lines tokenize reads (split at "\n" only)
        starts.append(starts[-1] + len(line))
    sites: dict = {}
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return {}
    for tok, nxt in zip(toks, toks[1:] + [None]):
        at = starts[tok.start[0] - 1] + tok.start[1], starts[tok.end[0] - 1] + tok.end[1]
        if tok.type == tokenize.OP and tok.string in _FLIPPED:
            sites.setdefault("flip_comparison", (*at, _FLIPPED[tok.string]))
        elif tok.type == tokenize.NUMBER and tok.string.isdigit():
            sites.setdefault("off_by_one", (*at, str(int(tok.string) + 1)))
        elif tok.type == tokenize.NAME and tok.string in _SWAPPED and nxt is not None and nxt.string == "(":
            sites.setdefault("swap_builtin", (*at, _SWAPPED[tok.string]))
    return sites


def slip_program(source: str, seed: int) -> tuple[str, str] | None:
    """(kind, source'): the program with one generic mistake a noisy expert makes, chosen by `seed` among the
    kinds that apply (CODE_SLIP_KINDS, each at its first site: a comparison turned around, an integer literal one
    too large, min/max or any/all swapped). None where none applies. As `experts.sql.slip_query`, the mistakes are
    the same kinds on every task, so a base that imitates them at a rate (`study.host.sft.HostSFTSettings.noise`)
    has a behaviour shared by all tasks for RL to unlearn. A slip need not change every output: one that passes
    every test is a correct program."""
    sites = _first_sites(source)
    if not sites:
        return None
    kind = [k for k in CODE_SLIP_KINDS if k in sites][random.Random(seed).randrange(len(sites))]
    lo, hi, text = sites[kind]
    return kind, source[:lo] + text + source[hi:]


def program_slips(source: str) -> set[str]:
    """Every program `slip_program` can make of `source` (one per kind that applies)."""
    return {source[:lo] + text + source[hi:] for lo, hi, text in _first_sites(source).values()}


CODE_MISTAKE_KINDS = ("solved", "slip", "slip and value", "value", "other", "no submission")


def _form(source: str) -> tuple | None:
    """The program's tokens with every number and string literal replaced by '?' (comments and blank lines
    dropped), or None where it does not tokenize."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    return tuple("?" if t.type in (tokenize.NUMBER, tokenize.STRING) else t.string for t in toks
                 if t.type not in (tokenize.COMMENT, tokenize.NL))


def program_mistake(reference: str, actions: list[str], solved: bool) -> str:
    """What is wrong with an episode's last submission (CODE_MISTAKE_KINDS), as `experts.sql.submission_mistake`:
    'solved'; 'no submission' (no code block in its replies); 'slip' (the reference with one of `program_slips`'
    mistakes, surrounding whitespace aside); 'slip and value' (a comparison or min/max/any/all slip with other
    number or string literals as well); 'value' (the reference's form with other literals: a constant copied
    wrong, an off-by-one slip included); 'other'."""
    if solved:
        return "solved"
    codes = [c for c in (extract_code(a) if isinstance(a, str) else None for a in actions) if c is not None]
    if not codes:
        return "no submission"
    slips = program_slips(reference)
    if codes[-1].strip() in {p.strip() for p in slips}:
        return "slip"
    form, ref_form = _form(codes[-1]), _form(reference)
    if form is None:
        return "other"
    if form in {_form(p) for p in slips} - {ref_form}:
        return "slip and value"
    return "value" if form == ref_form else "other"


class CodeExpert(NoisyExpert):
    """The noisy expert of `CodeEnv` (module docstring). It does not check first: on coding a submission is the
    check."""

    env_class = CodeEnv
    mistake_kinds = CODE_MISTAKE_KINDS

    def slipped_actions(self, task: CodeTask, seed: int, fix: float = 1.0) -> list[str] | None:
        """A noisy expert's episode: the reference with one generic mistake (`slip_program`), then, after the
        test feedback, with probability `fix` the reference itself, else the slipped program once more (the
        expert gives up on finding its mistake; the episode fails). An episode with a budget of one turn ends at
        the slip. The draw uses its own stream of `seed`, apart from the slip's. None where no slip applies or the
        task has no reference."""
        check_slip_fix(fix)
        slipped = slip_program(task.reference, seed)  # None for an empty reference: nothing to slip
        if slipped is None:
            return None
        first = f"```python\n{slipped[1].rstrip()}\n```"
        fixes = random.Random(f"fix {seed}").random() < fix
        return [first, *(self.env.ground_truth_actions(task) if fixes else [first])]

    def submission_mistake(self, task: CodeTask, actions: list, solved: bool) -> str:
        """`program_mistake` of the task's reference."""
        return program_mistake(task.reference, actions, solved)
