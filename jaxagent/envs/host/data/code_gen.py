"""Generated coding tasks: parameterised problem families with unit tests (written for jaxagent; not DeepCoder).

No dimension legend: host-side Python, no arrays.

A family is one kind of problem (sum the multiples of k, shift letters by k, windowed aggregates, ...; and the
longer families of `code_gen_long`, 20-40-line references) with a grid of parameters; each parameter set is a task:
a prompt naming the function and the parameters, a reference solution with the parameters written in as constants,
and unit tests: edge cases first, then inputs drawn by `random.Random(f"{seed}/{task id}")` until there are 7
distinct tests with at least two distinct answers, their expected values the reference's return values (computed in
this process, JSON-normalised as the sandbox returns values: tuples as lists).
`generate(seed)` returns the task dicts (id, entry_point, prompt, reference, tests, template: the family's name),
variant 0 of every family, then variant 1 of every family, ...; deterministic for a seed on every machine.
HELDOUT_FAMILIES are what the structural split holds out whole (`splits.structural_splits`). The families, their
counts and how every reference is checked in the sandbox: docs/host_study.md, "Data".
"""

from __future__ import annotations

import json
import random
from typing import Callable

from jaxagent.envs.host.data import code_gen_long
from jaxagent.envs.host.data.code_family import Family, param_grid, random_chars, random_ints, random_text

SEED = 0  # the built-in set's seed
MIN_TESTS = 7  # tests per task (edge cases + random inputs), when the inputs allow that many distinct ones
MAX_DRAWS = 40  # random inputs drawn at most per task


# ------------------------------------------------------------------------------------------- families
def _sum_multiples(p):
    cond, text = {"any": ("", ""), "positive": (" and x > 0", " and greater than zero"),
                  "odd": (" and i % 2 == 1", " and stand at an odd index (1, 3, 5, ...)")}[p["cond"]]
    return (f"Write `sum_multiples(nums)` that returns the sum of the numbers in the list `nums` that are divisible "
            f"by {p['k']}{text} (0 if there are none).",
            f"def sum_multiples(nums):\n    return sum(x for i, x in enumerate(nums) if x % {p['k']} == 0{cond})\n")


def _count_words(p):
    op, text = {">": (">", "more than"), "<=": ("<=", "at most"), "==": ("==", "exactly")}[p["op"]]
    return (f"Write `count_words(text)` that returns how many words of the string `text` (words are separated by "
            f"whitespace) have {text} {p['n']} characters.",
            f"def count_words(text):\n    return sum(1 for w in text.split() if len(w) {op} {p['n']})\n")


def _caesar(p):
    k = p["k"] if p["dir"] == "forward" else -p["k"]
    return (f"Write `shift_letters(s)` that moves every letter of the string `s` {p['k']} places {p['dir']} in the "
            "alphabet, wrapping around between 'z' and 'a' and keeping its case; other characters stay as they are.",
            "def shift_letters(s):\n    out = []\n    for c in s:\n"
            f"        if 'a' <= c <= 'z':\n            out.append(chr((ord(c) - 97 + {k}) % 26 + 97))\n"
            f"        elif 'A' <= c <= 'Z':\n            out.append(chr((ord(c) - 65 + {k}) % 26 + 65))\n"
            "        else:\n            out.append(c)\n    return ''.join(out)\n")


def _rotate(p):
    body = ("    k = {k} % len(xs)\n    return xs[-k:] + xs[:-k] if k else list(xs)\n" if p["dir"] == "right"
            else "    k = {k} % len(xs)\n    return xs[k:] + xs[:k]\n").format(k=p["k"])
    return (f"Write `rotate(xs)` that returns a new list: the list `xs` rotated {p['k']} places to the {p['dir']} "
            f"(an element that falls off one end comes back at the other; [] stays []).",
            "def rotate(xs):\n    if not xs:\n        return []\n" + body)


def _chunks(p):
    expr = {"sum": "sum(c)", "max": "max(c)", "min": "min(c)", "first": "c[0]", "last": "c[-1]"}[p["agg"]]
    what = {"sum": "sum", "max": "largest element", "min": "smallest element", "first": "first element",
            "last": "last element"}[p["agg"]]
    return (f"Write `chunk_values(xs)` that splits the list `xs` into consecutive chunks of {p['k']} elements (the "
            f"last chunk may be shorter) and returns the list of each chunk's {what}.",
            f"def chunk_values(xs):\n    chunks = [xs[i:i + {p['k']}] for i in range(0, len(xs), {p['k']})]\n"
            f"    return [{expr} for c in chunks]\n")


