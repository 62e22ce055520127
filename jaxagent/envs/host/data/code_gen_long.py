"""Longer generated coding families (written for jaxagent; not DeepCoder): dynamic programming, graphs and string
processing whose reference programs run to 20-35 lines, closer to competitive-programming solutions than the
one-to-ten-line families of `code_gen`. Each is a `code_family.Family` like those: a parameter grid, a prompt and
a reference with the parameters written in, random inputs; `code_gen.generate` makes their tasks and tests.

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import random

from jaxagent.envs.host.data.code_family import Family, param_grid, random_chars, random_text


def _edit_distance(p):
    ins, dele, sub, fold = p["ins"], p["dele"], p["sub"], p["fold"]
    case = (" Letters are compared ignoring case." if fold else " Letters are compared exactly (case matters).")
    lower = "    a, b = a.lower(), b.lower()\n" if fold else ""
    return (f"Write `edit_cost(a, b)` that returns the cheapest cost of turning the string `a` into the string `b` "
            f"with these operations: inserting a character costs {ins}, deleting one costs {dele}, and replacing one "
            f"by another costs {sub}.{case}",
            "def edit_cost(a, b):\n" + lower +
            "    n, m = len(a), len(b)\n"
            "    cost = [[0] * (m + 1) for _ in range(n + 1)]\n"
            "    for i in range(1, n + 1):\n"
            f"        cost[i][0] = cost[i - 1][0] + {dele}\n"
            "    for j in range(1, m + 1):\n"
            f"        cost[0][j] = cost[0][j - 1] + {ins}\n"
            "    for i in range(1, n + 1):\n"
            "        for j in range(1, m + 1):\n"
            "            if a[i - 1] == b[j - 1]:\n"
            "                cost[i][j] = cost[i - 1][j - 1]\n"
            "                continue\n"
            f"            delete = cost[i - 1][j] + {dele}\n"
            f"            insert = cost[i][j - 1] + {ins}\n"
            f"            replace = cost[i - 1][j - 1] + {sub}\n"
            "            best = delete\n"
            "            if insert < best:\n"
            "                best = insert\n"
            "            if replace < best:\n"
            "                best = replace\n"
            "            cost[i][j] = best\n"
            "    return cost[n][m]\n")


def _grid_paths(p):
    diag, mod = p["diag"], p["mod"]
    moves = "right, down or diagonally down-right" if diag else "right or down"
    extra = ("            if r > 0 and c > 0:\n"
             "                total += ways[r - 1][c - 1]\n") if diag else ""
    return (f"Write `count_paths(grid)` for a grid given as a list of equally long strings, '.' a free cell and '#' a "
            f"blocked one. Return the number of paths from the top-left to the bottom-right cell that move {moves} "
            f"one cell at a time through free cells only, modulo {mod} (0 when either corner is blocked or the grid "
            "is empty).",
            "def count_paths(grid):\n"
            "    if not grid or not grid[0]:\n"
            "        return 0\n"
            "    rows, cols = len(grid), len(grid[0])\n"
            "    ways = [[0] * cols for _ in range(rows)]\n"
            "    for r in range(rows):\n"
            "        for c in range(cols):\n"
            "            if grid[r][c] == '#':\n"
            "                ways[r][c] = 0\n"
            "                continue\n"
            "            if r == 0 and c == 0:\n"
            "                ways[r][c] = 1\n"
            "                continue\n"
            "            total = 0\n"
            "            if r > 0:\n"
            "                total += ways[r - 1][c]\n"
            "            if c > 0:\n"
            "                total += ways[r][c - 1]\n"
            + extra +
            f"            ways[r][c] = total % {mod}\n"
            "    return ways[rows - 1][cols - 1]\n")


def _bfs(p):
    directed, mode, start = p["directed"], p["mode"], p["start"]
    edges = "a directed edge from u to v" if directed else "an undirected edge between u and v"
    back = "" if directed else "        adj[v].append(u)\n"
    count = ("    count = 0\n"
             "    for node in range(n):\n"
             "        if {test}:\n"
             "            count += 1\n"
             "    return count\n")
    what, ret = {
        "target": (f"the fewest edges on a path from node {start} to node n - 1 (-1 if there is none)",
                   "    answer = dist[n - 1]\n    if answer is None:\n        answer = -1\n    return answer\n"),
        "far": (f"the largest distance (in edges) from node {start} to a node it can reach",
                "    best = 0\n    for d in dist:\n        if d is not None and d > best:\n            best = d\n"
                "    return best\n"),
        "reach2": (f"how many nodes other than node {start} can be reached from it in at most 2 edges",
                   count.format(test=f"node != {start} and dist[node] is not None and dist[node] <= 2")),
        "reach3": (f"how many nodes other than node {start} can be reached from it in at most 3 edges",
                   count.format(test=f"node != {start} and dist[node] is not None and dist[node] <= 3")),
        "unreached": (f"how many nodes cannot be reached from node {start}",
                      count.format(test="dist[node] is None")),
    }[mode]
    return (f"Write `hops(n, edges)` for a graph of nodes 0, 1, ..., n - 1 (n > {start}) whose `edges` is a list of "
            f"pairs [u, v], each {edges}; a pair naming a node outside 0..n - 1 is ignored. Return {what}.",
            "from collections import deque\n\n\n"
            "def hops(n, edges):\n"
            "    adj = [[] for _ in range(n)]\n"
            "    for u, v in edges:\n"
            "        if not (0 <= u < n and 0 <= v < n):\n"
            "            continue\n"
            "        adj[u].append(v)\n" + back +
            "    dist = [None] * n\n"
            f"    dist[{start}] = 0\n"
            f"    queue = deque([{start}])\n"
            "    while queue:\n"
            "        node = queue.popleft()\n"
            "        for nxt in adj[node]:\n"
            "            if dist[nxt] is None:\n"
            "                dist[nxt] = dist[node] + 1\n"
            "                queue.append(nxt)\n" + ret)


def _components(p):
    k, what = p["k"], p["what"]
    ask = (f"how many connected components have at least {k} nodes" if what == "count" else
           f"how many nodes lie in connected components of at least {k} nodes")
    total = "        total += 1\n" if what == "count" else "        total += size[node]\n"
    return (f"Write `big_groups(n, pairs)` for nodes 0, 1, ..., n - 1 and a list `pairs` of [u, v] meaning u and v "
            f"are connected (the relation is symmetric and transitive; a node is connected to itself). Return {ask}.",
            "def big_groups(n, pairs):\n"
            "    parent = list(range(n))\n"
            "    size = [1] * n\n\n"
            "    def find(x):\n"
            "        while parent[x] != x:\n"
            "            parent[x] = parent[parent[x]]\n"
            "            x = parent[x]\n"
            "        return x\n\n"
            "    for u, v in pairs:\n"
            "        ru, rv = find(u), find(v)\n"
            "        if ru == rv:\n"
            "            continue\n"
            "        if size[ru] < size[rv]:\n"
            "            ru, rv = rv, ru\n"
            "        parent[rv] = ru\n"
            "        size[ru] += size[rv]\n"
            "    total = 0\n"
            "    for node in range(n):\n"
            "        if find(node) != node:\n"
            "            continue\n"
            f"        if size[node] < {k}:\n"
            "            continue\n"
            + total +
            "    return total\n")


def _knapsack(p):
    cap, repeat = p["cap"], p["repeat"]
    rule = "each item may be taken any number of times" if repeat else "each item may be taken at most once"
    order = "range(w, cap + 1)" if repeat else "range(cap, w - 1, -1)"
    return (f"Write `best_pack(items)` where `items` is a list of [weight, value] pairs of positive integers. Return "
            f"[v, k]: v the largest total value of items whose total weight is at most {cap} ({rule}), and k the "
            "fewest items that reach the value v within that weight.",
            "def best_pack(items):\n"
            f"    cap = {cap}\n"
            "    best = [0] * (cap + 1)\n"
            "    used = [0] * (cap + 1)\n"
            "    for item in items:\n"
            "        w, value = item[0], item[1]\n"
            "        if w <= 0 or w > cap:\n"
            "            continue\n"
            f"        for c in {order}:\n"
            "            value_here = best[c - w] + value\n"
            "            count_here = used[c - w] + 1\n"
            "            if value_here > best[c]:\n"
            "                best[c] = value_here\n"
            "                used[c] = count_here\n"
            "            elif value_here == best[c] and count_here < used[c]:\n"
            "                used[c] = count_here\n"
            "    answer, fewest = 0, 0\n"
            "    for c in range(cap + 1):\n"
            "        if best[c] > answer or (best[c] == answer and used[c] < fewest):\n"
            "            answer, fewest = best[c], used[c]\n"
            "    return [answer, fewest]\n")


def _evaluate(p):
    flat, mod = p["flat"], p["mod"]
    rule = ("every operator applies strictly from left to right (no precedence: 2 + 3 * 4 is 20)" if flat else
            "* binds tighter than + and -, which apply from left to right")
    term = ("    def term():\n"
            "        return atom()\n") if flat else (
            "    def term():\n"
            "        value = atom()\n"
            "        while peek() == '*':\n"
            "            take()\n"
            "            value = value * atom()\n"
            "        return value\n")
    ops = "'+-*'" if flat else "'+-'"
    return (f"Write `evaluate(expr)` for a string of non-negative integers, the operators +, - and *, parentheses and "
            f"spaces, where {rule}. Return the value modulo {mod} (Python's %, never negative).",
            "def evaluate(expr):\n"
            "    tokens = []\n"
            "    i = 0\n"
            "    while i < len(expr):\n"
            "        ch = expr[i]\n"
            "        if ch.isdigit():\n"
            "            j = i\n"
            "            while j < len(expr) and expr[j].isdigit():\n"
            "                j += 1\n"
            "            tokens.append(int(expr[i:j]))\n"
            "            i = j\n"
            "            continue\n"
            "        if ch in '+-*()':\n"
            "            tokens.append(ch)\n"
            "        i += 1\n"
            "    pos = [0]\n\n"
            "    def peek():\n"
            "        return tokens[pos[0]] if pos[0] < len(tokens) else None\n\n"
            "    def take():\n"
            "        pos[0] += 1\n"
            "        return tokens[pos[0] - 1]\n\n"
            "    def atom():\n"
            "        if peek() == '(':\n"
            "            take()\n"
            "            value = expression()\n"
            "            take()\n"
            "            return value\n"
            "        return take()\n\n"
            + term + "\n"
            "    def expression():\n"
            "        value = term()\n"
            f"        while peek() is not None and peek() in {ops}:\n"
            "            op = take()\n"
            "            right = term()\n"
            "            value = value + right if op == '+' else value - right if op == '-' else value * right\n"
            "        return value\n\n"
            f"    return expression() % {mod}\n")


def _topo(p):
    mode, base = p["mode"], p["base"]
    names = "1, 2, ..., n" if base else "0, 1, ..., n - 1"
    what = {"smallest": "the order of all nodes that respects every pair and, among those, puts the smallest "
                        "available node first at every step; [] if no order exists (a cycle)",
            "largest": "the order of all nodes that respects every pair and, among those, puts the largest available "
                       "node first at every step; [] if no order exists (a cycle)",
            "levels": "the number of nodes on the longest chain u1 before u2 before ... of the pairs (1 without "
                      "pairs); -1 if the pairs contain a cycle"}[mode]
    sign = "-" if mode == "largest" else ""
    tail = ("    return order if len(order) == n else []\n" if mode != "levels" else
            "    if len(order) < n:\n        return -1\n    return max(depth) if depth else 0\n")
    return (f"Write `schedule(n, pairs)` for n tasks numbered {names}, where each [u, v] in the list `pairs` says "
            f"that task u comes before task v. Return {what}.",
            "import heapq\n\n\n"
            "def schedule(n, pairs):\n"
            f"    base = {base}\n"
            "    after = [[] for _ in range(n)]\n"
            "    needs = [0] * n\n"
            "    for u, v in pairs:\n"
            "        after[u - base].append(v - base)\n"
            "        needs[v - base] += 1\n"
            "    depth = [1] * n\n"
            f"    ready = [{sign}i for i in range(n) if needs[i] == 0]\n"
            "    heapq.heapify(ready)\n"
            "    order = []\n"
            "    while ready:\n"
            f"        node = {sign}heapq.heappop(ready)\n"
            "        order.append(node + base)\n"
            "        for nxt in after[node]:\n"
            "            depth[nxt] = max(depth[nxt], depth[node] + 1)\n"
            "            needs[nxt] -= 1\n"
            "            if needs[nxt] == 0:\n"
            f"                heapq.heappush(ready, {sign}nxt)\n" + tail)


def _wrap(p):
    width, mode = p["width"], p["mode"]
    what = {"lines": "the list of lines", "count": "the number of lines",
            "slack": f"the sum, over every line but the last, of ({width} - its length) squared"}[mode]
    ret = {"lines": "    return lines\n", "count": "    return len(lines)\n",
           "slack": f"    return sum(({width} - len(line)) ** 2 for line in lines[:-1])\n"}[mode]
    return (f"Write `wrap(text)` that breaks the words of the string `text` (separated by whitespace) into lines of "
            f"at most {width} characters. A word longer than {width} characters is first cut into pieces of {width} "
            "characters (the last piece may be shorter). Then, greedily, each line takes as many of the next pieces "
            f"as fit, separated by single spaces. Return {what} ([] or 0 for a text without words).",
            "def wrap(text):\n"
            f"    width = {width}\n"
            "    pieces = []\n"
            "    for word in text.split():\n"
            "        while len(word) > width:\n"
            "            pieces.append(word[:width])\n"
            "            word = word[width:]\n"
            "        if word:\n"
            "            pieces.append(word)\n"
            "    lines = []\n"
            "    current = ''\n"
            "    for piece in pieces:\n"
            "        if not current:\n"
            "            current = piece\n"
            "            continue\n"
            "        if len(current) + 1 + len(piece) <= width:\n"
            "            current = current + ' ' + piece\n"
            "            continue\n"
            "        lines.append(current)\n"
            "        current = piece\n"
            "    if current:\n"
            "        lines.append(current)\n" + ret)


def _graph(rng: random.Random, n_min: int = 2, n_max: int = 8, base: int = 0) -> list:
    n = rng.randint(n_min, n_max)
    edges = [[rng.randrange(n) + base, rng.randrange(n) + base] for _ in range(rng.randint(0, 2 * n))]
    return [n, [e for e in edges if e[0] != e[1]]]


def _expression(rng: random.Random, depth: int = 0) -> str:
    if depth > 2 or rng.random() < 0.35:
        return str(rng.randint(0, 20))
    left, right = _expression(rng, depth + 1), _expression(rng, depth + 1)
    text = f"{left} {rng.choice('+-*')} {right}"
    return f"({text})" if rng.random() < 0.4 else text


def _grid_text(rng: random.Random) -> list:
    rows, cols = rng.randint(1, 6), rng.randint(1, 6)
    return ["".join("#" if rng.random() < 0.2 else "." for _ in range(cols)) for _ in range(rows)]


def _dag(rng: random.Random, base: int, cyclic: bool) -> list:
    n = rng.randint(2, 8)
    pairs = [[u + base, v + base] for u in range(n) for v in range(u + 1, n) if rng.random() < 0.3]
    rng.shuffle(pairs)
    perm = list(range(n))
    rng.shuffle(perm)
    pairs = [[perm[u - base] + base, perm[v - base] + base] for u, v in pairs]
    if cyclic and pairs:
        u, v = pairs[0]
        pairs.append([v, u])
    return [n, pairs]


LONG_FAMILIES = (
    Family("edit-distance", "edit_cost", param_grid(ins=(1, 2), dele=(1, 2, 3), sub=(1, 2, 3), fold=(False, True)),
           _edit_distance, lambda rng, p: [[random_chars(rng, "abcAB", 8), random_chars(rng, "abcAB", 8)]],
           lambda p: [["", ""], ["", "ab"], ["Ab", "aB"]]),
    Family("grid-paths", "count_paths",
           param_grid(diag=(False, True), mod=(7, 11, 13, 17, 97, 101, 1000, 1009, 10007, 65537, 1000003, 998244353)),
           _grid_paths, lambda rng, p: [[_grid_text(rng)]], lambda p: [[[]], [["."]], [["#."]], [["......"] * 6]]),
    Family("bfs-distance", "hops",
           param_grid(directed=(False, True), mode=("target", "far", "reach2", "reach3", "unreached"), start=(0, 1)),
           _bfs, lambda rng, p: [_graph(rng)], lambda p: [[2, []], [3, [[0, 1], [1, 2]]], [3, [[0, 7], [1, 2]]]]),
    Family("components", "big_groups", param_grid(k=range(1, 9), what=("count", "nodes")), _components,
           lambda rng, p: [_graph(rng, 1, 12)], lambda p: [[1, []], [4, [[0, 1], [2, 3], [1, 0]]]]),
    Family("knapsack", "best_pack", param_grid(cap=range(6, 21), repeat=(False, True)), _knapsack,
           lambda rng, p: [[[[rng.randint(1, 9), rng.randint(1, 30)] for _ in range(rng.randint(0, 6))]]],
           lambda p: [[[]], [[[p["cap"] + 1, 50]]], [[[1, 1], [2, 3]]]]),
    Family("eval-expr", "evaluate", param_grid(flat=(False, True), mod=(7, 10, 13, 97, 100, 1000)), _evaluate,
           lambda rng, p: [[_expression(rng)]], lambda p: [["0"], ["2 + 3 * 4"], ["(1 - 5) * 3"]]),
    Family("topo-order", "schedule", param_grid(mode=("smallest", "largest", "levels"), base=(0, 1)), _topo,
           lambda rng, p: [_dag(rng, p["base"], rng.random() < 0.2)],
           lambda p: [[1, []], [3, [[p["base"], p["base"] + 1]]], [2, [[p["base"], p["base"] + 1],
                                                                        [p["base"] + 1, p["base"]]]]]),
    Family("word-wrap", "wrap", param_grid(width=range(6, 21, 2), mode=("lines", "count", "slack")), _wrap,
           lambda rng, p: [[random_text(rng, 12)]], lambda p: [[""], ["a " * 3], ["extraordinarily long words"]]),
)
