"""SQL environment: gold queries score 1, wrong ones 0, the database is read-only and unchanged,
limits hold, malformed actions are error observations; plus the host-env registry."""

import hashlib
import os
import time
import threading
import tracemalloc

import pytest
from hypothesis import given, settings, strategies as st

from jaxagent.envs.host import base as host
from jaxagent.envs.host import sql_query
from jaxagent.envs.host.data import sql_gen
from jaxagent.envs.host.data.sql_tasks import SQL_TASKS
from jaxagent.envs.host.sql_actions import parse_sql_action
from jaxagent.envs.host.sql_env import SQLEnv, SQLState
from jaxagent.envs.host.sql_grading import results_match
from jaxagent.envs.host.sql_query import QueryError, run_query


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
    splits = [env.tasks(name) for name in ("train", "test", "test_constants")]
    assert sorted(t.id for s in splits for t in s) == sorted(t.id for t in all_tasks)  # disjoint, and all of them
    assert {t.db for t in all_tasks} == {"shop", "school", "library"} | {f"gen-{w.name}" for w in sql_gen.WORLDS}
    assert [t.id for t in all_tasks[:23]] == [t["id"] for t in SQL_TASKS]  # the hand-written ones first
    assert [t.template for t in all_tasks[:23]] == [t["id"] for t in SQL_TASKS]  # each its own template
    assert {t.template for t in all_tasks[23:]} >= set(sql_gen.HELDOUT_TEMPLATES) and len(
        {t.template for t in all_tasks[23:]}) == 39
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


_ROWS_100 = "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100) SELECT x FROM c)"
HUGE_RESULTS = [
    # a hostile query: ~1900 zeroblob columns (30 per CTE row, cross-joined 64 times) in a 750-character query
    "WITH z AS (SELECT " + ", ".join(f"zeroblob(100000) c{i}" for i in range(30)) + ") SELECT * FROM "
    + ", ".join(["z"] * 64),
    "SELECT " + ", ".join(["zeroblob(30000)"] * 200),
    "SELECT " + ", ".join(["zeroblob(30000)"] * 60) + " FROM " + _ROWS_100,  # many rows of wide blobs
    "SELECT " + ", ".join(["printf('%.*c', 30000, 'x')"] * 60) + " FROM " + _ROWS_100,  # wide text
    "SELECT x, randomblob(20000), hex(randomblob(10000)) FROM " + _ROWS_100,
    "SELECT zeroblob(1000000000)",
    "SELECT group_concat(hex(randomblob(1000))) FROM " + _ROWS_100,
]


@pytest.mark.parametrize("query", HUGE_RESULTS)
def test_result_bytes_and_time_are_bounded(env, query):
    """A result larger than the byte budget is an error observation; at most the budget plus one row
    (max_columns * max_value_len bytes) is converted, within the time limit."""
    state, _ = env.reset(0, _task(env, "shop-01"))
    bound = env.max_result_bytes + sql_query.DEFAULT_MAX_COLUMNS * sql_query.DEFAULT_MAX_VALUE_LEN
    tracemalloc.start()
    try:
        t0 = time.monotonic()
        state, obs, reward, done, info = env.step(state, f"```sql\n{query}\n```")
        elapsed = time.monotonic() - t0
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert obs.startswith("Error:") and info["valid"] and info["tool_error"] and not done, obs[:200]
    assert any(k in obs for k in ("result too large", "too many columns", "too big")), obs[:200]
    assert peak_bytes < bound + 1_000_000, peak_bytes
    assert elapsed < env.time_limit_s + 1.0, elapsed


def test_byte_budget_counts_text_and_blob_bytes(env):
    path = env.db_path(_task(env, "shop-01"))
    q = "SELECT x, zeroblob(1000), printf('%.*c', 1000, 'y') FROM " + _ROWS_100
    cols, rows, truncated = run_query(path, q, time_limit_s=2, max_rows=1000, max_result_bytes=100 * 2008)
    assert len(cols) == 3 and len(rows) == 100 and not truncated
    assert rows[0] == (1, bytes(1000), "y" * 1000)
    with pytest.raises(QueryError, match="result too large: more than 200799 bytes"):
        run_query(path, q, time_limit_s=2, max_rows=1000, max_result_bytes=100 * 2008 - 1)
    with pytest.raises(QueryError, match="too many columns"):
        run_query(path, "SELECT " + ", ".join(["1"] * 9), time_limit_s=2, max_rows=10, max_columns=8)
    with pytest.raises(ValueError, match="max_result_bytes"):
        SQLEnv(cache_dir=env.cache_dir, max_result_bytes=0)


