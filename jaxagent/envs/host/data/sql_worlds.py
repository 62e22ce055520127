"""The worlds of the generated SQL set (`sql_gen`): each a database schema with value pools (data tables, written for
jaxagent; not Spider).

No dimension legend: host-side Python, no arrays.

A world has a parent table and a child table with a foreign key to it; some worlds also have a third table whose
rows belong to the child rows (`third`: a chain of two foreign keys, so questions need two joins), and some a
foreign key from the parent table to itself (`self_fk`: a mentor, supervisor or trainer, so questions need a
self-join). `World.shape` names which: "pair", "chain", "self" or "chain+self". HELDOUT_DBS are the two databases
the structural split holds out whole, of different shapes (a chain and a self-referencing one), so that each
held-out schema has a train database of its shape and new tables, columns and values.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


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
    third: Optional[Table] = None     # a table whose rows belong to child rows (the chain shape)
    third_fk: str = ""                # the third table's column referencing child.id
    self_fk: str = ""                 # the parent's column referencing another parent's id (nullable)
    self_role: str = ""               # what the referenced parent is to the other ("mentor")

    @property
    def shape(self) -> str:
        parts = (("chain", self.third is not None), ("self", bool(self.self_fk)))
        return "+".join(s for s, on in parts if on) or "pair"


def sql_literal(v) -> str:
    """A Python value as an SQL literal (strings quoted, quotes doubled)."""
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def thresholds(values: list) -> list:
    """Two data values (about the 30th and 70th percentile) as thresholds."""
    s = sorted(values)
    return [s[int(len(s) * q)] for q in (0.3, 0.7)]


def fmt_number(x) -> str:
    """A number as questions and gold queries write it (floats with 2 decimals)."""
    return f"{x:.2f}" if isinstance(x, float) else str(x)


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
          "keeper_id", "cared for by",
          third=Table("feedings", "feeding", "feedings", "code",
                      tuple(f"FD-{n}" for n in range(1001, 1100)), 64,
                      (Column("food", "food", ("hay", "fish", "meat", "fruit", "seeds")),),
                      (Column("amount_kg", "amount in kg", lo=1, hi=40, real=True),)),
          third_fk="animal_id", self_fk="mentor_id", self_role="mentor"),
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
          "team_id", "playing for",
          third=Table("appearances", "appearance", "appearances", "code",
                      tuple(f"AP-{n}" for n in range(1001, 1100)), 70,
                      (Column("competition", "competition", ("cup", "league", "friendly")),),
                      (Column("minutes", "minutes played", lo=1, hi=90),)),
          third_fk="player_id"),
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
          "doctor_id", "treated by", self_fk="supervisor_id", self_role="supervisor"),
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
          "studio_id", "made by",
          third=Table("screenings", "screening", "screenings", "code",
                      tuple(f"SC-{n}" for n in range(1001, 1100)), 66,
                      (Column("city", "city", ("Paris", "Tokyo", "Lagos", "Lima")),),
                      (Column("tickets", "tickets sold", lo=10, hi=900),)),
          third_fk="film_id"),
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
          "venue_id", "held at",
          third=Table("reviews", "review", "reviews", "code",
                      tuple(f"RV-{n}" for n in range(1001, 1100)), 64,
                      (Column("outlet", "outlet", ("radio", "blog", "paper")),),
                      (Column("score", "score", lo=1, hi=10),)),
          third_fk="concert_id"),
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
          "gardener_id", "tended by", self_fk="trainer_id", self_role="trainer"),
)



HELDOUT_DBS = ("gen-concerts", "gen-garden")  # held out whole by the structural split: a chain and a self shape
