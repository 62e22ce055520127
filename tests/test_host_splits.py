"""The built-in SQL and coding sets' held-out splits by structure: what the held-out split shares with train
(measured, not assumed), what the new-constants split shares, and the difficulty the sets span."""

import collections
import io
import re
import tokenize
from types import SimpleNamespace

import numpy as np
import pytest

from jaxagent.envs.host import splits
from jaxagent.envs.host.code_env import CodeEnv
from jaxagent.envs.host.data import code_gen, sql_gen, sql_gen_hard
from jaxagent.envs.host.data.sql_worlds import HELDOUT_DBS, WORLDS
from jaxagent.envs.host.sql_env import SQLEnv


@pytest.fixture(scope="module")
def sql(tmp_path_factory):
    env = SQLEnv(cache_dir=tmp_path_factory.mktemp("sql"))
    yield env
    env.close()


@pytest.fixture(scope="module")
def code():
    return CodeEnv()


def _masked_sql(query: str) -> str:
    """The gold query with every string and number constant replaced by '?'."""
    return re.sub(r"\b\d+(\.\d+)?\b", "?", re.sub(r"'(?:[^']|'')*'", "?", query))


def _masked_code(source: str) -> tuple:
    toks = tokenize.generate_tokens(io.StringIO(source).readline)
    return tuple("?" if t.type in (tokenize.NUMBER, tokenize.STRING) else t.string for t in toks
                 if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE))


def test_sql_held_out_templates_and_databases_are_in_no_train_task(sql):
    train, test, const = sql.tasks("train"), sql.tasks("test"), sql.tasks("test_constants")
    db = lambda t: t.db  # noqa: E731
    held_dbs = set(HELDOUT_DBS) | {"library"}
    assert not set(sql_gen.HELDOUT_TEMPLATES) & {t.template for t in train + const}
    assert not held_dbs & {t.db for t in train + const}
    assert {t.db for t in test} >= held_dbs and {t.template for t in test} >= set(sql_gen.HELDOUT_TEMPLATES)
    o = splits.overlap(train, test, db)
    assert o["both"] == 0 and o["tasks"] == 426  # no held-out task has a train task's template on its database
    assert o["template"] < o["tasks"] and o["db"] < o["tasks"]
    # what the every-4th rule gave: 96% of held-out tasks shared template and database; the constants split still does
    c = splits.overlap(train, const, db)
    assert c["both"] == c["tasks"] == 168
    # constants masked: a held-out gold is never a train gold with other values; a constants one nearly always is
    seen = {_masked_sql(t.gold) for t in train}
    assert sum(_masked_sql(t.gold) in seen for t in test) == 0
    assert sum(_masked_sql(t.gold) in seen for t in const) >= 0.7 * len(const)  # others: a template's other column


def test_sql_held_out_databases_have_different_shapes_each_seen_in_train():
    shapes = {f"gen-{w.name}": w.shape for w in WORLDS}
    held = [shapes[d] for d in HELDOUT_DBS]
    assert len(set(held)) == len(held) == 2  # of different shapes
    assert set(held) <= {s for d, s in shapes.items() if d not in HELDOUT_DBS} - {"pair"} | {"chain", "self"}
    assert set(shapes.values()) == {"pair", "chain", "self", "chain+self"}


def test_sql_sets_span_spider_difficulty_and_the_hard_constructs(sql):
    for name in ("train", "test", "test_constants"):
        golds = [t.gold for t in sql.tasks(name) if t.db.startswith("gen-")]
        levels = collections.Counter(sql_gen_hard.hardness(g) for g in golds)
        assert set(levels) == set(sql_gen_hard.HARDNESS), (name, levels)
        assert levels["hard"] + levels["extra"] >= 0.1 * len(golds), (name, levels)
    golds = [t.gold for t in sql.tasks("all")]
    assert sum(g.count(" JOIN ") >= 2 for g in golds) >= 40  # two joins
    assert sum(g.count("SELECT") >= 2 for g in golds) >= 150  # nesting or compound
    assert all(sum(op in g for g in golds) >= 10 for op in (" INTERSECT ", " EXCEPT ", " UNION ", " HAVING "))
    assert sum(re.search(r"FROM (\w+) a JOIN \1 b", g) is not None for g in golds) >= 20  # self-joins


def test_spider_hardness_rule_on_known_queries():
    assert sql_gen_hard.hardness("SELECT count(*) FROM singer") == "easy"
    assert sql_gen_hard.hardness("SELECT name, age FROM singer WHERE age > 3 AND country = 'x'") == "medium"
    assert sql_gen_hard.hardness("SELECT name FROM t WHERE id NOT IN (SELECT tid FROM u)") == "hard"
    assert sql_gen_hard.hardness("SELECT a FROM t WHERE x = 'y' EXCEPT SELECT a FROM t WHERE x = 'z'") == "hard"
    two = "SELECT p.a FROM t JOIN p ON t.i = p.j WHERE x = 'y' EXCEPT SELECT a FROM t"
    assert sql_gen_hard.hardness(two) == "extra"
    assert sql_gen_hard.hardness("SELECT 'a UNION b' FROM t") == "easy"  # literals are not keywords


