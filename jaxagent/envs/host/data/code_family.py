"""What the generated coding families share (`code_gen`, `code_gen_long`): the family record and the random input
helpers (written for jaxagent).

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Family:
    """One problem family: a grid of parameter sets, each a task (`code_gen.make_task`)."""
    name: str
    entry_point: str
    grid: tuple                                      # parameter dicts, one per task
    make: Callable[[dict], tuple[str, str]]          # params -> (prompt, reference source)
    inputs: Callable[[random.Random, dict], list]    # (rng, params) -> a list of argument lists (one test each)
    edge: Callable[[dict], list] = lambda p: []      # params -> argument lists always tested


def param_grid(**axes) -> tuple:
    """Every combination of the axes' values, as parameter dicts (the last axis varying fastest)."""
    keys = list(axes)
    return tuple(dict(zip(keys, vals)) for vals in itertools.product(*(axes[k] for k in keys)))


def random_ints(rng, lo=-30, hi=30, n_max=12, n_min=0) -> list:
    """A list of n_min..n_max integers in [lo, hi]."""
    return [rng.randint(lo, hi) for _ in range(rng.randint(n_min, n_max))]


WORDS = ("apple", "banana", "cherry", "date", "fig", "grape", "kiwi", "lemon", "mango", "nut", "olive", "pear",
         "quince", "radish", "sage", "thyme", "ugli", "vanilla", "walnut", "yam", "zucchini", "a", "an", "be", "echo",
         "idea", "oboe", "queue", "dance", "bread", "ember", "ice", "joy", "hazel", "jade", "basil")


def random_text(rng, n_max=8) -> str:
    """Up to n_max words of WORDS joined by spaces, some capitalised."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(0, n_max))]
    return " ".join(w.capitalize() if rng.random() < 0.3 else w for w in words)


def random_chars(rng, alphabet: str, n_max=16) -> str:
    """Up to n_max characters drawn from `alphabet`."""
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, n_max)))
