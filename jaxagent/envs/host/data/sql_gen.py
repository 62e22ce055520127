"""Generated SQL tasks: template questions over generated SQLite databases, gold queries with their answers
computed in Python (written for jaxagent; not Spider, not InterCode-SQL).

No dimension legend: host-side Python, no arrays.

`generate(seed)` fills every world of `sql_worlds` with rows drawn from fixed value pools by `random.Random(seed)`
and instantiates question templates (the single-table and one-join ones here, the harder ones in `sql_gen_hard`)
with constants taken from the data, each on the worlds whose shape it needs. Each task's answer rows are computed in
Python from the generated rows, not by SQLite, and `SQLEnv` keeps only the tasks whose gold query returns them;
answers that are empty or the single value 1 (which `SELECT 1` would match) are not generated.
Output: (scripts, tasks). scripts maps a database name ("gen-<world>") to its SQL script (schema + INSERTs); tasks
is a list of dicts (id, db, question, gold, ordered, expected rows, template), world after world, each in template
order. HELDOUT_TEMPLATES and `sql_worlds.HELDOUT_DBS` are what `splits.structural_splits` holds out. Deterministic
on every machine and Python version (an int seed; no hash-ordered iteration). The worlds and the templates:
docs/host_study.md, "Data".
"""

from __future__ import annotations

import random

from jaxagent.envs.host.data import sql_gen_hard
from jaxagent.envs.host.data.sql_worlds import (WORLDS, Column, Table, World, fmt_number, sql_literal,
                                                thresholds)

SEED = 0  # the built-in set's seed
# Held out whole by the structural split: 8 of the 39 templates, easy to extra (`sql_gen_hard.hardness`), each a
# combination of constructs that train templates use (count_between: COUNT and BETWEEN's comparisons;
# join_group_avg: join_group_count's GROUP BY with AVG; above_avg: arg_max's nesting; lookup: list_eq's filter;
# set_except: set_intersect's and set_union's compound SELECT; chain_group_sum: chain_count's two joins with
# join_group_count's grouping; self_compare: self_list's self-join with a comparison; group_extreme_count: having's
# HAVING with nested aggregates).
HELDOUT_TEMPLATES = ("count_between", "join_group_avg", "above_avg", "lookup", "set_except", "chain_group_sum",
                     "self_compare", "group_extreme_count")


# ----------------------------------------------------------------------------------------- data
def _value(rng: random.Random, col: Column):
    if col.values:
        return rng.choice(col.values)
    if col.real:
        return round(rng.uniform(col.lo, col.hi), 2)
    return rng.randint(int(col.lo), int(col.hi))


def _rows(rng: random.Random, table: Table, n_parents: int = 0, childless: int = 0) -> list[dict]:
    """n_rows rows with distinct names; children reference parents 1..n_parents - childless (the last
    `childless` parents get no child)."""
    if table.n_rows > len(table.names):
        raise ValueError(f"table {table.name}: {table.n_rows} rows but only {len(table.names)} names")
    names = rng.sample(table.names, table.n_rows)
    rows = []
    for i, name in enumerate(names, start=1):
        row = {"id": i, table.name_col: name}
        for col in table.cats + table.nums:
            row[col.name] = _value(rng, col)
        if n_parents:
            row["_parent"] = rng.randint(1, n_parents - childless)
        rows.append(row)
    return rows



def _mentors(rng: random.Random, parents: list[dict]) -> None:
    """Sets each parent's "_mentor": another parent's id (three times in four) or None."""
    for r in parents:
        others = [q["id"] for q in parents if q["id"] != r["id"]]
        r["_mentor"] = rng.choice(others) if rng.random() < 0.75 else None


