"""Grading modes as the benchmarks grade, and each refusal, on fixtures the tests write in the real layouts:
Spider (train_spider.json, dev.json, tables.json, database/<db>/<db>.sqlite), InterCode-SQL (ic_spider_dev.json
and a train file over the same databases), DeepCoder-Preview records (TACO, PrimeIntellect, LiveCodeBench test
formats) and APPS records (question, solutions and input_output as JSON strings)."""

import json
import math

import pytest

from jaxagent.envs.host import sandbox, sql_grading
from jaxagent.envs.host.code_env import CodeEnv
from jaxagent.envs.host.datasets import DataError
from jaxagent.envs.host.sandbox import SandboxLimits
from jaxagent.envs.host.sql_env import SQLEnv
from tests.test_host_datasets import spider_record, write_db

MODE = "namespaces" if sandbox.strong_isolation_problem() is None else "unsafe-rlimits-only"
LIMITS = SandboxLimits(wall_s=8.0, per_call_s=1.0, mode=MODE)
SINGER = ("CREATE TABLE singer (Singer_ID int, Name text, Country text, Age int);"
          "INSERT INTO singer VALUES (1, 'Joe Sharp', 'Netherlands', 52), (2, 'Timbaland', 'United States', 32), "
          "(3, 'Justin Brown', 'France', 29), (4, 'Rose White', 'France', 41), (5, 'Ann Lee', 'Korea', 25);"
          # a name stored as bytes that are not UTF-8 (Latin-1 'Zoé'), as some Spider databases hold
          "INSERT INTO singer VALUES (6, CAST(X'5A6FE9' AS TEXT), 'Chile', 30);")


GOLDS = {  # Spider dev questions over concert_singer
    "cols": "SELECT Name, Age FROM singer WHERE Country = 'France'",
    "distinct": "SELECT DISTINCT Country FROM singer",
    "order": "SELECT Name FROM singer WHERE Age < 50 ORDER BY Age",
    "latin1": "SELECT Name FROM singer WHERE Country = 'Chile'",
    "five": "SELECT Name FROM singer WHERE Age < 60 AND Singer_ID < 6 ORDER BY Singer_ID",
}


@pytest.fixture(scope="module")
def spider_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("spider")
    write_db(root, "concert_singer", SINGER)
    write_db(root, "pets_1", "CREATE TABLE Pets (PetID int, PetType text); "
                             "INSERT INTO Pets VALUES (1, 'cat'), (2, 'dog');")
    (root / "train_spider.json").write_text(json.dumps([spider_record("pets_1", "SELECT count(*) FROM Pets", "Pets?")]))
    (root / "dev.json").write_text(json.dumps([spider_record("concert_singer", q, k) for k, q in GOLDS.items()]))
    (root / "tables.json").write_text(json.dumps([{"db_id": "concert_singer"}, {"db_id": "pets_1"}]))
    return root


def _score(env, question, answer):
    task = next(t for t in env.tasks("all") if t.question == question)
    state, _ = env.reset(0, task)
    _, obs, reward, done, info = env.step(state, f"<answer>{answer}</answer>")
    assert done and info["success"] == (reward == 1.0), obs
    return reward


def test_spider_official_execution_accuracy(spider_dir, tmp_path):
    env = SQLEnv(cache_dir=tmp_path, data=spider_dir)
    assert env.grader.mode == "spider" and "column permutations accepted" in env.grading_note
    assert env.report.left_out == {} and len(env.tasks("test")) == 5  # the Latin-1 name decoded leniently, kept
    assert _score(env, "cols", "SELECT Age, Name FROM singer WHERE Country = 'France'") == 1.0  # columns permuted
    assert _score(env, "cols", "SELECT Name FROM singer WHERE Country = 'France'") == 0.0
    assert _score(env, "distinct", "SELECT Country FROM singer") == 1.0  # DISTINCT removed from both queries
    assert _score(env, "order", "SELECT Name FROM singer WHERE Age < 50 ORDER BY Age DESC") == 0.0
    assert _score(env, "order", "SELECT Name FROM singer WHERE Age < 50 ORDER BY Age") == 1.0
    assert _score(env, "latin1", "SELECT Name FROM singer WHERE Singer_ID = 6") == 1.0
    assert env.gold_rows(next(t for t in env.tasks("all") if t.question == "latin1")) == [("Zo",)]  # é dropped
    assert _score(env, "latin1", "SELECT 'Zo'") == 1.0
    env.close()
    keep = SQLEnv(cache_dir=tmp_path, data=spider_dir, keep_distinct=True)
    assert _score(keep, "distinct", "SELECT Country FROM singer") == 0.0
    assert _score(keep, "distinct", "SELECT DISTINCT Country FROM singer") == 1.0
    keep.close()
    exact = SQLEnv(cache_dir=tmp_path, data=spider_dir, grading="exact")
    assert _score(exact, "cols", "SELECT Age, Name FROM singer WHERE Country = 'France'") == 0.0
    exact.close()
    strict = SQLEnv(cache_dir=tmp_path, data=spider_dir, lenient_text=False)
    # without lenient decoding the two questions whose gold rows hold the Latin-1 name are dropped
    assert strict.report.left_out == {"field query: gold query fails (a text value is not valid UTF-8)": 2}
    strict.close()