def _clamp(p):
    lo, hi = p["lo"], p["lo"] + p["width"]
    if p["mode"] == "clamp":
        return (f"Write `fit_range(xs)` that returns the list `xs` with every number below {lo} replaced by {lo} "
                f"and every number above {hi} replaced by {hi}.",
                f"def fit_range(xs):\n    return [min(max(x, {lo}), {hi}) for x in xs]\n")
    return (f"Write `fit_range(xs)` that returns the numbers of the list `xs` that lie between {lo} and {hi} "
            "(both included), in their original order.",
            f"def fit_range(xs):\n    return [x for x in xs if {lo} <= x <= {hi}]\n")


def _every_kth(p):
    return (f"Write `pick_every(xs)` that returns the elements of the list `xs` at the indices {p['start']}, "
            f"{p['start'] + p['k']}, {p['start'] + 2 * p['k']}, ... (every {p['k']}th element from index "
            f"{p['start']}), in order.",
            f"def pick_every(xs):\n    return xs[{p['start']}::{p['k']}]\n")


def _digits_base(p):
    b = p["b"]
    if p["mode"] == "sum":
        return (f"Write `base_digits(n)` that returns the sum of the digits of the non-negative integer `n` written "
                f"in base {b}.",
                f"def base_digits(n):\n    total = 0\n    while n:\n        total += n % {b}\n        n //= {b}\n"
                "    return total\n")
    return (f"Write `base_digits(n)` that returns how many digits the non-negative integer `n` has when written in "
            f"base {b} (0 has one digit).",
            f"def base_digits(n):\n    count = 1\n    while n >= {b}:\n        n //= {b}\n        count += 1\n"
            "    return count\n")


def _to_base(p):
    b = p["b"]
    return (f"Write `to_base(n)` that returns the non-negative integer `n` written in base {b} as a string, with "
            "the digits 0-9 and then the lower-case letters a-z for digit values 10 and up ('0' for 0).",
            "def to_base(n):\n    digits = '0123456789abcdefghijklmnopqrstuvwxyz'\n    if n == 0:\n        return '0'\n"
            f"    out = ''\n    while n:\n        out = digits[n % {b}] + out\n        n //= {b}\n    return out\n")


def _recurrence(p):
    a0, a1, x, y = p["a0"], p["a1"], p["x"], p["y"]
    return (f"Write `sequence(n)` that returns a(n) for n >= 0, where a(0) = {a0}, a(1) = {a1} and "
            f"a(n) = {x} * a(n - 1) + {y} * a(n - 2) for n >= 2.",
            f"def sequence(n):\n    a, b = {a0}, {a1}\n    for _ in range(n):\n        a, b = b, {x} * b + {y} * a\n"
            "    return a\n")


def _windows(p):
    w = p["w"]
    expr, what = {"max": ("max(win)", "largest element"), "min": ("min(win)", "smallest element"),
                  "sum": ("sum(win)", "sum"), "range": ("max(win) - min(win)", "largest minus smallest element"),
                  "evens": ("sum(1 for x in win if x % 2 == 0)", "number of even elements"),
                  "first": ("win[0] * win[-1]", "first element times its last element")}[p["agg"]]
    return (f"Write `window_values(xs)` that returns, for every window of {w} consecutive elements of the list `xs` "
            f"from left to right, the window's {what} ([] when `xs` has fewer than {w} elements).",
            f"def window_values(xs):\n    out = []\n    for i in range(len(xs) - {w} + 1):\n"
            f"        win = xs[i:i + {w}]\n"
            f"        out.append({expr})\n    return out\n")


def _runs(p):
    c, m = p["c"], p["m"]
    return (f"Write `count_runs(s)` that returns how many maximal runs of the character '{c}' in the string `s` "
            f"are at least {m} characters long (a run is a block of consecutive '{c}' characters that cannot be "
            "extended).",
            f"def count_runs(s):\n    count = run = 0\n    for ch in s + '\\0':\n        if ch == '{c}':\n"
            f"            run += 1\n        else:\n            if run >= {m}:\n                count += 1\n"
            "            run = 0\n    return count\n")


