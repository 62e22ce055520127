"""Coding problems with unit tests and reference solutions (written for jaxagent).

Each entry: id, entry_point (the function to define), prompt (the problem statement shown to the
model), reference (a correct solution), tests (a tuple of (args, expected) pairs; args is the list of
positional arguments, expected the JSON value the function must return; tuples and sets are compared
as lists, sets sorted).
"""

CODE_TASKS = (
    dict(
        id="pair-sum",
        entry_point="pair_sum",
        prompt=("Write `pair_sum(nums, target)` that returns the indices [i, j] (i < j) of the first pair "
                "of numbers in `nums` that adds up to `target`, where pairs are ordered by j and then by i. "
                "Return [] if no pair exists."),
        reference='''
def pair_sum(nums, target):
    seen = {}
    for j, x in enumerate(nums):
        if target - x in seen:
            return [seen[target - x], j]
        seen.setdefault(x, j)
    return []
''',
        tests=(
            ([[2, 7, 11, 15], 9], [0, 1]),
            ([[3, 2, 4], 6], [1, 2]),
            ([[3, 3], 6], [0, 1]),
            ([[1, 2, 3], 7], []),
            ([[], 0], []),
            ([[5, -2, 4, 1, 1], 2], [1, 2]),
            ([[1, 5, 1, 5], 10], [1, 3]),
            ([[0, 4, 3, 0], 0], [0, 3]),
        ),
    ),
    dict(
        id="palindrome",
        entry_point="is_palindrome",
        prompt=("Write `is_palindrome(s)` that returns True if the string `s` reads the same forwards and "
                "backwards when only letters and digits are kept and case is ignored, else False."),
        reference='''
def is_palindrome(s):
    kept = [c.lower() for c in s if c.isalnum()]
    return kept == kept[::-1]
''',
        tests=(
            (["A man, a plan, a canal: Panama"], True),
            (["race a car"], False),
            ([""], True),
            ([" .,"], True),
            (["No 'x' in Nixon"], True),
            (["0P"], False),
            (["abcba"], True),
        ),
    ),
    dict(
        id="run-length",
        entry_point="run_length_encode",
        prompt=("Write `run_length_encode(s)` that compresses runs of repeated characters: each run becomes "
                "the character followed by the run length, e.g. 'aaabcc' -> 'a3b1c2'. The empty string "
                "encodes to ''."),
        reference='''
def run_length_encode(s):
    out = []
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(s[i] + str(j - i))
        i = j
    return "".join(out)
''',
        tests=(
            (["aaabcc"], "a3b1c2"),
            ([""], ""),
            (["a"], "a1"),
            (["abc"], "a1b1c1"),
            (["zzzzzzzzzzzz"], "z12"),
            (["aabbaa"], "a2b2a2"),
        ),
    ),
    dict(
        id="fizzbuzz",
        entry_point="fizzbuzz",
        prompt=("Write `fizzbuzz(n)` that returns a list of strings for 1..n: 'Fizz' for multiples of 3, "
                "'Buzz' for multiples of 5, 'FizzBuzz' for multiples of both, and the number itself "
                "otherwise."),
        reference='''
def fizzbuzz(n):
    out = []
    for i in range(1, n + 1):
        s = ("Fizz" if i % 3 == 0 else "") + ("Buzz" if i % 5 == 0 else "")
        out.append(s or str(i))
    return out
''',
        tests=(
            ([1], ["1"]),
            ([0], []),
            ([5], ["1", "2", "Fizz", "4", "Buzz"]),
            ([15], ["1", "2", "Fizz", "4", "Buzz", "Fizz", "7", "8", "Fizz", "Buzz", "11", "Fizz", "13",
                    "14", "FizzBuzz"]),
        ),
    ),
    dict(
        id="merge-intervals",
        entry_point="merge_intervals",
        prompt=("Write `merge_intervals(intervals)` that takes a list of [start, end] pairs (start <= end, "
                "in any order) and returns the merged list of disjoint intervals sorted by start. "
                "Intervals that touch (end == next start) are merged."),
        reference='''
def merge_intervals(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out
''',
        tests=(
            ([[[1, 3], [2, 6], [8, 10], [15, 18]]], [[1, 6], [8, 10], [15, 18]]),
            ([[[1, 4], [4, 5]]], [[1, 5]]),
            ([[]], []),
            ([[[5, 7], [1, 2]]], [[1, 2], [5, 7]]),
            ([[[1, 10], [2, 3], [4, 5]]], [[1, 10]]),
            ([[[3, 3]]], [[3, 3]]),
        ),
    ),
    dict(
        id="common-prefix",
        entry_point="longest_common_prefix",
        prompt=("Write `longest_common_prefix(words)` that returns the longest string that is a prefix of "
                "every string in the list `words` ('' for an empty list)."),
        reference='''
def longest_common_prefix(words):
    if not words:
        return ""
    prefix = words[0]
    for w in words[1:]:
        while not w.startswith(prefix):
            prefix = prefix[:-1]
    return prefix
''',
        tests=(
            ([["flower", "flow", "flight"]], "fl"),
            ([["dog", "racecar", "car"]], ""),
            ([[]], ""),
            ([["alone"]], "alone"),
            ([["same", "same"]], "same"),
            ([["ab", "a"]], "a"),
        ),
    ),
    dict(
        id="brackets",
        entry_point="balanced",
        prompt=("Write `balanced(s)` that returns True if every bracket in `s` ('()', '[]', '{}') is closed "
                "by the matching bracket in the right order; other characters are ignored."),
        reference='''
def balanced(s):
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for c in s:
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack
''',
        tests=(
            (["()[]{}"], True),
            (["(]"], False),
            (["([)]"], False),
            (["{[]}"], True),
            ([""], True),
            (["(("], False),
            (["a(b[c]d)e"], True),
            (["))"], False),
        ),
    ),
    dict(
        id="roman",
        entry_point="roman_to_int",
        prompt=("Write `roman_to_int(s)` that converts a valid Roman numeral (I, V, X, L, C, D, M, with "
                "subtractive forms such as IV and CM) between 1 and 3999 to an integer."),
        reference='''
def roman_to_int(s):
    val = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, c in enumerate(s):
        v = val[c]
        if i + 1 < len(s) and val[s[i + 1]] > v:
            total -= v
        else:
            total += v
    return total
''',
        tests=(
            (["III"], 3),
            (["IV"], 4),
            (["IX"], 9),
            (["LVIII"], 58),
            (["MCMXCIV"], 1994),
            (["MMMCMXCIX"], 3999),
            (["XL"], 40),
        ),
    ),
    dict(
        id="islands",
        entry_point="count_islands",
        prompt=("Write `count_islands(grid)` where `grid` is a list of strings of '1' (land) and '0' "
                "(water); return the number of islands, i.e. groups of land cells connected "
                "horizontally or vertically."),
        reference='''
def count_islands(grid):
    rows = len(grid)
    cols = len(grid[0]) if rows else 0
    seen = set()
    count = 0
    for r in range(rows):
        for c in range(cols):
            if grid[r][c] == "1" and (r, c) not in seen:
                count += 1
                stack = [(r, c)]
                seen.add((r, c))
                while stack:
                    y, x = stack.pop()
                    for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                        if 0 <= ny < rows and 0 <= nx < cols and grid[ny][nx] == "1" and (ny, nx) not in seen:
                            seen.add((ny, nx))
                            stack.append((ny, nx))
    return count
''',
        tests=(
            ([["11110", "11010", "11000", "00000"]], 1),
            ([["11000", "11000", "00100", "00011"]], 3),
            ([[]], 0),
            ([["0"]], 0),
            ([["1"]], 1),
            ([["101", "010", "101"]], 5),
        ),
    ),
    dict(
        id="rotate",
        entry_point="rotate_matrix",
        prompt=("Write `rotate_matrix(m)` that returns the square matrix `m` (a list of rows) rotated "
                "90 degrees clockwise, as a new list of lists."),
        reference='''
def rotate_matrix(m):
    return [list(row) for row in zip(*m[::-1])]
''',
        tests=(
            ([[[1, 2], [3, 4]]], [[3, 1], [4, 2]]),
            ([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], [[7, 4, 1], [8, 5, 2], [9, 6, 3]]),
            ([[[5]]], [[5]]),
            ([[]], []),
        ),
    ),
    dict(
        id="word-freq",
        entry_point="top_words",
        prompt=("Write `top_words(text, k)` that splits `text` into words (maximal runs of letters, "
                "lower-cased) and returns the `k` most frequent as [word, count] pairs, sorted by "
                "count descending and then alphabetically."),
        reference='''
import re
from collections import Counter

def top_words(text, k):
    counts = Counter(w.lower() for w in re.findall(r"[A-Za-z]+", text))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [[w, c] for w, c in ranked[:k]]
''',
        tests=(
            (["the cat and the hat", 2], [["the", 2], ["and", 1]]),
            (["B a b A c", 3], [["a", 2], ["b", 2], ["c", 1]]),
            (["", 3], []),
            (["one, two; two... three three three!", 5], [["three", 3], ["two", 2], ["one", 1]]),
            (["x", 0], []),
        ),
    ),
    dict(
        id="nth-prime",
        entry_point="nth_prime",
        prompt="Write `nth_prime(n)` that returns the n-th prime number (nth_prime(1) == 2), for 1 <= n <= 10000.",
        reference='''
def nth_prime(n):
    limit = 20
    while True:
        sieve = bytearray([1]) * (limit + 1)
        sieve[0] = sieve[1] = 0
        for i in range(2, int(limit ** 0.5) + 1):
            if sieve[i]:
                sieve[i * i::i] = bytearray(len(range(i * i, limit + 1, i)))
        primes = [i for i, p in enumerate(sieve) if p]
        if len(primes) >= n:
            return primes[n - 1]
        limit *= 2
''',
        tests=(
            ([1], 2),
            ([2], 3),
            ([6], 13),
            ([25], 97),
            ([1000], 7919),
            ([10000], 104729),
        ),
    ),
    dict(
        id="flatten",
        entry_point="flatten",
        prompt=("Write `flatten(xs)` that takes an arbitrarily nested list of integers and returns the flat "
                "list of its integers in left-to-right order."),
        reference='''
def flatten(xs):
    out = []
    for x in xs:
        if isinstance(x, list):
            out.extend(flatten(x))
        else:
            out.append(x)
    return out
''',
        tests=(
            ([[1, [2, [3, 4]], 5]], [1, 2, 3, 4, 5]),
            ([[]], []),
            ([[[[[]]]]], []),
            ([[[1], [], [2, [3]]]], [1, 2, 3]),
            ([[7]], [7]),
        ),
    ),
    dict(
        id="coin-change",
        entry_point="min_coins",
        prompt=("Write `min_coins(coins, amount)` that returns the fewest coins (each denomination in "
                "`coins` usable any number of times) that sum to `amount`, or -1 if it is impossible. "
                "min_coins(coins, 0) is 0."),
        reference='''
def min_coins(coins, amount):
    inf = float("inf")
    best = [0] + [inf] * amount
    for a in range(1, amount + 1):
        for c in coins:
            if c <= a and best[a - c] + 1 < best[a]:
                best[a] = best[a - c] + 1
    return -1 if best[amount] == inf else best[amount]
''',
        tests=(
            ([[1, 2, 5], 11], 3),
            ([[2], 3], -1),
            ([[1], 0], 0),
            ([[1, 3, 4], 6], 2),
            ([[5, 10], 1], -1),
            ([[186, 419, 83, 408], 6249], 20),
        ),
    ),
    dict(
        id="lis",
        entry_point="lis_length",
        prompt=("Write `lis_length(nums)` that returns the length of the longest strictly increasing "
                "subsequence of `nums`."),
        reference='''
import bisect

def lis_length(nums):
    tails = []
    for x in nums:
        i = bisect.bisect_left(tails, x)
        if i == len(tails):
            tails.append(x)
        else:
            tails[i] = x
    return len(tails)
''',
        tests=(
            ([[10, 9, 2, 5, 3, 7, 101, 18]], 4),
            ([[0, 1, 0, 3, 2, 3]], 4),
            ([[7, 7, 7, 7]], 1),
            ([[]], 0),
            ([[5, 4, 3, 2, 1]], 1),
            ([[1, 3, 6, 7, 9, 4, 10, 5, 6]], 6),
        ),
    ),
    dict(
        id="spiral",
        entry_point="spiral_order",
        prompt=("Write `spiral_order(m)` that returns the elements of the matrix `m` (a list of equal-length "
                "rows) in clockwise spiral order, starting at the top-left corner."),
        reference='''
def spiral_order(m):
    out = []
    m = [list(r) for r in m]
    while m and m[0]:
        out.extend(m.pop(0))
        m = [list(r) for r in zip(*m)][::-1]
    return out
''',
        tests=(
            ([[[1, 2, 3], [4, 5, 6], [7, 8, 9]]], [1, 2, 3, 6, 9, 8, 7, 4, 5]),
            ([[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]], [1, 2, 3, 4, 8, 12, 11, 10, 9, 5, 6, 7]),
            ([[]], []),
            ([[[1]]], [1]),
            ([[[1], [2], [3]]], [1, 2, 3]),
        ),
    ),
)