def test_spider_result_eq_is_the_official_rule():
    gold = [(1, "a", 2.5, None), (2, "b", 3.0, "x"), (2, "b", 3.0, "x")]
    perm = [(r[2], r[0], r[3], r[1]) for r in gold]
    assert sql_grading.spider_result_eq(gold, perm, order_matters=True)  # 4 columns, permuted
    assert sql_grading.spider_result_eq(gold, perm[::-1], order_matters=False)
    assert not sql_grading.spider_result_eq(gold, perm[::-1], order_matters=True)
    assert not sql_grading.spider_result_eq(gold, perm[:2] + [perm[0]], order_matters=False)  # a bag, not a set
    assert not sql_grading.spider_result_eq([(1, 2)], [(1, 2, 3)], order_matters=False)
    assert sql_grading.spider_result_eq([], [], order_matters=True)
    assert not sql_grading.spider_result_eq([(1,)], [(1.0000001,)], order_matters=False)  # values exactly
    assert sql_grading.remove_distinct("SELECT DISTINCT a, COUNT(distinct b) FROM t WHERE c = 'distinct'") == \
        "SELECT  a, COUNT( b) FROM t WHERE c = 'distinct'"
    assert sql_grading.spider_postprocess("SELECT a FROM t WHERE b > = 2") == "SELECT a FROM t WHERE b >= 2"


def test_intercode_reward_is_row_iou_times_kendall_tau():
    gold = [(i, f"n{i}") for i in range(5)]
    assert sql_grading.intercode_reward(gold[:4], gold) == 0.8  # 4 of 5 rows, in order
    assert sql_grading.intercode_reward(gold, gold) == 1.0
    assert sql_grading.intercode_reward(gold[::-1], gold) == -1.0  # every pair in the other order
    assert sql_grading.intercode_reward([gold[1], gold[0]] + gold[2:], gold) == 0.8  # tau = (9 - 1) / 10
    assert sql_grading.intercode_reward([], []) == 1.0 and sql_grading.intercode_reward([(9,)], gold) == 0.0
    assert sql_grading.intercode_reward(gold[:1], gold) == 0.2  # one shared row: tau undefined, IoU alone
    assert math.isnan(sql_grading.kendall_tau_b(["a"], ["a"]))