def _replace_chars(p):
    test, what = {"vowel": ("ch.lower() in 'aeiou'", "vowel (a, e, i, o, u in either case)"),
                  "consonant": ("ch.isalpha() and ch.lower() not in 'aeiou'", "consonant letter"),
                  "digit": ("ch.isdigit()", "digit")}[p["kind"]]
    tail = ".upper()" if p["upper"] else ""
    return (f"Write `mask_chars(s)` that returns the string `s` with every {what} replaced by '{p['c']}'"
            + (", then converted to upper case." if p["upper"] else "."),
            f"def mask_chars(s):\n    return ''.join({p['c']!r} if {test} else ch for ch in s){tail}\n")


def _filter_words(p):
    x = p["x"]
    test, what = {"starts": (f"w.lower().startswith('{x}')", f"start with the letter '{x}'"),
                  "ends": (f"w.lower().endswith('{x}')", f"end with the letter '{x}'"),
                  "contains": (f"'{x}' in w.lower()", f"contain the letter '{x}'")}[p["mode"]]
    return (f"Write `pick_words(words)` that returns the strings of the list `words` that {what}, ignoring case, "
            "in their original order.",
            f"def pick_words(words):\n    return [w for w in words if {test}]\n")


def _pairs(p):
    d = p["d"]
    test, what = {"diff": (f"abs(xs[i] - xs[j]) == {d}", f"differ by exactly {d}"),
                  "sum": (f"xs[i] + xs[j] == {d}", f"add up to {d}"),
                  "close": (f"abs(xs[i] - xs[j]) <= {d}", f"differ by at most {d}")}[p["mode"]]
    return (f"Write `count_pairs(xs)` that returns the number of index pairs (i, j) with i < j whose elements in the "
            f"list `xs` {what}.",
            "def count_pairs(xs):\n    n = len(xs)\n"
            f"    return sum(1 for i in range(n) for j in range(i + 1, n) if {test})\n")


def _kth(p):
    k, largest, distinct = p["k"], p["order"] == "largest", p["distinct"]
    pool = "sorted(set(xs)" if distinct else "sorted(xs"
    pool += ", reverse=True)" if largest else ")"
    nth = f"{k}{'st' if k == 1 else 'nd' if k == 2 else 'rd' if k == 3 else 'th'}"
    return (f"Write `kth_value(xs)` that returns the {nth}"
            f" {p['order']} {'distinct value' if distinct else 'element (counting repeated values separately)'} of "
            "the list `xs`, or None if there is no such value.",
            f"def kth_value(xs):\n    vals = {pool}\n    return vals[{k - 1}] if len(vals) >= {k} else None\n")


def _residues(p):
    m = p["m"]
    if p["mode"] == "count":
        what, body = "number of elements x", f"    out = [0] * {m}\n    for x in xs:\n        out[x % {m}] += 1\n"
    elif p["mode"] == "sum":
        what, body = "sum of the elements x", f"    out = [0] * {m}\n    for x in xs:\n        out[x % {m}] += x\n"
    else:
        what = "largest element x (None if there is none)"
        body = (f"    out = [None] * {m}\n    for x in xs:\n        r = x % {m}\n"
                "        if out[r] is None or x > out[r]:\n            out[r] = x\n")
    return (f"Write `by_residue(xs)` that returns a list of length {m} whose entry r is the {what} of the list `xs` "
            f"with x % {m} == r (Python's %, so the residue is never negative).",
            "def by_residue(xs):\n" + body + "    return out\n")


def _steps(p):
    d, mode = p["d"], p["mode"]
    what = {"all": "the number of steps", "div": "how many of the steps are divisions",
            "sub": "how many of the steps are subtractions"}[mode]
    count_div = "            count += 1\n" if mode in ("all", "div") else ""
    count_sub = "            count += 1\n" if mode in ("all", "sub") else ""
    return (f"Write `steps_to_one(n)` for an integer n >= 1: while n > 1, n is divided by {d} when it is divisible "
            f"by {d} and otherwise decreased by 1. Return {what} taken until n is 1.",
            f"def steps_to_one(n):\n    count = 0\n    while n > 1:\n        if n % {d} == 0:\n            n //= {d}\n"
            + count_div + "        else:\n            n -= 1\n" + count_sub + "    return count\n")


