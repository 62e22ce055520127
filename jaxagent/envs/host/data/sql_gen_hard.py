"""The harder generated SQL templates (written for jaxagent): nesting, GROUP BY with HAVING, ordered aggregates,
set operations (INTERSECT, EXCEPT, UNION), two joins (the chain worlds) and self-joins (the worlds whose parent
references another parent), so that the built-in set spans Spider's easy-to-extra questions; and `hardness`, an
approximation of Spider's difficulty rule.

No dimension legend: host-side Python, no arrays.

`templates(world, parents, children, thirds)` yields (template, question, gold SQL, expected rows) as
`sql_gen`'s base templates do: the expected rows computed in Python from the generated rows, the gold query
verified against them by execution in `SQLEnv`. Rows carry their foreign keys as "_parent" (a child's parent, a
third row's child) and "_mentor" (a parent's mentor, None when it has none).
"""
from __future__ import annotations

import re

from jaxagent.envs.host.data.sql_worlds import World, fmt_number, sql_literal, thresholds

HARDNESS = ("easy", "medium", "hard", "extra")


def _mean(xs: list) -> float:
    return sum(xs) / len(xs)


def templates(world: World, parents: list[dict], children: list[dict], thirds: list[dict]):
    """Every harder template that applies to the world's shape (module docstring)."""
    yield from _nested_and_grouped(world, parents, children)
    yield from _set_operations(world, parents, children)
    if world.third is not None:
        yield from _chain(world, parents, children, thirds)
    if world.self_fk:
        yield from _self(world, parents)


def _nested_and_grouped(world: World, parents: list[dict], children: list[dict]):
    P, C, fk, rel = world.parent, world.child, world.fk, world.relation
    by_id = {r["id"]: r for r in parents}
    kids = {r["id"]: [c for c in children if c["_parent"] == r["id"]] for r in parents}
    join = f"{C.name} c JOIN {P.name} p ON c.{fk} = p.id"
    for col in P.nums:
        for x in thresholds([r[col.name] for r in parents]):
            yield ("nested_in", f"List the {C.name_col}s of the {C.plural} {rel} {P.plural} with a {col.phrase} "
                                f"greater than {fmt_number(x)}.",
                   f"SELECT {C.name_col} FROM {C.name} WHERE {fk} IN (SELECT id FROM {P.name} WHERE {col.name} > "
                   f"{fmt_number(x)})", [(c[C.name_col],) for c in children if by_id[c["_parent"]][col.name] > x])
    for col in C.nums:
        yield ("above_group_avg", f"List the {C.name_col}s of the {C.plural} whose {col.phrase} is above the average "
                                  f"{col.phrase} of the {C.plural} {rel} the same {P.singular}.",
               f"SELECT c.{C.name_col} FROM {C.name} c WHERE c.{col.name} > (SELECT AVG(d.{col.name}) FROM {C.name} d "
               f"WHERE d.{fk} = c.{fk})",
               [(c[C.name_col],) for c in children
                if c[col.name] > _mean([d[col.name] for d in kids[c["_parent"]]])])
        for x in thresholds([c[col.name] for c in children]):
            yield ("having_avg", f"Which {P.plural} have {C.plural} {rel} them whose average {col.phrase} is above "
                                 f"{fmt_number(x)}? Give their {P.name_col}s.",
                   f"SELECT p.{P.name_col} FROM {join} GROUP BY p.id HAVING AVG(c.{col.name}) > {fmt_number(x)}",
                   [(r[P.name_col],) for r in parents
                    if kids[r["id"]] and _mean([c[col.name] for c in kids[r["id"]]]) > x])
        top = sorted((r for r in parents if kids[r["id"]]),
                     key=lambda r: (-sum(c[col.name] for c in kids[r["id"]]), r[P.name_col]))[:3]
        yield ("join_order_top", f"List the {P.name_col}s of the 3 {P.plural} whose {C.plural} have the highest total "
                                 f"{col.phrase}, highest first (ties broken by {P.name_col} in alphabetical order).",
               f"SELECT p.{P.name_col} FROM {join} GROUP BY p.id ORDER BY SUM(c.{col.name}) DESC, p.{P.name_col} "
               "LIMIT 3", [(r[P.name_col],) for r in top])
    counts = {r["id"]: len(kids[r["id"]]) for r in parents if kids[r["id"]]}
    for word, fn, pick in (("most", "MAX", max), ("fewest", "MIN", min)):
        best = pick(counts.values())
        yield ("group_extreme_count", f"Which {P.singular} has the {word} {C.plural} {rel} it (counting only "
                                      f"{P.plural} with at least one)? Give its {P.name_col} (all of them if several "
                                      "are tied).",
               f"SELECT p.{P.name_col} FROM {join} GROUP BY p.id HAVING COUNT(*) = (SELECT {fn}(n) FROM (SELECT "
               f"COUNT(*) AS n FROM {C.name} GROUP BY {fk}))",
               [(r[P.name_col],) for r in parents if counts.get(r["id"]) == best])