@pytest.fixture(scope="module")
def intercode_dir(spider_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("intercode")
    (root / "database").symlink_to(spider_dir / "database")
    rows = [{"db": "concert_singer", "gold": GOLDS["five"], "query": "Singers under 60, by id?", "hardness": "easy",
             "db_tables": {"singer": ["Singer_ID", "Name", "Country", "Age"]}},
            {"db": "pets_1", "gold": "SELECT PetType FROM Pets", "query": "Pet types?", "hardness": "easy",
             "db_tables": {"Pets": ["PetID", "PetType"]}}]
    (root / "ic_spider_dev.json").write_text(json.dumps(rows, indent=2))
    return root


def test_intercode_reward_no_schema_prompt_and_the_test_question_warning(intercode_dir, tmp_path):
    env = SQLEnv(cache_dir=tmp_path, data=intercode_dir)
    assert env.grader.mode == "intercode" and env.report.layout == "InterCode-SQL"
    # a single dev file is the benchmark's own evaluation set: the split by database trains on some of it
    assert len(env.report.warnings) == 1 and "training on the benchmark's test questions" in env.report.warnings[0]
    assert "ic_spider_dev.json" in env.report.warnings[0] and "WARNING" in env.report.summary()
    q = "Singers under 60, by id?"
    assert _score(env, q, "SELECT Name FROM singer WHERE Age < 60 AND Singer_ID < 5 ORDER BY Singer_ID") == 0.8
    # reversed: tau compares the row texts position by position, ranked as text (InterCode's kendalltau call):
    # gold names rank 2 5 3 4 1 by text, reversed 1 4 3 5 2: 8 concordant pairs, 2 discordant, tau 0.6
    assert _score(env, q, GOLDS["five"] + " DESC") == 0.6
    assert _score(env, q, GOLDS["five"]) == 1.0
    env.close()
    bare = SQLEnv(cache_dir=tmp_path, data=intercode_dir, schema_in_prompt=False)
    task = next(t for t in bare.tasks("all") if t.db == "concert_singer")
    assert "CREATE TABLE" not in bare.system_prompt(task) and "sqlite_master" in bare.system_prompt(task)
    assert bare.upper_bound_turns(task) == 2 and "no schema in the prompt" in bare.grading_note
    state, _ = bare.reset(0, task)
    first, second = bare.ground_truth_actions(task)
    state, obs, reward, done, _ = bare.step(state, first)
    assert "CREATE TABLE singer" in obs and not done
    assert bare.step(state, second)[2] == 1.0
    bare.close()
    (intercode_dir / "ic_spider_train.json").write_text(json.dumps([{"db": "pets_1", "gold": "SELECT 2",
                                                                     "query": "Two?"}]))
    split = SQLEnv(cache_dir=tmp_path, data=intercode_dir)
    assert split.report.warnings == [] and [t.question for t in split.tasks("train")] == ["Two?"]
    split.close()
    (intercode_dir / "ic_spider_train.json").unlink()


def test_a_folder_with_both_layouts_is_refused_unless_the_format_is_named(spider_dir, intercode_dir, tmp_path):
    both = tmp_path / "both"
    both.mkdir()
    for f in ("train_spider.json", "dev.json", "tables.json"):
        (both / f).write_text((spider_dir / f).read_text())
    (both / "ic_spider_dev.json").write_text((intercode_dir / "ic_spider_dev.json").read_text())
    (both / "database").symlink_to(spider_dir / "database")
    with pytest.raises(DataError, match="ambiguous.*ic_spider_dev.json.*--data-format spider or --data-format"):
        SQLEnv(cache_dir=tmp_path, data=both)
    spider = SQLEnv(cache_dir=tmp_path, data=both, data_format="spider")
    assert spider.report.layout == "Spider" and len(spider.tasks("test")) == 5
    spider.close()
    ic = SQLEnv(cache_dir=tmp_path, data=both, data_format="intercode")
    assert ic.report.layout == "InterCode-SQL" and len(ic.tasks("all")) == 2 and ic.grader.mode == "intercode"
    ic.close()
    with pytest.raises(DataError, match="--data-format must be one of"):
        SQLEnv(cache_dir=tmp_path, data=both, data_format="apps")
    # Spider records read as InterCode: every record refused by the field it lacks
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "ic_x.json").write_text((spider_dir / "dev.json").read_text())
    (tmp_path / "only" / "database").symlink_to(spider_dir / "database")
    with pytest.raises(DataError, match="no usable question.*5 field db: missing or not text"):
        SQLEnv(cache_dir=tmp_path, data=tmp_path / "only")


def test_host_study_names_the_format_and_refuses_an_ambiguous_folder(spider_dir, intercode_dir, tmp_path):
    from experiments import host_study
    from jaxagent.study.host.presets import data_env
    from jaxagent.study.run_dir import InvalidSettings

    both = tmp_path / "both"
    both.mkdir()
    (both / "dev.json").write_text((spider_dir / "dev.json").read_text())
    (both / "ic_spider_dev.json").write_text((intercode_dir / "ic_spider_dev.json").read_text())
    (both / "database").symlink_to(spider_dir / "database")

    def preset(*argv):
        return host_study.preset_from(host_study.parser().parse_args(["--preset", "ci-sql", "--data", str(both),
                                                                      *argv]))

    with pytest.raises(InvalidSettings, match="ambiguous"):
        data_env(preset())
    env = data_env(preset("--data-format", "spider", "--grading", "exact"))
    assert env.report.layout == "Spider" and env.grader.mode == "exact"
    env.close()
    for argv, why in ((["--data-format", "deepcoder"], "not a format of the sql domain"),
                      (["--require-reference"], "takes no option 'require_reference'")):
        with pytest.raises(SystemExit, match=why):
            preset(*argv)
    for argv, why in ((["--preset", "ci-sql", "--data-format", "spider"], "needs --data"),
                      (["--preset", "ci-code", "--require-reference"], "is for --data")):
        with pytest.raises(SystemExit, match=why):
            host_study.preset_from(host_study.parser().parse_args(argv))


# ------------------------------------------------------------------------------------------------ coding
ADD = "def add(a, b):\n    return a + b\n"


def _deepcoder(problem, tests, solutions=None):
    rec = {"problem": problem, "tests": json.dumps(tests), "starter_code": "", "metadata": "{}"}
    if solutions is not None:
        rec["solutions"] = solutions
    return rec