def _weighted(p):
    o, form = p["o"], p["form"]
    expr, what = {"plain": (f"(i + {o}) * x", f"(i + {o}) * xs[i]"),
                  "alt": (f"(-1) ** i * (i + {o}) * x", f"(-1)**i * (i + {o}) * xs[i]"),
                  "square": (f"(i + {o}) ** 2 * x", f"(i + {o})**2 * xs[i]")}[form]
    return (f"Write `weighted_sum(xs)` that returns the sum over all indices i of {what} for the list `xs` "
            "(0 for an empty list).",
            f"def weighted_sum(xs):\n    return sum({expr} for i, x in enumerate(xs))\n")


def _interleave(p):
    k, rest = p["k"], p["rest"]
    a, b = ("a", "b") if p["first"] == "a" else ("b", "a")
    tail = "    out.extend(a[i:])\n    out.extend(b[i:])\n" if rest == "append" else ""
    return (f"Write `interleave(a, b)` that builds a list by taking {k} element(s) from the list `{a}`, then {k} "
            f"from `{b}`, and so on, while both still have at least {k} elements left; "
            + ("then appends what is left of `a` and then what is left of `b`." if rest == "append"
               else "whatever is left over is dropped."),
            f"def interleave(a, b):\n    out = []\n    i = 0\n    while i + {k} <= len(a) and i + {k} <= len(b):\n"
            f"        out.extend({a}[i:i + {k}])\n        out.extend({b}[i:i + {k}])\n        i += {k}\n"
            + tail + "    return out\n")


def _longest_run(p):
    t = p["t"]
    test, what = {"<": (f"x < {t}", f"less than {t}"), ">=": (f"x >= {t}", f"at least {t}"),
                  "==": (f"x == {t}", f"equal to {t}")}[p["cmp"]]
    return (f"Write `longest_run(xs)` that returns the length of the longest block of consecutive elements of the "
            f"list `xs` that are all {what} (0 if there is none).",
            f"def longest_run(xs):\n    best = run = 0\n    for x in xs:\n        run = run + 1 if {test} else 0\n"
            "        best = max(best, run)\n    return best\n")


def _compress(p):
    m, fmt = p["m"], p["fmt"]
    piece, what = {"cn": ("c + str(n)", "the character followed by the run's length"),
                   "nc": ("str(n) + c", "the run's length followed by the character"),
                   "paren": ("c + '(' + str(n) + ')'", "the character followed by the length in parentheses")}[fmt]
    return (f"Write `squeeze(s)` that replaces every run of at least {m} equal consecutive characters of the string "
            f"`s` with {what}, e.g. a run 'cccc' of length 4; shorter runs stay as they are.",
            f"def squeeze(s):\n    out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
            "        while j < len(s) and s[j] == s[i]:\n            j += 1\n        c, n = s[i], j - i\n"
            f"        out.append({piece} if n >= {m} else s[i:j])\n        i = j\n    return ''.join(out)\n")


def _diagonal(p):
    o, anti, agg = p["o"], p["anti"], p["agg"]
    cond = f"j - i == {o}" if not anti else f"i + j == len(m) - 1 + {o}"
    which = (f"the diagonal with j - i == {o}" if not anti
             else f"the anti-diagonal with i + j == n - 1 + {o} (n the number of rows)")
    fn = {"sum": "sum", "max": "max"}[agg]
    return (f"Write `diagonal(m)` for a square matrix `m` (a list of n rows of n integers) that returns the {agg} of "
            f"the entries m[i][j] on {which}" + (" (0 if it has none)." if agg == "sum" else " (None if it has none)."),
            f"def diagonal(m):\n    vals = [m[i][j] for i in range(len(m)) for j in range(len(m)) if {cond}]\n"
            + ("    return sum(vals)\n" if fn == "sum" else "    return max(vals) if vals else None\n"))


def _pascal(p):
    m, mode = p["m"], p["mode"]
    if mode == "row":
        return (f"Write `pascal(n)` that returns row n (n >= 0; row 0 is [1]) of Pascal's triangle with every entry "
                f"taken modulo {m}.",
                f"def pascal(n):\n    row = [1]\n    for _ in range(n):\n"
                f"        row = [1] + [row[i] + row[i + 1] for i in range(len(row) - 1)] + [1]\n"
                f"    return [x % {m} for x in row]\n")
    return (f"Write `pascal(n)` that returns how many entries of row n (n >= 0; row 0 is [1]) of Pascal's triangle "
            f"are divisible by {m}.",
            f"def pascal(n):\n    row = [1]\n    for _ in range(n):\n"
            f"        row = [1] + [row[i] + row[i + 1] for i in range(len(row) - 1)] + [1]\n"
            f"    return sum(1 for x in row if x % {m} == 0)\n")