def _script(world: World, parents: list[dict], children: list[dict], thirds: list[dict]) -> str:
    def create(table: Table, extra: str = "") -> str:
        cols = ["    id INTEGER PRIMARY KEY", f"    {table.name_col} TEXT NOT NULL"]
        cols += [f"    {c.name} TEXT NOT NULL" for c in table.cats]
        cols += [f"    {c.name} {'REAL' if c.real else 'INTEGER'} NOT NULL" for c in table.nums]
        if extra:
            cols.append(extra)
        return f"CREATE TABLE {table.name} (\n" + ",\n".join(cols) + "\n);"

    def insert(table: Table, rows: list[dict], link: str | None = None) -> str:
        cols = ["id", table.name_col] + [c.name for c in table.cats + table.nums]
        lines = []
        for r in rows:
            vals = [r[c] for c in cols] + ([r[link]] if link else [])
            lines.append("(" + ", ".join("NULL" if v is None else sql_literal(v) for v in vals) + ")")
        return f"INSERT INTO {table.name} VALUES\n" + ",\n".join(lines) + ";"

    p, c, g = world.parent, world.child, world.third
    parts = [f"-- jaxagent generated SQL world '{world.name}' (seeded; no external data).",
             create(p, f"    {world.self_fk} INTEGER REFERENCES {p.name}(id)" if world.self_fk else ""),
             create(c, f"    {world.fk} INTEGER NOT NULL REFERENCES {p.name}(id)")]
    if g is not None:
        parts.append(create(g, f"    {world.third_fk} INTEGER NOT NULL REFERENCES {c.name}(id)"))
    parts += [insert(p, parents, "_mentor" if world.self_fk else None), insert(c, children, "_parent")]
    if g is not None:
        parts.append(insert(g, thirds, "_parent"))
    return "\n".join(parts + [""])


# ----------------------------------------------------------------------------------------- templates


_AGGS = (("average", "AVG", lambda xs: sum(xs) / len(xs)), ("highest", "MAX", max), ("lowest", "MIN", min),
         ("total", "SUM", sum))