def _set_operations(world: World, parents: list[dict], children: list[dict]):
    P, C, fk, rel = world.parent, world.child, world.fk, world.relation
    kids = {r["id"]: [c for c in children if c["_parent"] == r["id"]] for r in parents}
    join = f"{C.name} c JOIN {P.name} p ON c.{fk} = p.id"
    col = C.nums[0]
    lo, hi = thresholds([c[col.name] for c in children])
    for cat in C.cats:
        both = ({c[cat.name] for c in children if c[col.name] > hi} &
                {c[cat.name] for c in children if c[col.name] < lo})
        yield ("set_intersect", f"Which {cat.phrase} values occur both among the {C.plural} with a {col.phrase} above "
                                f"{fmt_number(hi)} and among those with a {col.phrase} below {fmt_number(lo)}?",
               f"SELECT {cat.name} FROM {C.name} WHERE {col.name} > {fmt_number(hi)} INTERSECT SELECT {cat.name} "
               f"FROM {C.name} WHERE {col.name} < {fmt_number(lo)}", [(v,) for v in sorted(both)])
    cat = C.cats[0]
    for v, w in zip(cat.values, cat.values[1:] + cat.values[:1]):
        def has(r, value):
            return any(c[cat.name] == value for c in kids[r["id"]])
        yield ("set_except", f"Which {P.plural} have {C.plural} {rel} them whose {cat.phrase} is '{v}', but none "
                             f"whose {cat.phrase} is '{w}'? Give their {P.name_col}s.",
               f"SELECT p.{P.name_col} FROM {join} WHERE c.{cat.name} = {sql_literal(v)} EXCEPT SELECT "
               f"p.{P.name_col} FROM {join} WHERE c.{cat.name} = {sql_literal(w)}",
               [(r[P.name_col],) for r in parents if has(r, v) and not has(r, w)])
    num = C.nums[-1]
    x = thresholds([c[num.name] for c in children])[1]
    for v in cat.values[:3]:
        yield ("set_union", f"List, each once, the {C.name_col}s of the {C.plural} whose {cat.phrase} is '{v}' or "
                            f"whose {num.phrase} is above {fmt_number(x)}.",
               f"SELECT {C.name_col} FROM {C.name} WHERE {cat.name} = {sql_literal(v)} UNION SELECT {C.name_col} "
               f"FROM {C.name} WHERE {num.name} > {fmt_number(x)}",
               [(c[C.name_col],) for c in children if c[cat.name] == v or c[num.name] > x])


