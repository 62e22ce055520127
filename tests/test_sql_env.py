"""SQL environment: gold queries score 1, wrong ones 0, the database is read-only and unchanged,
limits hold, malformed actions are error observations; plus the host-env registry."""

import hashlib
import os
import time

import pytest
from hypothesis import given, settings, strategies as st

from jaxagent.envs import host
from jaxagent.envs.sql_env import SQLEnv, SQLState, parse_sql_action, results_match, run_query


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return SQLEnv(cache_dir=tmp_path_factory.mktemp("sqlcache"), time_limit_s=0.5)


def _task(env, task_id):
    return next(t for t in env.tasks("all") if t.id == task_id)


def _submit(env, task, query):
    state, _ = env.reset(0, task)
    return env.step(state, f"<answer>\n{query}\n</answer>")


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_task_set_and_splits(env):
    all_tasks = env.tasks("all")
    assert len(all_tasks) >= 20 and len({t.id for t in all_tasks}) == len(all_tasks)
    train, test = env.tasks("train"), env.tasks("test")
    assert len(train) + len(test) == len(all_tasks) and not {t.id for t in train} & {t.id for t in test}
    assert {t.db for t in all_tasks} == {"shop", "school", "library"}
    with pytest.raises(ValueError):
        env.tasks("validation")


def test_every_gold_query_scores_one(env):
    for task in env.tasks("all"):
        assert env.gold_rows(task), f"{task.id}: gold result is empty"
        _, obs, reward, done, info = _submit(env, task, task.gold)
        assert (reward, done, info["success"], info["valid"]) == (1.0, True, True, True), (task.id, obs)
        assert env.upper_bound_turns(task) == 1


@pytest.mark.parametrize("task_id,query", [
    ("shop-01", "SELECT name FROM customers"),
    ("shop-01", "SELECT name, city FROM customers WHERE country = 'France'"),
    ("shop-02", "SELECT COUNT(*) FROM products WHERE stock < 10"),
    ("shop-04", "SELECT SUM(oi.quantity * oi.unit_price) FROM order_items oi"),
    ("shop-06", "SELECT name, price FROM products ORDER BY price ASC LIMIT 3"),
    ("shop-06", "SELECT name, price FROM (SELECT name, price FROM products ORDER BY price DESC LIMIT 3) ORDER BY name"),
    ("school-03", "SELECT s.name, AVG(e.grade) FROM students s JOIN enrollments e ON e.student_id = s.id "
                  "WHERE e.grade IS NOT NULL GROUP BY s.id ORDER BY s.name"),
    ("school-06", "SELECT name FROM teachers LIMIT 1"),
    ("library-01", "SELECT b.title FROM books b JOIN loans l ON l.book_id = b.id"),
    ("library-06", "SELECT AVG(julianday(COALESCE(return_date, '2024-06-01')) - julianday(loan_date)) FROM loans"),
    ("library-02", "SELECT 1 FROM nonexistent_table"),
])
def test_wrong_queries_score_zero(env, task_id, query):
    _, _, reward, done, info = _submit(env, _task(env, task_id), query)
    assert reward == 0.0 and done and not info["success"]


def test_trivial_answer_is_wrong_everywhere(env):
    for task in env.tasks("all"):
        assert _submit(env, task, "SELECT 1")[2] == 0.0, task.id


def test_row_order_matters_only_for_ordered_gold(env):
    unordered = _task(env, "shop-08")
    assert not unordered.ordered
    assert _submit(env, unordered, unordered.gold + " ORDER BY COUNT(*), c.name DESC")[2] == 1.0
    ordered = _task(env, "library-03")
    assert ordered.ordered
    assert _submit(env, ordered, ordered.gold.replace("n DESC", "n ASC"))[2] == 0.0
    assert results_match([(1, 2.0000001)], [(1, 2.0)], ordered=True)
    assert not results_match([(1,), (1,)], [(1,)], ordered=False)


def test_explore_then_submit_episode(env):
    task = _task(env, "shop-05")
    state, obs = env.reset(0, task)
    assert obs == task.question and "CREATE TABLE customers" in env.system_prompt(task)
    state, obs, reward, done, info = env.step(state, "Let me look.\n```sql\nSELECT id, name FROM customers\n```")
    assert not done and reward == 0.0 and info["valid"] and info["kind"] == "execute"
    assert "Jonas Berg" in obs and "(10 rows)" in obs
    call = '<tool_call>\n{"name": "submit", "arguments": {"query": "%s"}}\n</tool_call>' % task.gold
    state, obs, reward, done, info = env.step(state, call)
    assert (reward, done, state.turn) == (1.0, True, 2)
    with pytest.raises(ValueError):
        env.step(state, "```sql\nSELECT 1\n```")


WRITES = [
    "INSERT INTO customers VALUES (99, 'Mallory', 'X', 'Y', '2024-01-01')",
    "UPDATE products SET price = 0",
    "DELETE FROM orders",
    "DROP TABLE order_items",
    "CREATE TABLE evil (x)",
    "CREATE TEMP TABLE evil (x)",
    "ALTER TABLE customers ADD COLUMN evil TEXT",
    "ATTACH DATABASE 'evil.db' AS evil",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA query_only = OFF",
    "VACUUM",
    "REINDEX",
    "BEGIN IMMEDIATE",
    "REPLACE INTO products VALUES (1, 'x', 'y', 0, 0)",
    "WITH x AS (SELECT 1) DELETE FROM customers",
]