def _templates(world: World, parents: list[dict], children: list[dict]):
    """Yield (template name, question, gold SQL, expected rows) for one world."""
    P, C, fk = world.parent, world.child, world.fk
    by_id = {r["id"]: r for r in parents}
    kids = {r["id"]: [c for c in children if c["_parent"] == r["id"]] for r in parents}
    tables = ((P, parents), (C, children))

    for T, rows in tables:  # counts and lists per categorical value
        for col in T.cats:
            for v in col.values:
                hit = [r for r in rows if r[col.name] == v]
                yield ("count_eq", f"How many {T.plural} have the {col.phrase} '{v}'?",
                       f"SELECT COUNT(*) FROM {T.name} WHERE {col.name} = {sql_literal(v)}", [(len(hit),)])
                yield ("list_eq", f"List the {T.name_col}s of the {T.plural} whose {col.phrase} is '{v}'.",
                       f"SELECT {T.name_col} FROM {T.name} WHERE {col.name} = {sql_literal(v)}",
                       [(r[T.name_col],) for r in hit])
    for T, rows in tables:  # thresholds and ranges
        for col in T.nums:
            lo, hi = thresholds([r[col.name] for r in rows])
            for x in (lo, hi):
                yield ("list_gt", f"List the {T.name_col}s of the {T.plural} with a {col.phrase} greater than "
                                  f"{fmt_number(x)}.",
                       f"SELECT {T.name_col} FROM {T.name} WHERE {col.name} > {fmt_number(x)}",
                       [(r[T.name_col],) for r in rows if r[col.name] > x])
            yield ("count_between", f"How many {T.plural} have a {col.phrase} between {fmt_number(lo)} and "
                                    f"{fmt_number(hi)} "
                                    "(both included)?",
                   f"SELECT COUNT(*) FROM {T.name} WHERE {col.name} BETWEEN {fmt_number(lo)} AND {fmt_number(hi)}",
                   [(sum(lo <= r[col.name] <= hi for r in rows),)])
            for word, fn, py in _AGGS:
                yield (f"agg_{fn.lower()}", f"What is the {word} {col.phrase} of all {T.plural}?",
                       f"SELECT {fn}({col.name}) FROM {T.name}", [(py([r[col.name] for r in rows]),)])
    for T, rows in tables:  # conditional averages, filters on two columns
        for cat in T.cats[:1]:
            for v in cat.values:
                hit = [r for r in rows if r[cat.name] == v]
                for col in T.nums:
                    if hit:
                        yield ("avg_where", f"What is the average {col.phrase} of the {T.plural} whose {cat.phrase} "
                                            f"is '{v}'?",
                               f"SELECT AVG({col.name}) FROM {T.name} WHERE {cat.name} = {sql_literal(v)}",
                               [(sum(r[col.name] for r in hit) / len(hit),)])
                col = T.nums[-1]
                x = thresholds([r[col.name] for r in rows])[1]
                yield ("list_eq_lt", f"List the {T.name_col}s of the {T.plural} whose {cat.phrase} is '{v}' and whose "
                                     f"{col.phrase} is below {fmt_number(x)}.",
                       f"SELECT {T.name_col} FROM {T.name} WHERE {cat.name} = {sql_literal(v)} AND {col.name} < "
                       f"{fmt_number(x)}", [(r[T.name_col],) for r in hit if r[col.name] < x])
    for T, rows in tables:  # group-bys, distinct counts
        for cat in T.cats:
            groups = sorted({r[cat.name] for r in rows})
            yield ("group_count", f"For each {cat.phrase}, give the {cat.phrase} and the number of {T.plural} "
                                  f"with it, ordered by {cat.phrase}.",
                   f"SELECT {cat.name}, COUNT(*) FROM {T.name} GROUP BY {cat.name} ORDER BY {cat.name}",
                   [(g, sum(r[cat.name] == g for r in rows)) for g in groups])
            yield ("count_distinct", f"How many different {cat.phrase} values do the {T.plural} have?",
                   f"SELECT COUNT(DISTINCT {cat.name}) FROM {T.name}", [(len(groups),)])
    for T, rows in tables:  # rankings, arg-max, above average
        for col in T.nums:
            k = 3
            top = sorted(rows, key=lambda r: (-r[col.name], r[T.name_col]))[:k]
            yield ("top_k", f"List the {T.name_col}s and {col.phrase} of the {k} {T.plural} with the highest "
                            f"{col.phrase}, highest first (ties broken by {T.name_col} in alphabetical order).",
                   f"SELECT {T.name_col}, {col.name} FROM {T.name} ORDER BY {col.name} DESC, {T.name_col} LIMIT {k}",
                   [(r[T.name_col], r[col.name]) for r in top])
            best = max(r[col.name] for r in rows)
            yield ("arg_max", f"Which {T.singular} has the highest {col.phrase}? Give its {T.name_col} (all of them "
                              "if several are tied).",
                   f"SELECT {T.name_col} FROM {T.name} WHERE {col.name} = (SELECT MAX({col.name}) FROM {T.name})",
                   [(r[T.name_col],) for r in rows if r[col.name] == best])
            mean = sum(r[col.name] for r in rows) / len(rows)
            yield ("above_avg", f"List the {T.name_col}s of the {T.plural} whose {col.phrase} is above the average "
                                f"{col.phrase} of all {T.plural}.",
                   f"SELECT {T.name_col} FROM {T.name} WHERE {col.name} > (SELECT AVG({col.name}) FROM {T.name})",
                   [(r[T.name_col],) for r in rows if r[col.name] > mean])
    for T, rows in tables:  # lookups by name
        for r in rows[:3]:
            col = T.nums[0]
            yield ("lookup", f"What is the {col.phrase} of the {T.singular} with the {T.name_col} "
                             f"'{r[T.name_col]}'?",
                   f"SELECT {col.name} FROM {T.name} WHERE {T.name_col} = {sql_literal(r[T.name_col])}",
                   [(r[col.name],)])

    join = f"{C.name} c JOIN {P.name} p ON c.{fk} = p.id"
    for cat in P.cats:  # joins on a parent attribute
        for v in cat.values:
            hit = [c for c in children if by_id[c["_parent"]][cat.name] == v]
            yield ("join_list", f"List the {C.name_col}s of the {C.plural} {world.relation} {P.plural} whose "
                                f"{cat.phrase} is '{v}'.",
                   f"SELECT c.{C.name_col} FROM {join} WHERE p.{cat.name} = {sql_literal(v)}",
                   [(c[C.name_col],) for c in hit])
            yield ("join_count", f"How many {C.plural} are {world.relation} {P.plural} whose {cat.phrase} is '{v}'?",
                   f"SELECT COUNT(*) FROM {join} WHERE p.{cat.name} = {sql_literal(v)}", [(len(hit),)])
    with_kids = [r for r in parents if kids[r["id"]]]
    yield ("join_group_count", f"For each {P.singular} with at least one {C.singular}, give the {P.singular}'s "
                               f"{P.name_col} and the number of {C.plural} {world.relation} it.",
           f"SELECT p.{P.name_col}, COUNT(*) FROM {join} GROUP BY p.id",
           [(r[P.name_col], len(kids[r["id"]])) for r in with_kids])
    for col in C.nums:
        yield ("join_group_avg", f"For each {P.singular} with at least one {C.singular}, give the {P.singular}'s "
                                 f"{P.name_col} and the average {col.phrase} of the {C.plural} {world.relation} it.",
               f"SELECT p.{P.name_col}, AVG(c.{col.name}) FROM {join} GROUP BY p.id",
               [(r[P.name_col], sum(c[col.name] for c in kids[r["id"]]) / len(kids[r["id"]])) for r in with_kids])
    yield ("anti_join", f"Which {P.plural} have no {C.plural} {world.relation} them? Give their {P.name_col}s.",
           f"SELECT {P.name_col} FROM {P.name} WHERE id NOT IN (SELECT {fk} FROM {C.name})",
           [(r[P.name_col],) for r in parents if not kids[r["id"]]])
    for k in (2, 3, 4, 5):
        yield ("having", f"Which {P.plural} have at least {k} {C.plural} {world.relation} them? Give their "
                         f"{P.name_col}s.",
               f"SELECT p.{P.name_col} FROM {join} GROUP BY p.id HAVING COUNT(*) >= {k}",
               [(r[P.name_col],) for r in parents if len(kids[r["id"]]) >= k])
    for r in with_kids[:4]:
        for col in C.nums:
            yield ("join_sum", f"What is the total {col.phrase} of the {C.plural} {world.relation} the {P.singular} "
                               f"with the {P.name_col} '{r[P.name_col]}'?",
                   f"SELECT SUM(c.{col.name}) FROM {join} WHERE p.{P.name_col} = {sql_literal(r[P.name_col])}",
                   [(sum(c[col.name] for c in kids[r["id"]]),)])
        cat = C.cats[0]
        yield ("join_distinct", f"List the different {cat.phrase} values of the {C.plural} {world.relation} the "
                                f"{P.singular} with the {P.name_col} '{r[P.name_col]}'.",
               f"SELECT DISTINCT c.{cat.name} FROM {join} WHERE p.{P.name_col} = {sql_literal(r[P.name_col])}",
               [(v,) for v in sorted({c[cat.name] for c in kids[r["id"]]})])