def _chain(world: World, parents: list[dict], children: list[dict], thirds: list[dict]):
    P, C, G, rel = world.parent, world.child, world.third, world.relation
    child_of = {c["id"]: c for c in children}
    parent_of = {r["id"]: r for r in parents}
    top = {g["id"]: parent_of[child_of[g["_parent"]]["_parent"]] for g in thirds}  # a third row's parent row
    chain = (f"{G.name} g JOIN {C.name} c ON g.{world.third_fk} = c.id JOIN {P.name} p ON c.{world.fk} = p.id")
    pcat, gcat, gnum = P.cats[0], G.cats[0], G.nums[0]
    for v in pcat.values:
        yield ("chain_count", f"How many {G.plural} are there of the {C.plural} {rel} {P.plural} whose {pcat.phrase} "
                              f"is '{v}'?",
               f"SELECT COUNT(*) FROM {chain} WHERE p.{pcat.name} = {sql_literal(v)}",
               [(sum(top[g["id"]][pcat.name] == v for g in thirds),)])
    for v in (None, *gcat.values):
        rows = [g for g in thirds if v is None or g[gcat.name] == v]
        sums: dict = {}
        for g in rows:
            sums[top[g["id"]]["id"]] = sums.get(top[g["id"]]["id"], 0) + g[gnum.name]
        one = G.singular if v is None else f"{G.singular} whose {gcat.phrase} is '{v}'"
        yield ("chain_group_sum", f"For each {P.singular} with at least one {one} among the {C.plural} {rel} it, give "
                                  f"its {P.name_col} and the total {gnum.phrase} of those {G.plural}.",
               f"SELECT p.{P.name_col}, SUM(g.{gnum.name}) FROM {chain}"
               + ("" if v is None else f" WHERE g.{gcat.name} = {sql_literal(v)}") + " GROUP BY p.id",
               [(r[P.name_col], sums[r["id"]]) for r in parents if r["id"] in sums])
    for x in thresholds([g[gnum.name] for g in thirds]):
        hit = {top[g["id"]]["id"] for g in thirds if g[gnum.name] > x}
        yield ("chain_distinct", f"Which {P.plural} have, among the {C.plural} {rel} them, one with a {G.singular} "
                                 f"whose {gnum.phrase} is above {fmt_number(x)}? Give their {P.name_col}s, each once.",
               f"SELECT DISTINCT p.{P.name_col} FROM {chain} WHERE g.{gnum.name} > {fmt_number(x)}",
               [(r[P.name_col],) for r in parents if r["id"] in hit])
    covered = {g["_parent"] for g in thirds}
    for v in pcat.values:
        yield ("chain_none", f"List the {C.name_col}s of the {C.plural} {rel} {P.plural} whose {pcat.phrase} is "
                             f"'{v}' that have no {G.plural}.",
               f"SELECT c.{C.name_col} FROM {C.name} c JOIN {P.name} p ON c.{world.fk} = p.id WHERE "
               f"p.{pcat.name} = {sql_literal(v)} AND c.id NOT IN (SELECT {world.third_fk} FROM {G.name})",
               [(c[C.name_col],) for c in children
                if parent_of[c["_parent"]][pcat.name] == v and c["id"] not in covered])


def _self(world: World, parents: list[dict]):
    P, role, name = world.parent, world.self_role, world.parent.name_col
    by_id = {r["id"]: r for r in parents}
    pairs = [(r, by_id[r["_mentor"]]) for r in parents if r["_mentor"] is not None]
    join = f"{P.name} a JOIN {P.name} b ON a.{world.self_fk} = b.id"
    cat = P.cats[0]
    for v in (None, *cat.values):
        which = f"that has a {role}" if v is None else f"whose {role} has the {cat.phrase} '{v}'"
        yield ("self_list", f"For each {P.singular} {which}, give the {P.singular}'s {name} and its {role}'s {name}.",
               f"SELECT a.{name}, b.{name} FROM {join}" + ("" if v is None else
                                                         f" WHERE b.{cat.name} = {sql_literal(v)}"),
               [(a[name], b[name]) for a, b in pairs if v is None or b[cat.name] == v])
    for col in P.nums:
        for op, word in ((">", "greater"), ("<", "smaller")):
            yield ("self_compare", f"Which {P.plural} have a {word} {col.phrase} than their {role}? Give their "
                                   f"{name}s.",
                   f"SELECT a.{name} FROM {join} WHERE a.{col.name} {op} b.{col.name}",
                   [(a[name],) for a, b in pairs if (a[col.name] > b[col.name] if op == ">"
                                                     else a[col.name] < b[col.name])])
    counts: dict = {}
    for _, b in pairs:
        counts[b["id"]] = counts.get(b["id"], 0) + 1
    for k in (1, 2):
        yield ("self_count", f"For each {P.singular} that is the {role} of at least {k} other {P.plural}, give its "
                             f"{name} and how many {P.plural} it is the {role} of.",
               f"SELECT b.{name}, COUNT(*) FROM {join} GROUP BY b.id" + (f" HAVING COUNT(*) >= {k}" if k > 1 else ""),
               [(by_id[i][name], n) for i, n in counts.items() if n >= k])