def test_time_limit_covers_fetching(env):
    """A query too short for the progress handler to fire still meets the deadline in the fetch loop."""
    path = env.db_path(_task(env, "shop-01"))
    with pytest.raises(QueryError, match="time limit of 1e-06s exceeded"):
        run_query(path, "SELECT 1", time_limit_s=1e-6, max_rows=10)
    assert run_query(path, "SELECT 1", time_limit_s=2, max_rows=10)[1] == [(1,)]


@pytest.mark.parametrize("query", [
    "SELECT fts3_tokenizer('simple')",  # returns a host pointer
    "SELECT FTS3_TOKENIZER('porter')",
    "SELECT load_extension('/tmp/evil.so')",
    "SELECT sqlite_compileoption_get(0)",
    "SELECT fts5_source_id()",
    "SELECT name FROM customers WHERE sqlite_log(1, name) IS NULL",
    "SELECT readfile('/etc/passwd')",
])
def test_functions_outside_the_allow_list_are_refused(env, query):
    state, _ = env.reset(0, _task(env, "shop-01"))
    state, obs, reward, done, info = env.step(state, f"```sql\n{query}\n```")
    assert obs.startswith("Error:") and info["tool_error"] and not done, obs
    assert "is not allowed" in obs or "no such function" in obs, obs
    _, obs, reward, done, info = env.step(state, f"<answer>{query}</answer>")
    assert reward == 0.0 and done and info["error"]


def test_ordinary_functions_are_allowed(env):
    path = env.db_path(_task(env, "shop-01"))
    run = lambda q: run_query(path, q, time_limit_s=2, max_rows=100)[1]  # noqa: E731
    assert run("SELECT upper('ab'), lower('AB'), length('abc'), substr('abcd', 2, 2), round(1.26, 1), abs(-3), "
               "coalesce(NULL, 4), ifnull(NULL, 5), iif(1, 6, 7), printf('%03d', 8), instr('xyz', 'z'), "
               "replace('aa', 'a', 'b'), trim('  t '), typeof(1.5), hex('A'), nullif(1, 1), "
               "julianday('2024-01-02') - julianday('2024-01-01'), strftime('%Y', '2024-05-01'), "
               "date('2024-01-31', '+1 day'), json_extract('{\"a\": 9}', '$.a'), '{\"b\": 10}' ->> '$.b', "
               "CAST(sqrt(16) AS INTEGER), max(1, 2), min(1, 2)") == [
        ("AB", "ab", 3, "bc", 1.3, 3, 4, 5, 6, "008", 3, "bb", "t", "real", "41", None, 1.0, "2024", "2024-02-01",
         9, 10, 4, 2, 1)]
    assert run("SELECT count(*), count(DISTINCT category), sum(stock), total(stock), min(price), max(price), "
               "round(avg(price), 4), length(group_concat(name, '|')) FROM products") == [
        (13, 4, 370, 370.0, 15.0, 249.0, 71.2908, 190)]
    ranked = run("SELECT name, row_number() OVER (ORDER BY price DESC, id), rank() OVER (ORDER BY price DESC) "
                 "FROM products ORDER BY 2 LIMIT 3")
    assert [r[1] for r in ranked] == [1, 2, 3] and ranked[0][2] == 1
    assert {f.lower() for f in sql_query.ALLOWED_FUNCTIONS} == set(sql_query.ALLOWED_FUNCTIONS)
    assert not {"fts3_tokenizer", "load_extension", "readfile", "writefile"} & sql_query.ALLOWED_FUNCTIONS


# ------------------------------------------------------------------------------------------------
# Hostile queries: the time limit is hard and temporary data is bounded
# ------------------------------------------------------------------------------------------------
HARD_LIMIT = {
    # one VM step of ~20 s in-process: the progress handler never runs
    "printf-width": "SELECT printf('%.*c', 2000000000, 'x')",
    "three-specifiers": "SELECT printf('%.*c%.*c%.*c', 2000000000, 'x', 2000000000, 'y', 2000000000, 'z')",
    # a UNION's distinct set of 30 kB rows: in-process it wrote ~250 MB of temp files within 2 s
    "wide-recursive-cte": "WITH RECURSIVE r(i, s) AS (SELECT 1, randomblob(30000) UNION SELECT i + 1, "
                          "randomblob(30000) FROM r WHERE i < 1000000) SELECT count(*) FROM r",
}
HEAP_BOUND = sql_query.DEFAULT_HEAP_LIMIT_BYTES + 32 * 2 ** 20  # the heap cap plus the interpreter's own memory


@pytest.fixture(scope="module")
def hard_env(tmp_path_factory):
    env = SQLEnv(cache_dir=tmp_path_factory.mktemp("sqlcache"), time_limit_s=1.0)
    state, _ = env.reset(0, env.tasks("all")[0])
    assert env.step(state, "```sql\nSELECT 1\n```")[1].startswith("1")  # a query process is up
    yield env
    env.close()


