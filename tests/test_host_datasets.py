"""Dataset loaders on fixtures the tests write in the official release formats: Spider (train_spider.json /
dev.json / tables.json + database/<db>/<db>.sqlite), InterCode-SQL (ic_spider_*.json over the same databases) and
DeepCoder-Preview-Dataset records (TACO, LiveCodeBench, PrimeIntellect test formats, as JSONL). Splits, the tasks
left out and their counts, episodes on the loaded tasks, the verdict cache; and the built-in sets' sizes."""

import json
import sqlite3

import pytest

from jaxagent.envs.host import datasets, sandbox
from jaxagent.envs.host.code_env import CodeEnv, outcome_matches, stdout_matches
from jaxagent.envs.host.datasets import held_out_by_hash
from jaxagent.envs.host.sandbox import SandboxLimits
from jaxagent.envs.host.sql_env import SQLEnv
from jaxagent.envs.host.tasks import CodeTask

MODE = "namespaces" if sandbox.strong_isolation_problem() is None else "unsafe-rlimits-only"
LIMITS = SandboxLimits(wall_s=8.0, per_call_s=1.0, mode=MODE)


# ------------------------------------------------------------------------------------------------ SQL fixtures
DBS = {  # db id -> (schema + rows)
    "concert_singer": "CREATE TABLE singer (Singer_ID int, Name text, Country text, Age int);"
                      "INSERT INTO singer VALUES (1, 'Joe Sharp', 'Netherlands', 52), "
                      "(2, 'Timbaland', 'United States', 32),"
                      "(3, 'Justin Brown', 'France', 29), (4, 'Rose White', 'France', 41);",
    "pets_1": "CREATE TABLE Pets (PetID int, PetType text, pet_age int, weight real);"
              "INSERT INTO Pets VALUES (2001, 'cat', 3, 12.0), (2002, 'dog', 2, 13.4), (2003, 'dog', 1, 9.3);",
    "world_1": "CREATE TABLE country (Code text, Name text, Continent text, Population int);"
               "INSERT INTO country VALUES ('ABW', 'Aruba', 'North America', 103000), ('AFG', 'Afghanistan', 'Asia', "
               "22720000), ('FRA', 'France', 'Europe', 59225700);",
}


def write_db(root, db, script):
    d = root / "database" / db
    d.mkdir(parents=True)
    conn = sqlite3.connect(d / f"{db}.sqlite")
    conn.executescript(script)
    conn.commit()
    conn.close()


def spider_record(db, query, question):
    """A Spider record as the release writes it (the parsed `sql` left minimal)."""
    return {"db_id": db, "query": query, "query_toks": query.split(), "query_toks_no_value": query.lower().split(),
            "question": question, "question_toks": question.split(), "sql": {"select": [False, []]}}


@pytest.fixture(scope="module")
def spider_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("spider")
    for db, script in DBS.items():
        write_db(root, db, script)
    train = [spider_record("concert_singer", "SELECT count(*) FROM singer", "How many singers do we have?"),
             spider_record("concert_singer", "SELECT Name FROM singer WHERE Country = 'France' ORDER BY Age",
                     "Names of French singers, youngest first?"),
             spider_record("pets_1", "SELECT count(*) FROM Pets WHERE PetType = 'dog'", "How many dogs are there?"),
             spider_record("pets_1", "SELECT nonexistent FROM Pets", "A broken gold query."),          # left out
             spider_record("no_such_db", "SELECT 1", "A question on a missing database."),          # left out
             {"db_id": "pets_1", "query": "SELECT 1"}]                                         # left out: no question
    dev = [spider_record("world_1", "SELECT Name FROM country WHERE Continent = 'Asia'",
                         "Which countries are in Asia?"),
           spider_record("world_1", "SELECT sum(Population) FROM country", "What is the total population?")]
    (root / "train_spider.json").write_text(json.dumps(train, indent=2))
    (root / "dev.json").write_text(json.dumps(dev, indent=2))
    (root / "tables.json").write_text(json.dumps([{"db_id": db} for db in DBS]))
    return root


@pytest.fixture(scope="module")
def spider_env(spider_dir, tmp_path_factory):
    return SQLEnv(cache_dir=tmp_path_factory.mktemp("c"), data=spider_dir, time_limit_s=1.0)