def _apps(question, io, solutions):
    return {"problem_id": 1, "question": question, "solutions": json.dumps(solutions),
            "input_output": json.dumps(io), "difficulty": "introductory", "url": "x", "starter_code": ""}


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("code")
    train = [
        # PrimeIntellect: function-call tests with list-wrapped outputs; DeepCoder grades them with TACO's grader
        _deepcoder("Write add(a, b).", [{"input": [1, 2], "output": [3], "type": "function_call", "fn_name": "add"},
                                        {"input": [5, 6], "output": [11], "type": "function_call", "fn_name": "add"}],
                   [ADD]),
        # LiveCodeBench functional: compared exactly, so the same wrapped outputs fail the same solution
        _deepcoder("Write add(a, b) too.", [{"input": "1\n2", "output": "[3]", "testtype": "functional",
                                             "metadata": {"func_name": "add"}}], [ADD]),
        # APPS fields in a DeepCoder file: read from input_output
        _apps("Print a + b.", {"inputs": ["1 2\n"], "outputs": ["3\n"]}, ["a, b = map(int, input().split())\n"
                                                                          "print(a + b)\n"]),
        {"problem": "No tests at all.", "solutions": [ADD]},
        ["not", "a", "record"],
    ]
    test = [_deepcoder("Print the maximum.", [{"input": "3\n1 5 2\n", "output": "5\n", "testtype": "stdin"}])]
    (root / "train.jsonl").write_text("\n".join(json.dumps(r) for r in train) + "\n")
    (root / "lcb_test.json").write_text(json.dumps(test))
    return root


def test_deepcoder_taco_leniency_apps_fields_and_refusals_by_field(code_dir, tmp_path):
    env = CodeEnv(limits=LIMITS, data=code_dir, cache_dir=tmp_path, max_parallel=2)
    train = env.tasks("train")
    assert [t.id for t in train] == ["train-0", "train-2"] and train[0].lenient_list and train[0].reference
    assert train[1].style == "stdin" and "input_output" not in train[1].prompt
    assert env.report.left_out == {
        "field solutions: no solution passes its tests": 1,   # LiveCodeBench's exact comparison
        "field tests (or input_output): missing": 1,
        "record: not a JSON object (no fields)": 1,
        "field solutions: no reference solution": 1,         # the test file's problem, require_reference=True
    }, env.report.left_out
    assert all(r.startswith(("field ", "record:")) for r in env.report.left_out)
    assert "TACO" in env.grading_note
    for task in train:
        state, _ = env.reset(0, task)
        assert env.step(state, f"```python\n{task.reference}```")[2] == 1.0
    state, _ = env.reset(0, train[0])
    assert env.step(state, "```python\ndef add(a, b):\n    return [a + b]\n```")[2] == 1.0  # [v] answers [v] too
    kept = CodeEnv(limits=LIMITS, data=code_dir, cache_dir=tmp_path, require_reference=False)
    assert [t.id for t in kept.tasks("test")] == ["lcb_test-0"] and kept.tasks("test")[0].reference == ""


def test_apps_format_reads_input_output_and_deepcoder_format_tests(code_dir, tmp_path):
    apps = CodeEnv(limits=LIMITS, data=code_dir / "train.jsonl", cache_dir=tmp_path, data_format="apps")
    assert [t.id for t in apps.tasks("all")] == ["train-2"] and apps.report.layout == "APPS problems"
    assert apps.report.left_out["field input_output: missing"] == 3  # the DeepCoder records and the one without
    deep = CodeEnv(limits=LIMITS, data=code_dir / "train.jsonl", cache_dir=tmp_path, data_format="deepcoder")
    assert [t.id for t in deep.tasks("all")] == ["train-0"] and deep.report.left_out["field tests: missing"] == 2
    with pytest.raises(DataError, match="--data-format must be one of"):
        CodeEnv(data=code_dir, data_format="spider")


def test_require_reference_follows_the_preset_unless_named(code_dir, tmp_path, monkeypatch):
    import dataclasses

    from jaxagent.study.host.presets import HOST_PRESETS, data_env

    monkeypatch.setenv("JAXAGENT_CACHE", str(tmp_path))
    from_checkpoint = data_env(dataclasses.replace(HOST_PRESETS["ci-code"], data=str(code_dir)))  # no SFT
    assert [t.id for t in from_checkpoint.tasks("test")] == ["lcb_test-0"]
    sft = data_env(dataclasses.replace(HOST_PRESETS["code-toy"], data=str(code_dir)))  # SFT reads the references
    assert sft.report.left_out["field solutions: no reference solution"] == 1
    named = data_env(dataclasses.replace(HOST_PRESETS["ci-code"], data=str(code_dir),
                                         env_options=(("require_reference", True),)))
    assert named.report.left_out["field solutions: no reference solution"] == 1
