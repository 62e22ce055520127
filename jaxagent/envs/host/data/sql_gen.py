"""Generated SQL tasks: template questions over generated SQLite databases, gold queries with their answers
computed in Python (written for jaxagent; not Spider, not InterCode-SQL).

No dimension legend: host-side Python, no arrays.

Each world is a database of two tables, a parent (e.g. keepers) and a child (e.g. animals) with a foreign key to
it; a table has a name column, categorical text columns and numeric columns. `generate(seed)` fills every world
with rows drawn from fixed value pools by `random.Random(seed)` (some parents get no child), and instantiates
question templates (counts, lists, thresholds, ranges, aggregates, group-bys, top-k, arg-max, joins, anti-joins,
HAVING, distinct counts, lookups) with constants taken from the data. Each task carries its gold query and the
rows that answer it, computed in Python from the generated rows (not by SQLite): `SQLEnv` runs every gold query
and keeps only the tasks whose result equals those rows (the gold query verified by execution). Tasks whose
answer is empty or the single value 1 (which `SELECT 1` would match) are not generated.

Output: (scripts, tasks). scripts maps a database name ("gen-<world>") to its SQL script (schema + INSERTs);
tasks is a list of dicts (id, db, question, gold, ordered, expected rows), the worlds one after another, each
world's tasks in template order, so the env's every-4th held-out rule takes a quarter of every world and
template. Deterministic: the same seed gives the same scripts and tasks on every machine and Python version
(`random.Random` with an int seed; no hash-ordered iteration).
"""

from __future__ import annotations

import dataclasses
import random

SEED = 0  # the built-in set's seed


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    phrase: str                       # how questions name it ("species", "weight in kg")
    values: tuple = ()                # categorical: the value pool
    lo: float = 0                     # numeric: uniform range
    hi: float = 0
    real: bool = False                # numeric: REAL with 2 decimals (else INTEGER)


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    singular: str
    plural: str
    name_col: str                     # the column naming a row ("name", "title", "plate")
    names: tuple                      # the pool of row names (unique per row)
    n_rows: int
    cats: tuple                       # Columns (categorical)
    nums: tuple                       # Columns (numeric)


@dataclasses.dataclass(frozen=True)
class World:
    name: str
    parent: Table
    child: Table
    fk: str                           # the child's column referencing parent.id
    relation: str                     # "<child plural> {relation} <parent plural>": "cared for by"
    childless: int = 2                # parents that get no child


def _people(first: str, last: str) -> tuple:
    """Every first x last name combination, in a fixed order."""
    return tuple(f"{f} {s}" for s in last.split() for f in first.split())