def _digit_sum_nth(p):
    k, b = p["k"], p["b"]
    return (f"Write `nth_special(n)` that returns the n-th positive integer (n >= 1) whose digit sum in base {b} is "
            f"divisible by {k}.",
            f"def nth_special(n):\n    x = 0\n    while n:\n        x += 1\n        s, y = 0, x\n        while y:\n"
            f"            s += y % {b}\n            y //= {b}\n        if s % {k} == 0:\n            n -= 1\n"
            "    return x\n")


def _gcd_pairs(p):
    g, mode = p["g"], p["mode"]
    test, what = {"eq": (f"math.gcd(xs[i], xs[j]) == {g}", f"is exactly {g}"),
                  "ge": (f"math.gcd(xs[i], xs[j]) >= {g}", f"is at least {g}"),
                  "div": (f"math.gcd(xs[i], xs[j]) % {g} == 0", f"is divisible by {g}")}[mode]
    return (f"Write `gcd_pairs(xs)` that returns the number of index pairs (i, j) with i < j for which the greatest "
            f"common divisor of the positive integers xs[i] and xs[j] {what}.",
            "import math\n\n\ndef gcd_pairs(xs):\n    n = len(xs)\n"
            f"    return sum(1 for i in range(n) for j in range(i + 1, n) if {test})\n")


def _letter_score(p):
    v, u = p["v"], p["u"]
    return (f"Write `letter_score(s)` that adds up a score over the letters of the string `s`: a letter is worth its "
            f"position in the alphabet (a = 1, ..., z = 26, ignoring case), a vowel (a, e, i, o, u) counts {v} "
            f"times, and an upper-case letter's worth is multiplied by {u}; other characters are worth 0.",
            "def letter_score(s):\n    total = 0\n    for c in s:\n        if not c.isascii() or not c.isalpha():\n"
            "            continue\n        w = ord(c.lower()) - 96\n"
            f"        if c.lower() in 'aeiou':\n            w *= {v}\n        if c.isupper():\n            w *= {u}\n"
            "        total += w\n    return total\n")


def _cap_counts(p):
    k, keep = p["k"], p["keep"]
    if keep == "first":
        return (f"Write `cap_repeats(xs)` that returns the list `xs` keeping only the first {k} occurrence(s) of each "
                "value (later ones are dropped), in the original order.",
                f"def cap_repeats(xs):\n    seen = {{}}\n    out = []\n    for x in xs:\n"
                f"        seen[x] = seen.get(x, 0) + 1\n        if seen[x] <= {k}:\n            out.append(x)\n"
                "    return out\n")
    if keep == "last":
        return (f"Write `cap_repeats(xs)` that returns the list `xs` keeping only the last {k} occurrence(s) of each "
                "value (earlier ones are dropped), in the original order.",
                f"def cap_repeats(xs):\n    seen = {{}}\n    out = []\n    for x in reversed(xs):\n"
                f"        seen[x] = seen.get(x, 0) + 1\n        if seen[x] <= {k}:\n            out.append(x)\n"
                "    return out[::-1]\n")
    return (f"Write `cap_repeats(xs)` that returns how many elements of the list `xs` would be dropped by keeping "
            f"only the first {k} occurrence(s) of each value.",
            f"def cap_repeats(xs):\n    seen = {{}}\n    dropped = 0\n    for x in xs:\n"
            f"        seen[x] = seen.get(x, 0) + 1\n        if seen[x] > {k}:\n            dropped += 1\n"
            "    return dropped\n")


def _climb(p):
    steps, mode = p["steps"], p["mode"]
    if mode == "ways":
        return (f"Write `climb(n)` that returns the number of ways to climb a staircase of n steps (n >= 0) when "
                f"each move climbs {', '.join(map(str, steps[:-1]))} or {steps[-1]} steps (the order of moves "
                "matters; there is 1 way to climb 0 steps).",
                f"def climb(n):\n    ways = [1] + [0] * n\n    for i in range(1, n + 1):\n"
                f"        ways[i] = sum(ways[i - s] for s in {steps} if s <= i)\n    return ways[n]\n")
    return (f"Write `climb(n)` that returns the fewest moves that climb a staircase of exactly n steps (n >= 0) when "
            f"each move climbs {', '.join(map(str, steps[:-1]))} or {steps[-1]} steps.",
            f"def climb(n):\n    best = [0] + [None] * n\n    for i in range(1, n + 1):\n"
            f"        options = [best[i - s] for s in {steps} if s <= i and best[i - s] is not None]\n"
            "        best[i] = min(options) + 1 if options else None\n    return best[n]\n")