def test_code_held_out_families_are_in_no_train_task_and_the_long_ones_are_long(code):
    train, test, const = code.tasks("train"), code.tasks("test"), code.tasks("test_constants")
    assert not {t.template for t in test} & {t.template for t in train + const}
    o = splits.overlap(train, test)
    assert o["template"] == o["both"] == 0 and o["tasks"] == 222
    assert splits.overlap(train, const)["both"] == len(const) == 209
    seen = {_masked_code(t.reference) for t in train}
    assert sum(_masked_code(t.reference) in seen for t in test) == 0
    assert sum(_masked_code(t.reference) in seen for t in const) >= 0.9 * len(const)

    def lines(t):
        return sum(1 for line in t.reference.splitlines() if line.strip())

    long = {f.name for f in code_gen.code_gen_long.LONG_FAMILIES}
    for name in ("train", "test", "test_constants"):
        tasks = code.tasks(name)
        assert sum(t.template in long for t in tasks) >= 15, name
        assert all(lines(t) >= 19 for t in tasks if t.template in long), name
    assert min(lines(t) for t in code.tasks("all") if t.template in long) >= 19
    assert max(lines(t) for t in code.tasks("all") if t.template in long) >= 35


def test_structural_splits_refuse_unknown_held_out_names_and_keep_singletons_in_train():
    tasks = [SimpleNamespace(template=x, db=d) for x, d in (("a", "p"), ("a", "p"), ("a", "q"), ("a", "p"),
                                                             ("b", "p"), ("solo", "p"), ("c", "r"))]
    out = splits.structural_splits(tasks, ["c"], ["q"], db_of=lambda t: t.db)
    assert [t.template + t.db for t in out["test"]] == ["aq", "cr"]
    assert [t.template for t in out["test_constants"]] == []  # the pool is "a" x 3 on "p": no 4th
    assert [t.template for t in out["train"]] == ["a", "a", "a", "b", "solo"] and out["all"] == tasks
    more = splits.structural_splits(tasks * 2, [], [])  # no databases: every template has two tasks or more
    assert [t.template for t in more["test_constants"]] == ["a", "a", "b"]  # the 4th, 8th and 12th tasks
    by_db = splits.structural_splits([tasks[2], tasks[2], *tasks[:2], tasks[4]], [], [], db_of=lambda t: t.db)
    assert by_db["test_constants"] == [tasks[1]] and len(by_db["train"]) == 4  # "a" on "p" keeps a train task
    with pytest.raises(ValueError, match="no task has.*'nope'"):
        splits.structural_splits(tasks, ["nope"], [], db_of=lambda t: t.db)


def test_reports_name_the_split_of_every_number_and_the_grading(sql):
    """The report's data lines (`pipeline.split_meta`) and its domain section: the held-out split's name and how it
    is made, each further split's Pass@(K,T) table under its own name, Pass@1 of both side by side."""
    from jaxagent.study.host import metrics as host_metrics, pipeline, report as host_report, domains as host_domains

    dom = host_domains.get_domain("sql")
    world = SimpleNamespace(env=sql, domain=dom, train_tasks=sql.tasks("train"),
                            extra_heldout={"test_constants": tuple(sql.tasks("test_constants")[:5])})
    meta = pipeline.split_meta(SimpleNamespace(world=world))
    assert meta["held-out split"].startswith("'test': held-out templates") and "gen-concerts" in meta["held-out split"]
    assert meta["also evaluated on split 'test_constants'"].startswith("5 tasks: the train split's templates")
    assert meta["grading"].startswith("exact:") and meta["trained on split"].startswith("'train' (554 tasks")
    assert "data warning 1" not in meta and "benchmark cut" not in meta
    tiers, ks = (1, 2), (1,)
    grid = lambda v: np.full((2, 1, 3), v)  # noqa: E731  [U, J, P]
    bound = {"share": np.ones(2)}
    m = {"sql.split.train": 554, "sql.split.heldout": 3, "sql.split.heldout_note": meta["held-out split"][8:]}
    m.update(host_metrics.pass_metrics("sql", {"base": grid(0.1), "grpo/seed0": grid(0.2)}, bound, tiers, ks, {}))
    extra = {"base": grid(0.5), "base/seed0": grid(0.5), "base/seed1": grid(0.25), "grpo/seed0": grid(0.75),
             "grpo/seed1": grid(0.75)}
    m.update(host_metrics.pass_metrics("sql.test_constants", extra, bound, tiers, ks, {}))
    m.update(host_metrics.split_gaps("sql.test_constants", extra, tiers, ks, {}))
    m["sql.test_constants.split.heldout"], m["sql.test_constants.split.note"] = 5, "train's templates"
    lines, _ = host_report.domain_section("sql", "SQL", m, [], policies=["base", "grpo"], tiers=tiers, ks=ks,
                                          t_max=2, splits=("train", "test"))
    text = "\n".join(lines)
    assert "### Pass@(K,T) on held-out split 'test' (%)" in text and "### Findings (on split 'test')" in text
    assert "### Pass@(K,T) on split 'test_constants' (%)" in text and "5 tasks: train's templates" in text
    assert "| test | 2 | 10.0 | 20.0 |" in text and "| test_constants | 2 | 37.5 | 75.0 |" in text  # base: its draws
    # RL - base paired by seed key: seed 0 +25 points, seed 1 +50 on every task; a t interval over the 2 seeds
    assert "| grpo | 2 | 37.5 | [" in text and "grpo seeds 0, 1; none excluded" in text