def test_spider_splits_and_left_out(spider_env):
    env = spider_env
    train, test = env.tasks("train"), env.tasks("test")
    assert [t.id for t in train] == ["train_spider-0", "train_spider-1", "train_spider-2"]
    assert [t.id for t in test] == ["dev-0", "dev-1"] and {t.db for t in test} == {"world_1"}
    assert env.tasks("all") == train + test
    r = env.report
    assert (r.layout, r.records, r.kept) == ("Spider", 8, {"train": 3, "test": 2})
    assert sum(r.left_out.values()) == 3 and r.left_out["field db_id: database file missing"] == 1
    assert any(k.startswith("field query: gold query fails") for k in r.left_out)
    assert r.examples["field db_id: database file missing"] == ["train_spider-4"]
    assert train[1].ordered and not train[0].ordered
    assert "3 train" in r.summary() and "left out" in r.summary()


def test_spider_episodes_score_against_the_gold_result(spider_env):
    env = spider_env
    for task in env.tasks("all"):
        state, obs = env.reset(0, task)
        assert obs == task.question and "CREATE TABLE" in env.system_prompt(task)
        _, _, reward, done, _ = env.step(state, f"<answer>{task.gold}</answer>")
        assert (reward, done) == (1.0, True), task.id
        assert env.upper_bound_turns(task) == 1
    asia = env.tasks("test")[0]
    state, _ = env.reset(0, asia)
    state, obs, _, _, _ = env.step(state, "```sql\nSELECT Name FROM country\n```")
    assert "Afghanistan" in obs and "(3 rows)" in obs
    assert env.step(state, "<answer>SELECT Name FROM country</answer>")[2] == 0.0
    order = env.tasks("train")[1]
    wrong = order.gold.replace("ORDER BY Age", "ORDER BY Age DESC")
    assert env.step(env.reset(0, order)[0], f"<answer>{wrong}</answer>")[2] == 0.0


def test_intercode_sql_single_file_splits_by_database(tmp_path):
    dbs = {f"db_{i}": "CREATE TABLE t (x int); INSERT INTO t VALUES (1), (2), (3);" for i in range(12)}
    for db, script in dbs.items():
        write_db(tmp_path, db, script)
    rows = [{"db": db, "gold": "SELECT x FROM t WHERE x > 1", "query": f"Values above 1 in {db}?", "hardness": "easy",
             "db_tables": {"t": ["x"]}} for db in dbs]
    rows.append({"db": "db_0", "gold": "SELECT y FROM t", "query": "broken", "hardness": "easy", "db_tables": {}})
    (tmp_path / "ic_spider_dev.json").write_text(json.dumps(rows, indent=2))
    env = SQLEnv(cache_dir=tmp_path / "cache", data=tmp_path)
    held = {db for db in dbs if held_out_by_hash(db)}
    assert held and held != set(dbs)  # both splits are populated by these names
    assert {t.db for t in env.tasks("test")} == held and not held & {t.db for t in env.tasks("train")}
    assert env.report.layout == "InterCode-SQL" and "by database" in env.report.split_rule
    assert sum(env.report.left_out.values()) == 1 and len(env.tasks("all")) == 12
    task = env.tasks("all")[0]
    assert task.question.startswith("Values above 1") and task.gold == "SELECT x FROM t WHERE x > 1"
    assert env.step(env.reset(0, task)[0], f"<answer>{task.gold}</answer>")[2] == 1.0


def test_intercode_sql_train_and_dev_files(spider_dir, tmp_path):
    (tmp_path / "database").symlink_to(spider_dir / "database")
    dev = [{"db": "world_1", "gold": "SELECT count(*) FROM country", "query": "How many countries?",
            "hardness": "easy", "db_tables": {"country": ["Code", "Name", "Continent", "Population"]}}]
    train = [{"db": "pets_1", "gold": "SELECT max(weight) FROM Pets", "query": "Heaviest pet's weight?",
              "hardness": "easy", "db_tables": {"Pets": ["PetID", "PetType", "pet_age", "weight"]}}]
    (tmp_path / "ic_spider_dev.json").write_text(json.dumps(dev))
    (tmp_path / "train_ic.jsonl").write_text("\n".join(json.dumps(r) for r in train) + "\n")
    env = SQLEnv(cache_dir=tmp_path / "cache", data=tmp_path, max_tasks=5)
    assert [t.db for t in env.tasks("train")] == ["pets_1"] and [t.db for t in env.tasks("test")] == ["world_1"]
    assert "by file name" in env.report.split_rule