def _brackets(p):
    o, c = p["pair"]
    bad = p["bad"]
    if p["mode"] == "depth":
        what, ret = "the deepest nesting level of the brackets", "depth_max"
    else:
        what, ret = "how many top-level bracket groups it has", "groups"
    return (f"Write `bracket_info(s)` that looks only at the characters '{o}' and '{c}' of the string `s`. If they "
            f"are balanced (every '{o}' closed by a later '{c}', none closed twice), return {what}; otherwise "
            f"return {bad}. A string without brackets is balanced with 0 of either.",
            f"def bracket_info(s):\n    depth = depth_max = groups = 0\n    for ch in s:\n        if ch == {o!r}:\n"
            "            if depth == 0:\n                groups += 1\n            depth += 1\n"
            "            depth_max = max(depth_max, depth)\n"
            f"        elif ch == {c!r}:\n            depth -= 1\n            if depth < 0:\n"
            f"                return {bad}\n    if depth:\n        return {bad}\n    return {ret}\n")


def _matrix(rng, n: int) -> list:
    return [[rng.randint(-9, 9) for _ in range(n)] for _ in range(n)]


def _bracket_text(rng, p):
    o, c = p["pair"]
    return random_chars(rng, o * 3 + c * 3 + "ab", 14)


BASE_FAMILIES = (
    Family("sum-multiples", "sum_multiples", param_grid(k=range(2, 12), cond=("any", "positive", "odd")),
           _sum_multiples,
           lambda rng, p: [[random_ints(rng)]], lambda p: [[[]], [[p["k"], -p["k"], 0, 1]]]),
    Family("count-words", "count_words", param_grid(n=range(1, 11), op=(">", "<=", "==")), _count_words,
           lambda rng, p: [[random_text(rng)]], lambda p: [[""], ["  spaced   out  "]]),
    Family("shift-letters", "shift_letters", param_grid(k=range(1, 16), dir=("forward", "backward")), _caesar,
           lambda rng, p: [[random_chars(rng, "abcxyzABCXYZ !.,-", 14)]], lambda p: [[""], ["Zz Aa!"]]),
    Family("rotate", "rotate", param_grid(k=range(1, 16), dir=("right", "left")), _rotate,
           lambda rng, p: [[random_ints(rng, n_max=9)]], lambda p: [[[]], [[7]], [[1, 2, 3]]]),
    Family("chunk-values", "chunk_values", param_grid(k=range(2, 8), agg=("sum", "max", "min", "first", "last")),
           _chunks,
           lambda rng, p: [[random_ints(rng, n_max=13)]], lambda p: [[[]], [[5]]]),
    Family("fit-range", "fit_range", param_grid(lo=(-10, -5, 0, 3, 5), width=(2, 5, 10), mode=("clamp", "keep")),
           _clamp,
           lambda rng, p: [[random_ints(rng, -20, 25)]], lambda p: [[[]], [[p["lo"], p["lo"] + p["width"]]]]),
    Family("pick-every", "pick_every", param_grid(start=range(0, 5), k=range(2, 8)), _every_kth,
           lambda rng, p: [[random_ints(rng, n_max=16)]], lambda p: [[[]], [list(range(20))]]),
    Family("base-digits", "base_digits", param_grid(b=range(2, 17), mode=("sum", "count")), _digits_base,
           lambda rng, p: [[rng.randint(0, 10 ** rng.randint(1, 9))]], lambda p: [[0], [1], [p["b"]]]),
    Family("to-base", "to_base",
           param_grid(b=tuple(range(2, 17)) + tuple(range(20, 37, 2)) + (17, 18, 19, 21, 23, 25, 27)),
           _to_base, lambda rng, p: [[rng.randint(0, 10 ** rng.randint(1, 9))]],
           lambda p: [[0], [p["b"] - 1], [p["b"]]]),
    Family("sequence", "sequence", param_grid(a0=(0, 1, 2), a1=(1, 3), x=(1, 2), y=(1, -1, 2)), _recurrence,
           lambda rng, p: [[rng.randint(2, 30)]], lambda p: [[0], [1], [2]]),
    Family("window-values", "window_values",
           param_grid(w=range(2, 7), agg=("max", "min", "sum", "range", "evens", "first")), _windows,
           lambda rng, p: [[random_ints(rng, n_max=12)]],
           lambda p: [[[]], [list(range(p["w"] - 1))], [list(range(p["w"]))]]),
    Family("count-runs", "count_runs", param_grid(c=tuple("abxyz"), m=range(1, 7)), _runs,
           lambda rng, p: [[random_chars(rng, p["c"] * 4 + "ab-", 20)]], lambda p: [[""], [p["c"] * p["m"]]]),
    Family("mask-chars", "mask_chars",
           param_grid(kind=("vowel", "consonant", "digit"), c=tuple("*#_?-"), upper=(False, True)),
           _replace_chars, lambda rng, p: [[random_chars(rng, "abeiouxyzAEBQ0123 !", 16)]], lambda p: [[""]]),
    Family("pick-words", "pick_words", param_grid(x=tuple("abcdefghei"[:10]), mode=("starts", "ends", "contains")),
           _filter_words, lambda rng, p: [[random_text(rng).split()]], lambda p: [[[]], [[p["x"].upper(), "", "zz"]]]),
    Family("count-pairs", "count_pairs", param_grid(d=range(0, 10), mode=("diff", "sum", "close")), _pairs,
           lambda rng, p: [[random_ints(rng, -8, 12, n_max=10)]], lambda p: [[[]], [[p["d"]]]]),
    Family("kth-value", "kth_value", param_grid(k=range(1, 8), order=("largest", "smallest"), distinct=(True, False)),
           _kth,
           lambda rng, p: [[random_ints(rng, -9, 9, n_max=10)]], lambda p: [[[]], [[4, 4, 4, 4, 4, 4, 4, 4]]]),
    Family("by-residue", "by_residue", param_grid(m=range(2, 12), mode=("count", "sum", "max")), _residues,
           lambda rng, p: [[random_ints(rng, -40, 40)]], lambda p: [[[]], [[-1, p["m"]]]]),
    Family("steps-to-one", "steps_to_one", param_grid(d=range(2, 12), mode=("all", "div", "sub")), _steps,
           lambda rng, p: [[rng.randint(1, 5000)]], lambda p: [[1], [p["d"]], [p["d"] + 1]]),
    Family("weighted-sum", "weighted_sum", param_grid(o=range(0, 10), form=("plain", "alt", "square")), _weighted,
           lambda rng, p: [[random_ints(rng, -9, 9, n_max=8)]], lambda p: [[[]], [[1]]]),
    Family("interleave", "interleave", param_grid(k=range(1, 7), first=("a", "b"), rest=("append", "drop")),
           _interleave,
           lambda rng, p: [[random_ints(rng, 0, 9, n_max=9), random_ints(rng, 10, 19, n_max=9)]],
           lambda p: [[[], []], [[1, 2, 3], []]]),
    Family("longest-run", "longest_run", param_grid(t=range(-3, 7), cmp=("<", ">=", "==")), _longest_run,
           lambda rng, p: [[random_ints(rng, -6, 9, n_max=14)]], lambda p: [[[]], [[p["t"]] * 3]]),
    Family("squeeze", "squeeze", param_grid(m=range(2, 7), fmt=("cn", "nc", "paren"), _v=(0, 1)), _compress,
           lambda rng, p: [[random_chars(rng, "aaabbbc-" if p["_v"] else "xxxyyz", 20)]],
           lambda p: [[""], ["a" * p["m"]]]),
    Family("diagonal", "diagonal", param_grid(o=range(-3, 4), anti=(False, True), agg=("sum", "max")), _diagonal,
           lambda rng, p: [[_matrix(rng, rng.randint(1, 5))]],
           lambda p: [[[]], [[[5]]]]),
    Family("pascal", "pascal", param_grid(m=range(2, 17), mode=("row", "count")), _pascal,
           lambda rng, p: [[rng.randint(0, 30)]], lambda p: [[0], [1], [p["m"]]]),
    Family("nth-special", "nth_special", param_grid(k=range(2, 12), b=(10, 2, 16)), _digit_sum_nth,
           lambda rng, p: [[rng.randint(1, 60)]], lambda p: [[1], [2]]),
    Family("gcd-pairs", "gcd_pairs", param_grid(g=range(1, 11), mode=("eq", "ge", "div")), _gcd_pairs,
           lambda rng, p: [[[rng.randint(1, 60) for _ in range(rng.randint(0, 9))]]], lambda p: [[[]], [[p["g"]] * 2]]),
    Family("letter-score", "letter_score", param_grid(v=range(0, 5), u=range(1, 7)), _letter_score,
           lambda rng, p: [[random_chars(rng, "abeiozAEZ19 !é", 14)]], lambda p: [[""], ["aA"]]),
    Family("cap-repeats", "cap_repeats", param_grid(k=range(1, 11), keep=("first", "last", "count")), _cap_counts,
           lambda rng, p: [[random_ints(rng, 0, 5, n_max=14)]], lambda p: [[[]], [[1] * 12]]),
    Family("climb", "climb", param_grid(steps=((1, 2), (1, 3), (2, 3), (1, 4), (2, 5), (1, 2, 3), (1, 3, 5), (2, 3, 7),
                                         (1, 5), (3, 4), (1, 2, 5), (2, 4, 5), (3, 5), (1, 6), (4, 6)),
                                  mode=("ways", "fewest")), _climb,
           lambda rng, p: [[rng.randint(0, 40)]], lambda p: [[0], [1], [2]]),
    Family("bracket-info", "bracket_info",
           param_grid(pair=("()", "[]", "{}", "<>"), mode=("depth", "groups"), bad=(-1, 0, 99)),
           _brackets, lambda rng, p: [[_bracket_text(rng, p)]],
           lambda p: [[""], [p["pair"] * 2], [p["pair"][1] + p["pair"][0]]]),
)
FAMILIES = BASE_FAMILIES + code_gen_long.LONG_FAMILIES
# Held out whole by the structural split: 8 of the 38 families, 5 short and 3 long ones, each built from what train
# families do (count-runs: longest-run's and squeeze's run scans; kth-value: sorting as in rotate / chunk-values;
# gcd-pairs: count-pairs' pair loop with math.gcd; squeeze: count-runs' runs rewritten as text; interleave: chunk and
# slice arithmetic; edit-distance: grid-paths' and knapsack's DP tables over two strings; components: bfs-distance's
# graph input, grouped; word-wrap: pick-words' and count-words' word scans, greedily packed).
HELDOUT_FAMILIES = ("count-runs", "kth-value", "gcd-pairs", "squeeze", "interleave", "edit-distance", "components",
                    "word-wrap")


