"""Interaction budgets: evaluation tiers, BudgetMix sampling, validation and the announced budget text.

Definitions (docs/study.md, "jaxagent's definitions" and finding 8, BudgetMix RL):
    tier(f)          = max(1, ceil(f * T_max)),  f in {0.25, 0.5, 0.75, 1.0}
    BudgetMix        : candidates tier(f) for f in {0.1, 0.2, ..., 1.0}, one drawn uniformly per task,
                       shared by all G rollouts of that task's group.
The ceil is computed in exact rational arithmetic (``fractions.Fraction`` of the decimal text of f),
so ceil(0.3 * 10) = 3 and ceil(0.1 * 10) = 1, never a float off-by-one.

Dimension legend: G group size, Wr words of a rendered budget text.
"""
from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.jax.text_codec import TextCodec, compact

DEFAULT_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
BUDGETMIX_FRACTIONS = tuple(Fraction(k, 10) for k in range(1, 11))
MAX_BUDGET = 999  # numbers are rendered with at most 3 digit words
DIGITS = tuple(str(d) for d in range(10))
PLACEHOLDERS = ("{turn}", "{budget}", "{remaining}")
# The one budget text of the study (docs/study.md): host envs render it as a string (`budget_text`),
# the jittable envs as word ids (`budget_words` over `DEFAULT_TEMPLATE`, its words and sentence stops).
BUDGET_TEMPLATE = "Turn {turn} of {budget}. {remaining} turns left."


def template_words(template: str) -> tuple[str, ...]:
    """A budget text template as codec words: split at spaces, a word's trailing "." its own word."""
    words = []
    for w in template.split():
        words += [w[:-1], "."] if w.endswith(".") and len(w) > 1 else [w]
    return tuple(words)


DEFAULT_TEMPLATE = template_words(BUDGET_TEMPLATE)  # ("Turn", "{turn}", "of", "{budget}", ".", ...)


def budget_text(t: int, budget: int, template: str = BUDGET_TEMPLATE) -> str:
    """The announced budget of turn t (0-based, shown 1-based) as text, e.g. "Turn 2 of 5. 4 turns left."."""
    return template.format(turn=t + 1, budget=budget, remaining=budget - t)


def _fraction(f) -> Fraction:
    if isinstance(f, float):
        return Fraction(repr(f))  # the decimal the user wrote, not the binary float
    return Fraction(f)


def _check_t_max(t_max) -> int:
    if isinstance(t_max, bool) or int(t_max) != t_max or not 1 <= int(t_max) <= MAX_BUDGET:
        raise ValueError(f"t_max must be an integer in [1, {MAX_BUDGET}], got {t_max!r}")
    return int(t_max)


def budget_tiers(t_max: int, fractions: Sequence = DEFAULT_FRACTIONS) -> tuple[int, ...]:
    """max(1, ceil(f * T_max)) for each f in ``fractions`` (each in (0, 1])."""
    t_max = _check_t_max(t_max)
    out = []
    for f in fractions:
        fr = _fraction(f)
        if not 0 < fr <= 1:
            raise ValueError(f"budget fraction must lie in (0, 1], got {f!r}")
        out.append(max(1, math.ceil(fr * t_max)))
    return tuple(out)


def budgetmix_candidates(t_max: int) -> tuple[int, ...]:
    """The 10 BudgetMix candidates tier(f), f = 0.1..1.0 (duplicates kept: one per fraction)."""
    return budget_tiers(t_max, BUDGETMIX_FRACTIONS)


def sample_budgetmix(key: jax.Array, n_tasks: int, group_size: int, t_max: int) -> jax.Array:
    """int32[n_tasks * group_size]: per task one candidate drawn uniformly (over the 10 fractions),
    repeated for the group's G consecutive rollouts."""
    if n_tasks < 1 or group_size < 1:
        raise ValueError(f"n_tasks and group_size must be >= 1, got {n_tasks}, {group_size}")
    cands_C = jnp.asarray(budgetmix_candidates(t_max), jnp.int32)
    idx_T = jax.random.randint(key, (n_tasks,), 0, cands_C.shape[0])
    return jnp.repeat(cands_C[idx_T], group_size)


def full_budget(n: int, t_max: int) -> jax.Array:
    """int32[n] filled with T_max (standard full-budget RL)."""
    return jnp.full((n,), _check_t_max(t_max), jnp.int32)