def test_sql_data_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist.*nothing is downloaded"):
        SQLEnv(cache_dir=tmp_path, data=tmp_path / "missing")
    with pytest.raises(ValueError, match="no InterCode-SQL .* files .and no Spider files"):
        SQLEnv(cache_dir=tmp_path, data=tmp_path)
    (tmp_path / "dev.json").write_text("[{bad json")
    with pytest.raises(ValueError, match="dev.json: not JSON"):
        SQLEnv(cache_dir=tmp_path, data=tmp_path)
    (tmp_path / "dev.json").write_text(json.dumps([spider_record("nowhere", "SELECT 1", "q")]))
    with pytest.raises(ValueError, match="no usable question"):
        SQLEnv(cache_dir=tmp_path, data=tmp_path)
    with pytest.raises(ValueError, match="options of a data directory"):
        SQLEnv(cache_dir=tmp_path, max_tasks=3)


# ------------------------------------------------------------------------------------------------ coding fixtures
ADD_STDIN = "a, b = map(int, input().split())\nprint(a + b)\n"
ADD_WRONG = "a, b = map(int, input().split())\nprint(a - b)\n"


def _deepcoder(problem, tests, solutions=None, starter="", metadata=None):
    """A DeepCoder-Preview-Dataset record: `tests` and `metadata` as JSON strings, as the release stores them."""
    rec = {"problem": problem, "tests": json.dumps(tests), "starter_code": starter,
           "metadata": json.dumps(metadata or {})}
    if solutions is not None:
        rec["solutions"] = solutions
    return rec


TRAIN = [
    # TACO, standard input, one wrong and one right solution: the right one becomes the reference
    _deepcoder("Read two integers and print their sum.",
               {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]}, [ADD_WRONG, ADD_STDIN]),
    # TACO, function call: outputs wrapped in a list, as TACO writes them
    _deepcoder("Write add(a, b).", {"inputs": [[1, 2], [5, 6]], "outputs": [[3], [11]], "fn_name": "add"},
               ["def add(a, b):\n    return a + b\n"]),
    # PrimeIntellect, stdin_stdout, 20 tests: only the 15 with the longest inputs are kept
    _deepcoder("Print the square of n.", [{"input": f"{n}\n", "output": f"{n * n}\n", "type": "stdin_stdout"}
                                          for n in range(20)],
               ["n = int(input())\nprint(n * n)\n"]),
    # no solution passes
    _deepcoder("Print hello.", {"inputs": [""], "outputs": ["hello\n"]}, ["print('goodbye')\n"]),
    # unreadable tests, mixed test types: left out
    {"problem": "Broken.", "tests": "{not json", "solutions": ["print(1)"]},
    _deepcoder("Mixed.", [{"input": "1", "output": "1", "testtype": "stdin"},
                          {"input": "1", "output": "1", "testtype": "functional"}], ["print(1)"]),
]
TEST = [
    # LiveCodeBench, functional, with a Solution starter: arguments one JSON value per line
    _deepcoder("Return the indices of the two numbers that add up to target.",
               [{"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional",
                 "metadata": {"func_name": "twoSum"}},
                {"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional",
                 "metadata": {"func_name": "twoSum"}}],
               ["class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
                "        seen = {}\n        for i, x in enumerate(nums):\n            if target - x in seen:\n"
                "                return [seen[target - x], i]\n            seen[x] = i\n"],
               starter="class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        "),
    # LiveCodeBench stdin without solutions: no reference
    _deepcoder("Print the maximum of the numbers.", [{"input": "3\n1 5 2\n", "output": "5\n", "testtype": "stdin"}]),
]


@pytest.fixture(scope="module")
def deepcoder_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepcoder")
    (root / "train.jsonl").write_text("\n".join(json.dumps(r) for r in TRAIN) + "\n")
    (root / "test.json").write_text(json.dumps(TEST))
    return root


@pytest.fixture(scope="module")
def code_env(deepcoder_dir, tmp_path_factory):
    return CodeEnv(limits=LIMITS, data=deepcoder_dir, cache_dir=tmp_path_factory.mktemp("verify"), max_parallel=2)


def test_deepcoder_splits_references_and_left_out(code_env):
    env = code_env
    train, test = env.tasks("train"), env.tasks("test")
    assert [t.id for t in train] == ["train-0", "train-1", "train-2"] and [t.id for t in test] == ["test-0"]
    assert [t.style for t in train + test] == ["stdin", "call", "stdin", "call"]
    assert train[0].reference.strip() == ADD_STDIN.strip()  # the wrong first solution was tried and rejected
    assert train[1].lenient_list and not test[0].lenient_list and test[0].entry_point == "twoSum"
    # the 15 longest inputs (ties: the earlier), in their order
    assert [a[0] for a, _ in train[2].tests] == [f"{n}\n" for n in (*range(5), *range(10, 20))]
    r = env.report
    assert (r.records, r.kept) == (8, {"train": 3, "test": 1})
    assert r.left_out == {"field solutions: no solution passes its tests": 1, "field tests: unreadable": 1,
                          "field tests: tests of mixed or unknown types": 1,
                          "field solutions: no reference solution": 1}, r.left_out
    assert r.examples["field solutions: no reference solution"] == ["test-1"] and "by file name" in r.split_rule