def _cpu_s_of_this_process_and_children():
    """CPU seconds used so far by this process (all threads) and by its live child processes."""
    total = time.process_time()
    me = os.getpid()
    for tid in os.listdir(f"/proc/{me}/task"):
        try:
            kids = open(f"/proc/{me}/task/{tid}/children").read().split()
        except OSError:
            continue
        for pid in kids:
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _step_within(env, state, query, budget_s):
    """env.step on a thread, given `budget_s` seconds: (result or None, seconds, the thread)."""
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=env.step(state, f"```sql\n{query}\n```")), daemon=True)
    t0 = time.monotonic()
    worker.start()
    worker.join(budget_s)
    return result.get("r"), time.monotonic() - t0, worker


@pytest.mark.parametrize("name", sorted(HARD_LIMIT))
def test_the_time_limit_is_hard_and_nothing_keeps_running(hard_env, name):
    env = hard_env
    state, _ = env.reset(0, _task(env, "shop-01"))
    threads = threading.active_count()
    res, elapsed, worker = _step_within(env, state, HARD_LIMIT[name], env.time_limit_s + 0.5)
    assert not worker.is_alive() and elapsed <= env.time_limit_s + 0.5, elapsed
    _, obs, reward, done, info = res
    assert obs.startswith("Error:") and info["valid"] and info["tool_error"] and not done, obs
    assert "time limit of 1s exceeded" in obs or "out of memory" in obs, obs
    time.sleep(0.3)  # a replacement query process finishes starting
    cpu0 = _cpu_s_of_this_process_and_children()
    time.sleep(0.5)
    assert _cpu_s_of_this_process_and_children() - cpu0 < 0.15, "a thread or process is still burning a core"
    assert threading.active_count() == threads
    state, _ = env.reset(0, _task(env, "shop-01"))  # and the env still answers
    assert env.step(state, "```sql\nSELECT 2\n```")[1].startswith("2")


def test_temporary_data_is_bounded(tmp_path):
    """The wide CTE's temp data stays in the query process's capped heap: its peak resident memory is
    under the cap plus the interpreter's own, and it writes nothing (no temp files). Its own env, with a time limit
    that a loaded machine cannot reach before the heap cap."""
    env = SQLEnv(cache_dir=tmp_path / "sqlcache", time_limit_s=30.0)
    try:
        state, _ = env.reset(0, _task(env, "shop-01"))
        assert env.step(state, "```sql\nSELECT 1\n```")[1].startswith("1")  # the databases are written
        env.close()  # a fresh query process, so that its peak memory and writes are this query's
        state, _ = env.reset(0, _task(env, "shop-01"))
        _, obs, _, _, _ = env.step(state, f"```sql\n{HARD_LIMIT['wide-recursive-cte']}\n```")
        assert "out of memory" in obs, obs
        (pid,) = env.queries.pids()
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status"))
        peak = int(status["VmHWM"].split()[0]) * 1024
        written = int(dict(line.split(": ") for line in open(f"/proc/{pid}/io").read().splitlines())["wchar"])
    finally:
        env.close()
    assert peak < HEAP_BOUND, peak
    assert written < 10_000, written  # answer lines only


def test_in_process_queries_keep_their_soft_limit(env):
    """run_query (trusted queries) still stops an ordinary long query at its time limit."""
    path = env.db_path(_task(env, "shop-01"))
    t0 = time.monotonic()
    with pytest.raises(QueryError, match="time limit"):
        run_query(path, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
                  time_limit_s=0.3, max_rows=10)
    assert time.monotonic() - t0 < 1.3


def test_every_host_env_returns_valid_text():
    """HostEnv makes each subclass's observations and info["error"] valid text (lone surrogates escaped),
    however the subclass built them, and leaves valid text as it is."""
    class Echo(host.HostEnv):
        def reset(self, seed, task):
            return 0, "start \ud800"

        def step(self, state, action_text):
            return state + 1, f"you said {action_text}", 0.0, False, {"error": action_text}

    class Louder(Echo):
        def step(self, state, action_text):
            s, obs, r, d, info = super().step(state, action_text + "\udfff")
            return s, obs + "!", r, d, info

    assert Echo().reset(0, None) == (0, "start \\ud800")
    _, obs, _, _, info = Louder().step(0, "a\ud83d")
    assert obs == "you said a\\ud83d\\udfff!" and info["error"] == "a\\ud83d\\udfff"
    assert host.valid_text("ok \U0001F600 \u00e9") == "ok \U0001F600 \u00e9"