# ------------------------------------------------------------------------------------------- difficulty
_LITERAL = re.compile(r"'(?:[^']|'')*'")
_SUBQUERY = re.compile(r"\(\s*SELECT\b[^()]*(?:\([^()]*\)[^()]*)*\)", re.IGNORECASE)
_AGG = re.compile(r"\b(?:COUNT|SUM|AVG|MIN|MAX)\s*\(", re.IGNORECASE)


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text, re.IGNORECASE))


def hardness(sql: str) -> str:
    """Spider's difficulty class ("easy" | "medium" | "hard" | "extra") of a query, approximated on its text (Yu et
    al. 2018, the official evaluation's `eval_hardness`): component1 = WHERE, GROUP BY, ORDER BY, LIMIT, each join,
    OR and LIKE of the outermost query; component2 = nested queries (subqueries and INTERSECT / UNION / EXCEPT
    arms); others = more than one aggregate, more than one selected column, more than one WHERE condition, more
    than one GROUP BY column (one each). easy: c1 <= 1, others 0, c2 0; medium: (others <= 2, c1 <= 1, c2 0) or
    (c1 <= 2, others < 2, c2 0); hard: (others > 2, c1 <= 2, c2 0) or (2 < c1 <= 3, others <= 2, c2 0) or (c1 <= 1,
    others 0, c2 <= 1); else extra. The official rule parses the query; this one reads its text, which agrees on
    the built-in set's query forms."""
    text = _LITERAL.sub("'?'", sql)
    c2 = _count(r"\bSELECT\b", text) - 1
    top = re.split(r"\b(?:INTERSECT|UNION|EXCEPT)\b", text, flags=re.IGNORECASE)[0]
    while _SUBQUERY.search(top):
        top = _SUBQUERY.sub("(?)", top)
    c1 = (sum(_count(rf"\b{kw}\b", top) > 0 for kw in ("WHERE", r"GROUP\s+BY", r"ORDER\s+BY", "LIMIT"))
          + _count(r"\bJOIN\b", top) + _count(r"\bOR\b", top) + _count(r"\bLIKE\b", top))
    select = re.search(r"\bSELECT\b(.*?)\bFROM\b", top, re.IGNORECASE | re.DOTALL)
    where = re.search(r"\bWHERE\b(.*?)(?:\bGROUP\s+BY\b|\bORDER\s+BY\b|\bLIMIT\b|$)", top, re.IGNORECASE | re.DOTALL)
    group = re.search(r"\bGROUP\s+BY\b(.*?)(?:\bHAVING\b|\bORDER\s+BY\b|\bLIMIT\b|$)", top, re.IGNORECASE | re.DOTALL)
    where_and = _count(r"\bAND\b", where.group(1)) - _count(r"\bBETWEEN\b", where.group(1)) if where else 0
    others = ((len(_AGG.findall(top)) > 1) + (select is not None and select.group(1).count(",") > 0)
              + (where_and > 0) + (group is not None and group.group(1).count(",") > 0))
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if (others > 2 and c1 <= 2 and c2 == 0) or (2 < c1 <= 3 and others <= 2 and c2 == 0) or (
            c1 <= 1 and others == 0 and c2 <= 1):
        return "hard"
    return "extra"