def validate_budgets(budgets, t_max: int, *, keep_on_device: bool = False):
    """Host-side check of concrete budgets: integers (an integer dtype; floats are refused, even whole ones) with
    1 <= b <= T_max; returns them as int32.

    `keep_on_device`: an integer jax.Array (e.g. budgets sampled inside a jitted RL iteration) is checked
    through its min and max (two scalars to the host) and returned as a device array, not copied to the
    host and back; anything else takes the numpy path."""
    t_max = _check_t_max(t_max)
    if keep_on_device and isinstance(budgets, jax.Array) and jnp.issubdtype(budgets.dtype, jnp.integer):
        if budgets.size == 0:
            raise ValueError("budgets is empty")
        lo, hi = (int(v) for v in jax.device_get((jnp.min(budgets), jnp.max(budgets))))
        if lo <= 0 or hi > t_max:
            raise ValueError(f"budget(s) outside [1, T_max={t_max}] (min {lo}, max {hi}): a budget must be a "
                             "positive number of turns no larger than T_max")
        return budgets.astype(jnp.int32)
    b = np.asarray(budgets)
    if b.size == 0:
        raise ValueError("budgets is empty")
    if not np.issubdtype(b.dtype, np.integer):  # a float budget is a bug upstream (a fraction not rounded to turns)
        raise ValueError(f"budgets must be integers (turns per episode), got dtype {b.dtype}: round fractions of T_max "
                         "with budget_tiers")
    bad = (b <= 0) | (b > t_max)
    if np.any(bad):
        raise ValueError(f"{int(bad.sum())} budget(s) outside [1, T_max={t_max}]: "
                         f"{np.unique(b[bad])[:10].tolist()} (a budget must be a positive number of "
                         "turns no larger than T_max)")
    return b.astype(np.int32)


@dataclasses.dataclass(frozen=True)
class BudgetFormat:
    """A budget text template resolved to codec word ids (hashable: usable as a static argument).

    ``template`` words are literals or the placeholders {turn} (1-based turn number), {budget}
    (total turns) and {remaining} (turns left, including the current one); build with ``from_codec``.
    """

    template: tuple[str, ...]
    literal_ids: tuple[int, ...]  # codec id per template slot, -1 for placeholders
    digit_ids: tuple[int, ...]  # codec ids of "0".."9"

    @classmethod
    def from_codec(cls, codec: TextCodec, template: Sequence[str] = DEFAULT_TEMPLATE) -> BudgetFormat:
        template = tuple(template)
        lits = tuple(-1 if w in PLACEHOLDERS else codec.word_id(w) for w in template)
        return cls(template, lits, tuple(codec.word_id(d) for d in DIGITS))

    @property
    def max_words(self) -> int:
        return sum(3 if w in PLACEHOLDERS else 1 for w in self.template)

    def words_for(self, t_max: int) -> int:
        """Most words a budget text can have when every number is <= t_max (turns, budgets and
        remaining turns of a rollout with that T_max): the rollout's prompt chunks need no wider slot."""
        digits = min(3, len(str(min(max(int(t_max), 0), MAX_BUDGET))))
        return sum(digits if w in PLACEHOLDERS else 1 for w in self.template)


def vocabulary(template: Sequence[str] = DEFAULT_TEMPLATE) -> tuple[str, ...]:
    """Every word a budget text with ``template`` can contain."""
    return tuple(dict.fromkeys([w for w in template if w not in PLACEHOLDERS] + list(DIGITS)))


def _number_words(x, digit_ids_10):
    """Digit word ids of 0 <= x <= 999 without leading zeros: (ids int32[3], keep bool[3])."""
    x = jnp.clip(jnp.asarray(x, jnp.int32), 0, MAX_BUDGET)
    digits_3 = jnp.stack([x // 100, (x // 10) % 10, x % 10])
    keep_3 = jnp.stack([x >= 100, x >= 10, jnp.asarray(True)])
    return digit_ids_10[digits_3], keep_3


def budget_words(turn_index, budget, remaining, fmt: BudgetFormat, hidden=False
                 ) -> tuple[jax.Array, jax.Array]:
    """Word ids of the announced budget, e.g. "Turn 3 of 10 . 8 turns left ." for turn_index 2
    (0-based, shown 1-based), budget 10, remaining 8; ``hidden`` (bool, may be traced) gives no words.
    Returns (word_ids int32[fmt.max_words], n_words); numbers are clipped to [0, 999]."""
    digit_ids_10 = jnp.asarray(fmt.digit_ids, jnp.int32)
    values = {"{turn}": jnp.asarray(turn_index) + 1, "{budget}": budget, "{remaining}": remaining}
    ids, keep = [], []
    for word, lit in zip(fmt.template, fmt.literal_ids):
        if word in PLACEHOLDERS:
            w3, k3 = _number_words(values[word], digit_ids_10)
            ids.append(w3)
            keep.append(k3)
        else:
            ids.append(jnp.asarray([lit], jnp.int32))
            keep.append(jnp.asarray([True]))
    ids_Wr, keep_Wr = jnp.concatenate(ids), jnp.concatenate(keep)
    keep_Wr = keep_Wr & ~jnp.asarray(hidden, bool)
    return compact(ids_Wr, keep_Wr, 0)