WORLDS = (
    World("zoo",
          Table("keepers", "keeper", "keepers", "name", _people("Ada Bo Cy Di Ed Flo", "Marsh Quill Stone"), 12,
                (Column("shift", "shift", ("morning", "evening", "night")),),
                (Column("years_experience", "years of experience", lo=1, hi=30),)),
          Table("animals", "animal", "animals", "name",
                tuple(f"{a}{b}" for a in ("Bel", "Cor", "Dax", "Fen", "Gil", "Hob", "Ivo", "Jun")
                      for b in ("la", "ro", "mi", "tu", "sa", "ke")), 40,
                (Column("species", "species", ("lion", "zebra", "penguin", "giraffe", "otter", "tiger")),
                 Column("diet", "diet", ("herbivore", "carnivore", "omnivore"))),
                (Column("weight_kg", "weight in kg", lo=2, hi=900, real=True),
                 Column("age", "age in years", lo=1, hi=25))),
          "keeper_id", "cared for by"),
    World("league",
          Table("teams", "team", "teams", "name",
                tuple(f"{c} {m}" for c in ("Riverton", "Lakeside", "Hillcrest", "Oakport") for m in
                      ("Hawks", "Bears", "Comets")), 10,
                (Column("division", "division", ("north", "south", "east", "west")),),
                (Column("founded", "founding year", lo=1890, hi=2015),)),
          Table("players", "player", "players", "name", _people("Ana Ben Cai Dora Eli Fay Gus Hana",
                                                                  "Ortiz Novak Ito Keller Diaz Moss"), 45,
                (Column("position", "position", ("goalkeeper", "defender", "midfielder", "forward")),
                 Column("foot", "preferred foot", ("left", "right"))),
                (Column("goals", "number of goals", lo=0, hi=40),
                 Column("salary", "salary", lo=20000, hi=900000, real=True))),
          "team_id", "playing for"),
    World("clinic",
          Table("doctors", "doctor", "doctors", "name",
                tuple(f"Dr. {n}" for n in _people("Ilse Omar Pia Raj", "Berg Costa Hahn")),
                10,
                (Column("specialty", "specialty", ("cardiology", "dermatology", "neurology", "pediatrics")),),
                (Column("years_practice", "years in practice", lo=1, hi=40),)),
          Table("patients", "patient", "patients", "name", _people("Alma Bruno Clea Dario Edda Fynn Greta Hugo",
                                                                    "Lind Moro Petit Roth Sousa"), 40,
                (Column("city", "city", ("Lyon", "Porto", "Graz", "Turku", "Ghent")),
                 Column("blood_type", "blood type", ("A", "B", "AB", "O"))),
                (Column("age", "age", lo=1, hi=95),
                 Column("bill", "bill amount", lo=50, hi=5000, real=True))),
          "doctor_id", "treated by"),
    World("cinema",
          Table("studios", "studio", "studios", "name",
                tuple(f"{a} {b}" for a in ("Silver", "Red", "Northern", "Golden")
                      for b in ("Pictures", "Films", "Works")),
                10,
                (Column("country", "country", ("USA", "France", "Japan", "India", "Korea")),),
                (Column("founded", "founding year", lo=1910, hi=2010),)),
          Table("films", "film", "films", "title",
                tuple(f"The {a} {b}" for a in ("Silent", "Last", "Hidden", "Broken", "Endless", "Crimson", "Quiet")
                      for b in ("Harbor", "Orchard", "Signal", "Winter", "Mirror", "Garden", "Letter")), 44,
                (Column("genre", "genre", ("drama", "comedy", "horror", "documentary", "animation")),
                 Column("rating_code", "age rating", ("G", "PG", "R"))),
                (Column("year", "release year", lo=1970, hi=2023),
                 Column("budget_musd", "budget in million USD", lo=1, hi=250, real=True))),
          "studio_id", "made by"),
    World("fleet",
          Table("depots", "depot", "depots", "name",
                tuple(f"{a} {b}" for a in ("North", "South", "Harbor", "Airport", "Valley") for b in ("Yard", "Hub")),
                9,
                (Column("region", "region", ("coast", "inland", "mountain")),),
                (Column("capacity", "capacity", lo=10, hi=80),)),
          Table("trucks", "truck", "trucks", "plate", tuple(f"TR-{n}" for n in range(101, 160)), 42,
                (Column("make", "make", ("Volvo", "Scania", "Iveco", "DAF", "Tatra")),
                 Column("fuel", "fuel type", ("diesel", "electric", "hybrid"))),
                (Column("mileage_km", "mileage in km", lo=1000, hi=400000),
                 Column("load_tons", "load capacity in tons", lo=1, hi=40, real=True))),
          "depot_id", "based at"),
    World("hotels",
          Table("hotels", "hotel", "hotels", "name",
                tuple(f"Hotel {a}" for a in ("Aurora", "Belvedere", "Cielo", "Dune", "Ember", "Fjord", "Grove",
                                              "Haven", "Isola", "Juniper")), 10,
                (Column("city", "city", ("Oslo", "Lisbon", "Krakow", "Seville")),),
                (Column("stars", "star rating", lo=1, hi=5),)),
          Table("bookings", "booking", "bookings", "guest", _people("Iris Jon Kai Lea Milo Nora Otto Pia",
                                                                     "Frost Vega Wolf Young Zorn Abel"), 42,
                (Column("room_type", "room type", ("single", "double", "suite")),
                 Column("channel", "booking channel", ("phone", "web", "agency"))),
                (Column("nights", "number of nights", lo=1, hi=14),
                 Column("price", "price", lo=40, hi=3000, real=True))),
          "hotel_id", "made at"),
    World("concerts",
          Table("venues", "venue", "venues", "name",
                tuple(f"{a} {b}" for a in ("Blue", "Grand", "Old", "Star") for b in ("Hall", "Arena", "Club")), 10,
                (Column("city", "city", ("Vienna", "Dublin", "Milan", "Prague")),),
                (Column("capacity", "capacity", lo=200, hi=20000),)),
          Table("concerts", "concert", "concerts", "artist",
                tuple(f"{a} {b}" for a in ("Neon", "Velvet", "Paper", "Iron", "Lunar", "Wild", "Amber")
                      for b in ("Tides", "Wolves", "Echo", "Parade", "Sisters", "Engine", "Kites")), 44,
                (Column("genre", "genre", ("rock", "jazz", "folk", "electronic", "classical")),
                 Column("weekday", "weekday", ("Friday", "Saturday", "Sunday"))),
                (Column("attendance", "attendance", lo=100, hi=15000),
                 Column("ticket_price", "ticket price", lo=10, hi=250, real=True))),
          "venue_id", "held at"),
    World("garden",
          Table("gardeners", "gardener", "gardeners", "name", _people("Ines Lars Maja Nils Olga", "Frey Sand"), 10,
                (Column("team", "team", ("roses", "herbs", "orchard")),),
                (Column("hours_per_week", "working hours per week", lo=5, hi=45),)),
          Table("plants", "plant", "plants", "name",
                tuple(f"{a} {b}" for a in ("Blue", "Dwarf", "Giant", "Wild", "Royal", "Silver", "Golden")
                      for b in ("Sage", "Fern", "Maple", "Lily", "Thyme", "Birch", "Poppy")), 44,
                (Column("kind", "kind", ("shrub", "tree", "herb", "flower")),
                 Column("color", "flower color", ("white", "red", "yellow", "purple"))),
                (Column("height_cm", "height in cm", lo=5, hi=900, real=True),
                 Column("water_liters", "weekly water in liters", lo=1, hi=60))),
          "gardener_id", "tended by"),
)


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