def _normalise(v):
    """A value as the sandbox returns it: JSON (tuples as lists)."""
    return json.loads(json.dumps(v))


def _reference_fn(source: str, entry_point: str) -> Callable:
    ns: dict = {"__name__": "reference"}
    exec(compile(source, "<reference>", "exec"), ns)  # our own reference code, not the model's
    return ns[entry_point]


def make_task(family: Family, variant: int, params: dict, seed: int = SEED) -> dict | None:
    """One family's task for one parameter set (module docstring): the edge cases, then random inputs until there
    are MIN_TESTS distinct tests with at least two distinct expected values (a constant answer must fail), at most
    MAX_DRAWS draws; None when the tests stay that weak."""
    task_id = f"{family.name}-{variant:02d}"
    prompt, source = family.make(params)
    fn = _reference_fn(source, family.entry_point)
    rng = random.Random(f"{seed}/{task_id}")
    tests, seen, answers = [], set(), set()

    def add(args):
        key = json.dumps(args)
        if key not in seen:
            seen.add(key)
            args = json.loads(key)
            expected = _normalise(fn(*json.loads(key)))
            answers.add(json.dumps(expected))
            tests.append((args, expected))

    for args in family.edge(params):
        add(args)
    draws = 0
    while draws < MAX_DRAWS and (len(tests) < MIN_TESTS or len(answers) < 2):
        for args in family.inputs(rng, params):
            add(args)
        draws += 1
    if len(answers) < 2 or len(tests) < 4:
        return None
    return dict(id=task_id, entry_point=family.entry_point, prompt=prompt, reference=source, tests=tuple(tests),
                template=family.name)


def generate(seed: int = SEED, families: tuple = FAMILIES) -> list[dict]:
    """Every family's tasks, ordered by variant and then by family (module docstring); a parameter set whose tests
    stay weak (`make_task`) is left out."""
    rows = max(len(f.grid) for f in families)
    tasks = (make_task(f, v, f.grid[v], seed) for v in range(rows) for f in families if v < len(f.grid))
    return [t for t in tasks if t is not None]