def test_deepcoder_episodes(code_env):
    env = code_env
    for task in env.tasks("all"):
        state, obs = env.reset(0, task)
        assert obs == task.prompt
        _, obs, reward, done, info = env.step(state, f"```python\n{task.reference}```")
        assert (reward, done, info["pass_rate"]) == (1.0, True, 1.0), (task.id, obs)
        assert env.upper_bound_turns(task) == 1
    add = env.tasks("train")[0]
    assert "standard input" in env.system_prompt(add)
    state, _ = env.reset(0, add)
    state, obs, reward, done, info = env.step(state, f"```python\n{ADD_WRONG}```")
    assert (reward, done) == (0.0, False) and obs.startswith("Passed 1/3 tests.")  # 0 0 -> 0 passes
    assert "on the input '1 2\\n' the expected output is '3\\n' but your program printed '-1\\n'" in obs
    two = env.tasks("test")[0]
    assert "Starter code:" in two.prompt and "Solution" in env.system_prompt(two)
    state, _ = env.reset(0, two)
    _, obs, reward, _, _ = env.step(state, "```python\ndef twoSum(nums, target):\n    return [0, 1]\n```")
    assert reward == 0.0 and "twoSum([3, 2, 4], 6) should return [1, 2] but returned [0, 1]" in obs
    _, obs, _, _, _ = env.step(env.reset(0, two)[0], "```python\ndef other():\n    pass\n```")
    assert "failed to run: NameError" in obs


def test_deepcoder_verdicts_are_cached(deepcoder_dir, code_env, tmp_path, monkeypatch):
    cache = tmp_path / "verify"
    CodeEnv(limits=LIMITS, data=deepcoder_dir, cache_dir=cache)
    assert json.loads((cache / "code-verify.json").read_text())
    monkeypatch.setattr("jaxagent.envs.host.code_env.run_calls", lambda *a, **k: pytest.fail("ran the sandbox"))
    again = CodeEnv(limits=LIMITS, data=deepcoder_dir, cache_dir=cache)
    assert [t.reference for t in again.tasks("all")] == [t.reference for t in code_env.tasks("all")]