def _trivial(rows: list) -> bool:
    """An answer no task should have: empty, or the single value 1 (`SELECT 1` would match it)."""
    return not rows or (len(rows) == 1 and len(rows[0]) == 1 and rows[0][0] == 1)


def generate(seed: int = SEED, worlds: tuple = WORLDS) -> tuple[dict, list]:
    """(scripts {db name: SQL script}, tasks [dict(id, db, question, gold, ordered, expected)]) (module docstring)."""
    scripts, tasks = {}, []
    for world in worlds:
        rng = random.Random(f"{seed}/{world.name}")
        parents = _rows(rng, world.parent)
        children = _rows(rng, world.child, n_parents=len(parents), childless=world.childless)
        # drawn after the first two tables, so that their rows are those of the two-table worlds before
        thirds = (_rows(rng, world.third, n_parents=len(children), childless=4) if world.third is not None else [])
        if world.self_fk:
            _mentors(rng, parents)
        db = f"gen-{world.name}"
        scripts[db] = _script(world, parents, children, thirds)
        seen: set = set()
        templates = (*_templates(world, parents, children),
                     *sql_gen_hard.templates(world, parents, children, thirds))
        for template, question, gold, expected in templates:
            if _trivial(expected) or question in seen:
                continue
            seen.add(question)
            tasks.append(dict(id=f"{db}-{len(seen):03d}", db=db, question=question,
                              gold=gold, ordered=" ORDER BY " in gold, expected=[tuple(r) for r in expected],
                              template=template))
    return scripts, tasks