@pytest.mark.parametrize("query", WRITES)
def test_writes_are_refused_and_the_file_is_unchanged(env, query):
    task = _task(env, "shop-01")
    path = env.db_path(task)
    before, listing = _sha(path), sorted(os.listdir(path.parent))
    state, _ = env.reset(0, task)
    state, obs, reward, done, info = env.step(state, f"```sql\n{query}\n```")
    assert obs.startswith("Error:") and info["tool_error"] and not done and reward == 0.0
    assert info["error"]
    _, _, reward, _, info = env.step(state, f"<answer>{query}</answer>")
    assert reward == 0.0 and info["error"]
    assert _sha(path) == before and sorted(os.listdir(path.parent)) == listing
    assert len(run_query(path, "SELECT * FROM customers", time_limit_s=1, max_rows=100)[1]) == 10


def test_query_time_and_row_limits(env):
    task = _task(env, "shop-01")
    state, _ = env.reset(0, task)
    t0 = time.monotonic()
    loop = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    state, obs, _, _, info = env.step(state, f"```sql\n{loop}\n```")
    assert time.monotonic() - t0 < 3.0 and "time limit" in obs and info["tool_error"]
    state, obs, _, _, info = env.step(state, "```sql\nSELECT a.id, b.id FROM customers a, products b\n```")
    assert f"only the first {env.max_obs_rows} shown" in obs
    assert obs.count("\n") <= env.max_obs_rows + 3
    state, obs, _, _, _ = env.step(state, "```sql\nSELECT randomblob(100000000)\n```")
    assert obs.startswith("Error:")


def test_anchor_is_the_observed_result(env):
    task = _task(env, "shop-01")
    state, _ = env.reset(0, task)
    step = lambda q: env.step(state, f"```sql\n{q}\n```")  # noqa: E731
    a = step("SELECT name FROM customers WHERE country = 'France'")
    b = step("SELECT name FROM customers WHERE city = 'Lyon' ORDER BY name DESC")
    c = step("SELECT name FROM customers WHERE city = 'Berlin'")
    assert env.anchor(a[0]) == env.anchor(b[0]) != env.anchor(c[0])
    assert a[4]["anchor"] == env.anchor(state) and a[4]["next_anchor"] == env.anchor(a[0])
    assert isinstance(env.anchor(state), int) and 0 <= env.anchor(state) < 2**31
    d = env.step(a[0], "no query")  # invalid: the state does not change
    assert d[4]["anchor"] == d[4]["next_anchor"] == env.anchor(a[0])


@pytest.mark.parametrize("action", ["", "   ", "no query here", "x" * 100_000, b"\xff\xfe\x00garbage", None, 42,
                                    "<answer></answer>", "```sql\n```", "<tool_call>{bad json</tool_call>",
                                    '<tool_call>{"name": "drop_db", "arguments": {}}</tool_call>',
                                    '<tool_call>{"name": "submit", "arguments": {"query": 3}}</tool_call>'])
def test_malformed_actions_are_invalid_not_exceptions(env, action):
    state, _ = env.reset(0, _task(env, "shop-02"))
    state, obs, reward, done, info = env.step(state, action)
    assert obs.startswith("Error:") and not info["valid"] and not done and reward == 0.0
    assert set(info) >= {"valid", "success", "anchor", "next_anchor", "error", "obs_role"}


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300),
                 st.lists(st.sampled_from(["```sql\n", "```", "<answer>", "</answer>", "SELECT", " * FROM ",
                                           "customers", "'", ";", "<tool_call>", "</tool_call>", "{", "}",
                                           '"query"', "\n", "WHERE", "1=1", "DROP TABLE products"]),
                          max_size=12).map("".join)))
def test_fuzzed_actions_never_raise(env, action):
    state, _ = env.reset(0, _task(env, "shop-02"))
    state, obs, reward, done, info = env.step(state, action)
    assert isinstance(obs, str) and reward in (0.0, 1.0) and isinstance(info["valid"], bool)


def test_parse_sql_action_formats():
    assert parse_sql_action("```sql\nSELECT 1\n```\n```sql\nSELECT 2\n```")[:2] == ("execute", "SELECT 2")
    assert parse_sql_action("<answer>```sql\nSELECT 3\n```</answer>")[:2] == ("submit", "SELECT 3")
    assert parse_sql_action("<think>```sql\nSELECT 9\n```</think>nothing")[0] is None


def test_registry(tmp_path):
    assert {"sql", "code", "bfcl"} <= set(host.registered())
    env = host.make("sql", cache_dir=tmp_path)
    assert isinstance(env, SQLEnv) and env.jittable is False
    state, _ = env.reset(0, env.tasks("test")[0])
    assert isinstance(state, SQLState)
    with pytest.raises(ValueError):
        host.make("no-such-env")
    with pytest.raises(ValueError):
        host.register("sql", SQLEnv)
    host.register("sql-test-alias", lambda **kw: SQLEnv(cache_dir=tmp_path, **kw), overwrite=True)
    assert host.make("sql-test-alias", max_obs_rows=5).max_obs_rows == 5