def test_deepcoder_options_and_errors(deepcoder_dir, tmp_path):
    env = CodeEnv(limits=LIMITS, data=deepcoder_dir, cache_dir=tmp_path, require_reference=False, max_tasks=1)
    assert [t.id for t in env.tasks("train")] == ["train-0"] and [t.id for t in env.tasks("test")] == ["test-0"]
    env = CodeEnv(limits=LIMITS, data=deepcoder_dir / "test.json", cache_dir=tmp_path, require_reference=False)
    assert [t.reference == "" for t in env.tasks("all")] == [False, True]  # the unverified task is kept
    assert env.report.kept == {"train": 0, "test": 2, "test without a reference (unverified)": 1}
    with pytest.raises(ValueError, match="does not exist"):
        CodeEnv(data=tmp_path / "missing")
    with pytest.raises(ValueError, match="max_tests"):
        CodeEnv(data=deepcoder_dir, max_tests=0)
    with pytest.raises(ValueError, match="options of a data directory"):
        CodeEnv(max_tests=3)
    (tmp_path / "bad.jsonl").write_text('{"problem": "x"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl: line 2 is not JSON"):
        CodeEnv(data=tmp_path / "bad.jsonl")


def test_stdout_and_value_comparison():
    assert stdout_matches("3\n", "3") and stdout_matches("1 2  \n3\n\n", "1 2\n3")
    assert stdout_matches("0.3333333\n", "0.333333333") and stdout_matches("1e3", "1000")
    assert not stdout_matches("3\n4", "3") and not stdout_matches("0.34", "0.333333") and not stdout_matches(3, "3")
    assert stdout_matches("nan", "nan ") and not stdout_matches("nan", "0")
    lenient = CodeTask(id="x", entry_point="f", prompt="", reference="", tests=(), style="call", lenient_list=True)
    strict = CodeTask(id="y", entry_point="f", prompt="", reference="", tests=(), style="call")
    assert outcome_matches(lenient, 3, [3]) and not outcome_matches(strict, 3, [3])
    assert outcome_matches(strict, [3], [3])


# ------------------------------------------------------------------------------------------------ built-in sets
def test_builtin_sets_have_200_held_out_tasks(tmp_path):
    sql = SQLEnv(cache_dir=tmp_path)
    code = CodeEnv()
    for env in (sql, code):
        train, test = env.tasks("train"), env.tasks("test")
        assert len(test) >= 200 and len(env.tasks("test_constants")) >= 150, (type(env).__name__, len(test))
        assert len(train) >= 500, (type(env).__name__, len(train))
        assert len({t.id for t in env.tasks("all")}) == len(env.tasks("all"))
    assert sql.report.left_out == {} and sql.report.kept == {"train": 554, "test": 426, "test_constants": 168}
    assert {t.db for t in sql.tasks("test")} >= {"library", "gen-concerts", "gen-garden"}
    assert len(code.tasks("all")) == 1069 and code.report.records == 16 + 1059
    assert code.report.kept == {"train": 638, "test": 222, "test_constants": 209}
    assert sum(code.report.left_out.values()) == 1059 - 1053  # parameter sets whose tests would be too weak


def test_cache_root_and_data_path(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXAGENT_CACHE", str(tmp_path))
    assert datasets.cache_root() == tmp_path
    with pytest.raises(ValueError, match="no data path"):
        datasets.data_path("", "x")


# ------------------------------------------------------------------------------------------------ presets
def test_presets_miniatures_stay_small_and_real_scales_evaluate_200(tok):
    from jaxagent.study.host.presets import HOST_PRESETS
    from jaxagent.study.host import stages as host_stages

    from jaxagent.envs.host.data.code_tasks import CODE_TASKS
    from jaxagent.envs.host.data.sql_tasks import SQL_TASKS

    held = {"ci-sql": [t["id"] for t in SQL_TASKS if t["db"] == "library"],  # held out whole: a database
            "ci-code": [t["id"] for t in CODE_TASKS][3::4]}  # every 4th hand-written problem
    for name, hand, n_train, n_held in (("ci-sql", SQL_TASKS, 4, 5), ("ci-code", CODE_TASKS, 2, 2)):
        w = host_stages.make_host_world(HOST_PRESETS[name].task, tok)
        ids = [t["id"] for t in hand]  # the hand-written tasks come first, in order
        assert [t.id for t in w.train_tasks] == [i for i in ids if i not in held[name]][:n_train], name
        assert [t.id for t in w.heldout_tasks] == held[name][:n_held], name
    for name in ("qwen3-0.6b-1gpu-sql", "qwen3-8b-v5p-code"):
        w = host_stages.make_host_world(HOST_PRESETS[name].task, tok)
        assert len(w.heldout_tasks) == 200 and (w.min_turns(w.heldout_tasks) == 1).all(), name
        assert HOST_PRESETS[name].eval.n_samples >= max(HOST_PRESETS[name].eval.ks)


def test_data_option(spider_dir, deepcoder_dir, tmp_path, monkeypatch):
    import dataclasses

    from experiments import host_study
    from jaxagent.study.host.presets import HOST_PRESETS, data_env, data_problem

    monkeypatch.setenv("JAXAGENT_CACHE", str(tmp_path))
    env = data_env(dataclasses.replace(HOST_PRESETS["ci-sql"], data=str(spider_dir)))
    assert isinstance(env, SQLEnv) and env.report.layout == "Spider" and len(env.tasks("test")) == 2
    assert data_env(HOST_PRESETS["ci-sql"]) is None
    code = dataclasses.replace(HOST_PRESETS["ci-code"], data=str(deepcoder_dir))
    assert data_problem(code) is None
    bfcl = dataclasses.replace(HOST_PRESETS["ci-bfcl"], data=str(spider_dir))
    assert "for the sql and code domains" in data_problem(bfcl)
    with pytest.raises(ValueError, match="for the sql and code domains"):
        data_env(bfcl)
    args = host_study.parser().parse_args(["--preset", "ci-sql", "--data", str(spider_dir)])
    assert host_study.preset_from(args).data == str(spider_dir)
    for argv, why in ((["--preset", "ci-bfcl", "--data", str(spider_dir)], "for the sql and code domains"),
                      (["--preset", "ci-sql", "--data", str(tmp_path / "nope")], "does not exist")):
        with pytest.raises(SystemExit, match=why):
            host_study.preset_from(host_study.parser().parse_args(argv))