def _sql_literal(v) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def _script(world: World, parents: list[dict], children: list[dict]) -> str:
    def create(table: Table, extra: str = "") -> str:
        cols = ["    id INTEGER PRIMARY KEY", f"    {table.name_col} TEXT NOT NULL"]
        cols += [f"    {c.name} TEXT NOT NULL" for c in table.cats]
        cols += [f"    {c.name} {'REAL' if c.real else 'INTEGER'} NOT NULL" for c in table.nums]
        if extra:
            cols.append(extra)
        return f"CREATE TABLE {table.name} (\n" + ",\n".join(cols) + "\n);"

    def insert(table: Table, rows: list[dict], fk: str | None = None) -> str:
        cols = ["id", table.name_col] + [c.name for c in table.cats + table.nums]
        lines = []
        for r in rows:
            vals = [r[c] for c in cols] + ([r["_parent"]] if fk else [])
            lines.append("(" + ", ".join(_sql_literal(v) for v in vals) + ")")
        return f"INSERT INTO {table.name} VALUES\n" + ",\n".join(lines) + ";"

    p, c = world.parent, world.child
    return "\n".join([
        f"-- jaxagent generated SQL world '{world.name}' (seeded; no external data).",
        create(p), create(c, f"    {world.fk} INTEGER NOT NULL REFERENCES {p.name}(id)"),
        insert(p, parents), insert(c, children, world.fk), ""])


# ----------------------------------------------------------------------------------------- templates
def _thresholds(values: list) -> list:
    """Two data values (about the 30th and 70th percentile) as thresholds."""
    s = sorted(values)
    return [s[int(len(s) * q)] for q in (0.3, 0.7)]


def _fmt(x) -> str:
    return f"{x:.2f}" if isinstance(x, float) else str(x)


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
                       f"SELECT COUNT(*) FROM {T.name} WHERE {col.name} = {_sql_literal(v)}", [(len(hit),)])
                yield ("list_eq", f"List the {T.name_col}s of the {T.plural} whose {col.phrase} is '{v}'.",
                       f"SELECT {T.name_col} FROM {T.name} WHERE {col.name} = {_sql_literal(v)}",
                       [(r[T.name_col],) for r in hit])
    for T, rows in tables:  # thresholds and ranges
        for col in T.nums:
            lo, hi = _thresholds([r[col.name] for r in rows])
            for x in (lo, hi):
                yield ("list_gt", f"List the {T.name_col}s of the {T.plural} with a {col.phrase} greater than "
                                  f"{_fmt(x)}.",
                       f"SELECT {T.name_col} FROM {T.name} WHERE {col.name} > {_fmt(x)}",
                       [(r[T.name_col],) for r in rows if r[col.name] > x])
            yield ("count_between", f"How many {T.plural} have a {col.phrase} between {_fmt(lo)} and {_fmt(hi)} "
                                    "(both included)?",
                   f"SELECT COUNT(*) FROM {T.name} WHERE {col.name} BETWEEN {_fmt(lo)} AND {_fmt(hi)}",
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
                               f"SELECT AVG({col.name}) FROM {T.name} WHERE {cat.name} = {_sql_literal(v)}",
                               [(sum(r[col.name] for r in hit) / len(hit),)])
                col = T.nums[-1]
                x = _thresholds([r[col.name] for r in rows])[1]
                yield ("list_eq_lt", f"List the {T.name_col}s of the {T.plural} whose {cat.phrase} is '{v}' and whose "
                                     f"{col.phrase} is below {_fmt(x)}.",
                       f"SELECT {T.name_col} FROM {T.name} WHERE {cat.name} = {_sql_literal(v)} AND {col.name} < "
                       f"{_fmt(x)}", [(r[T.name_col],) for r in hit if r[col.name] < x])
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
                   f"SELECT {col.name} FROM {T.name} WHERE {T.name_col} = {_sql_literal(r[T.name_col])}",
                   [(r[col.name],)])

    join = f"{C.name} c JOIN {P.name} p ON c.{fk} = p.id"
    for cat in P.cats:  # joins on a parent attribute
        for v in cat.values:
            hit = [c for c in children if by_id[c["_parent"]][cat.name] == v]
            yield ("join_list", f"List the {C.name_col}s of the {C.plural} {world.relation} {P.plural} whose "
                                f"{cat.phrase} is '{v}'.",
                   f"SELECT c.{C.name_col} FROM {join} WHERE p.{cat.name} = {_sql_literal(v)}",
                   [(c[C.name_col],) for c in hit])
            yield ("join_count", f"How many {C.plural} are {world.relation} {P.plural} whose {cat.phrase} is '{v}'?",
                   f"SELECT COUNT(*) FROM {join} WHERE p.{cat.name} = {_sql_literal(v)}", [(len(hit),)])
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
                   f"SELECT SUM(c.{col.name}) FROM {join} WHERE p.{P.name_col} = {_sql_literal(r[P.name_col])}",
                   [(sum(c[col.name] for c in kids[r["id"]]),)])
        cat = C.cats[0]
        yield ("join_distinct", f"List the different {cat.phrase} values of the {C.plural} {world.relation} the "
                                f"{P.singular} with the {P.name_col} '{r[P.name_col]}'.",
               f"SELECT DISTINCT c.{cat.name} FROM {join} WHERE p.{P.name_col} = {_sql_literal(r[P.name_col])}",
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
        db = f"gen-{world.name}"
        scripts[db] = _script(world, parents, children)
        seen: set = set()
        for template, question, gold, expected in _templates(world, parents, children):
            if _trivial(expected) or question in seen:
                continue
            seen.add(question)
            tasks.append(dict(id=f"{db}-{len(seen):03d}", db=db, question=question,
                              gold=gold, ordered=" ORDER BY " in gold, expected=[tuple(r) for r in expected],
                              template=template))
    return scripts, tasks

