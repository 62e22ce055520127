"""`trainer.make_train` on a tiny env and a tiny random Qwen3: evaluation, the log, checkpoints and a resume that
goes on where the first run stopped (equal to an uninterrupted run), a checkpoint of other settings refused; the
anchor rule checked before training; `config_file` round trips; the loggers."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent import config_file
from jaxagent.envs.jax import EnvStep, Obs, check_anchor_rule, parse_action, render
from jaxagent.models import Qwen3Config, init
from jaxagent.rl import LossSettings, RLSettings
from jaxagent.rl.checkpoint import CheckpointError
from jaxagent.rl.loggers import JsonlLogger, Loggers, make_logger
from jaxagent.rl.loop import iteration_warnings
from jaxagent.rollout import RolloutConfig, env_text, make_rollout_fn
from jaxagent.trainer import TrainConfig, make_train

WORDS = ("want", "a", "b", ".")
ACTIONS = ("<answer>a</answer>", "<answer>b</answer>")


class Pick:
    """Task 0 or 1; the observation names it ("want b ."); one valid reply ends the episode, reward 1 when it
    names the wanted letter. The anchor is the task and whether the episode is done. env_params True: a bug that
    lets every reply, even an invalid one, win at once."""

    jittable = True

    def __init__(self, codec, post_step_anchor=False):
        self.codec, self.ids, self.post = codec, jnp.asarray(codec.word_ids(WORDS)), post_step_anchor

    def observe(self, s):
        return Obs(*render(self.codec, self.ids[jnp.stack([0, 1 + s["task"], 3])], 3))

    def reset(self, key, task, env_params):
        s = dict(task=jnp.asarray(task, jnp.int32), done=jnp.asarray(False), win=jnp.asarray(False))
        return s, self.observe(s)

    def step(self, s, action_tokens_M, action_len, env_params):
        a, free = parse_action(self.codec, action_tokens_M, action_len), jnp.asarray(env_params, bool)
        move = ((a >= 0) | free) & ~s["done"]
        new = dict(task=s["task"], done=s["done"] | move, win=s["win"] | (move & ((a == s["task"]) | free)))
        info = dict(valid=a >= 0, action=a, success=new["win"], anchor=self.anchor(new if self.post else s))
        reward = (new["win"] & ~s["win"]).astype(jnp.float32)
        return EnvStep(new, self.observe(new), reward, new["done"], info)

    def anchor(self, s):
        return s["task"] * 2 + s["done"].astype(jnp.int32)


def sample_tasks(key, n):            # both letters among any two tasks
    return (jnp.arange(n) + jax.random.randint(key, (), 0, 2)) % 2


RCFG = RolloutConfig(t_max=2, max_action_tokens=4, max_context=96)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    text = env_text(WORDS, ACTIONS, "say the wanted letter", tokenizer_dir=tmp_path_factory.mktemp("tok"))
    cfg = Qwen3Config(vocab_size=text.tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    params = init(cfg, jax.random.key(0))
    ids = jnp.asarray([text.tokenizer.encode(a)[0] for a in ACTIONS])   # one token each
    params["embed"] = params["embed"].at[ids].multiply(20.0)   # favour the answers: valid replies, both letters
    run = make_rollout_fn(cfg, Pick(text.codec), text, RCFG, env_params=jnp.asarray(False))
    return text, cfg, params, run


# n_tasks x group_size = eval_tasks x eval_samples: the evaluation's rollouts reuse the training's program
CONFIG = TrainConfig(iterations=3, rl=RLSettings(n_tasks=2, group_size=4), lr=3e-3, eval_every=1, eval_tasks=4,
                     eval_samples=2, eval_ks=(1, 2), eval_tiers=(2,),
                     loss=LossSettings(agg_mode="seq-mean-token-mean"))


class Crash(Exception):
    pass


class CrashAt:
    """A logger that keeps what it is given and stops the run at iteration `step` (after that iteration's
    update, before its checkpoint)."""

    def __init__(self, step):
        self.step, self.seen = step, {}

    def log(self, step, metrics):
        self.seen[step] = dict(metrics)
        if step == self.step:
            raise Crash(step)

    def warning(self, step, message):
        pass

    def close(self):
        pass


@pytest.mark.slow  # ~40 s on a quiet 2-core host, 65 s loaded: two runs, each compiling the rollout or the train step
def test_train_evaluates_logs_and_resumes_where_it_stopped(setup, tmp_path):
    """A 3-iteration run stopped during iteration 2 (its checkpoint of iteration 1 kept), then run again: it goes
    on from iteration 2 and computes what the uninterrupted run computed there."""
    _, cfg, params, run = setup
    crash = CrashAt(2)
    logger = Loggers(JsonlLogger(tmp_path / "metrics.jsonl"), crash)
    with pytest.raises(Crash):
        make_train(CONFIG, cfg, rollout_fn=run, sample_tasks_fn=sample_tasks, directory=tmp_path, logger=logger)(
            jax.random.key(1), params)
    for m in crash.seen.values():   # Pass@k at the one tier, every iteration (eval_every 1); k = 1 never above k = 2
        assert 0 <= m["eval/pass@1/T=2"] <= m["eval/pass@2/T=2"] <= 1
        assert 0 <= m["zero_advantage_groups"] < 1 and m["grad_norm"] > 0
    resumed = make_train(CONFIG, cfg, rollout_fn=run, sample_tasks_fn=sample_tasks, directory=tmp_path)(
        jax.random.key(1), params)
    assert [m["iteration"] for m in resumed.history] == [2]     # a restart from scratch would run 0, 1, 2
    assert int(resumed.state.data_pos) == 3 * CONFIG.rl.n_tasks
    # the restored state held the params, optimizer moments, rng and data position of iteration 1's end
    again, before = resumed.history[0], crash.seen[2]
    for k in ("loss", "grad_norm", "entropy", "success_rate", "eval/pass@1/T=2"):
        assert again[k] == pytest.approx(before[k], abs=1e-5), k
    assert np.abs(np.asarray(resumed.state.params["embed"]) - np.asarray(params["embed"])).max() > 0
    # the log: iteration 2's line of the stopped run dropped, then written again by the resumed one
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows if "warning" not in r] == [0, 1, 2]
    # a checkpoint trained with another learning rate is refused, naming it
    with pytest.raises(CheckpointError, match="lr"):
        make_train(dataclasses.replace(CONFIG, lr=1e-4), cfg, rollout_fn=run, sample_tasks_fn=sample_tasks,
                   directory=tmp_path)(jax.random.key(1), params)


def test_an_env_where_every_episode_wins_is_flagged(setup, tmp_path):
    """Every group's rewards equal: zero_advantage_groups 1, a zero gradient in every update, one warning line per
    iteration in the log (and echoed)."""
    _, cfg, params, run = setup
    free = dataclasses.replace(run, env_params=jnp.asarray(True))      # same program, the bug switched on
    echoed = []
    config = dataclasses.replace(CONFIG, iterations=1, eval_every=-1)
    logger = JsonlLogger(tmp_path / "m.jsonl", echo=echoed.append)
    result = make_train(config, cfg, rollout_fn=free, sample_tasks_fn=sample_tasks, logger=logger)(
        jax.random.key(1), params)
    m = result.history[0]
    assert (m["success_rate"], m["zero_advantage_groups"], m["zero_gradient_updates"], m["grad_norm"]) == (
        1.0, 1.0, 1.0, 0.0)
    assert echoed == ["warning: iteration 0: every update had a zero gradient (grad_norm 0.0): nothing was learned; "
                      "zero_advantage_groups 1.00, success_rate 1.00"]
    assert [("warning" in r) for r in logger.read()] == [True, False]


def test_train_checks_the_anchor_rule_first(setup):
    text, cfg, params, _ = setup
    env = Pick(text.codec, post_step_anchor=True)
    check_anchor_rule(Pick(text.codec), 1, False)        # the rule kept: no error
    with pytest.raises(ValueError) as e:
        check_anchor_rule(env, 1, False)
    assert str(e.value) == ("check_anchor_rule: Pick.step's info['anchor'] is 3, the anchor of the state AFTER the "
                            "step, after action 0 from a state whose anchor is 2: info['anchor'] must be "
                            "anchor(state) of the state BEFORE the step (GiGPO groups the steps taken from equal "
                            "states by it)")
    run = make_rollout_fn(cfg, env, text, RCFG, env_params=jnp.asarray(False))
    with pytest.raises(ValueError, match="^make_train: Pick.step's info.'anchor'. is"):
        make_train(CONFIG, cfg, rollout_fn=run, sample_tasks_fn=sample_tasks)(jax.random.key(0), params)


def test_make_train_and_config_refuse_bad_input(setup):
    _, cfg, _, run = setup
    with pytest.raises(TypeError, match="make_train: config must be a TrainConfig; got dict"):
        make_train({}, cfg, rollout_fn=run, sample_tasks_fn=sample_tasks)
    with pytest.raises(ValueError, match="TrainConfig.eval_ks must be k in .1, eval_samples=2."):
        TrainConfig(eval_samples=2, eval_ks=(1, 4))
    with pytest.raises(ValueError, match="TrainConfig.iterations must be a positive int, got 0"):
        TrainConfig(iterations=0)


def test_config_file_round_trip_and_overrides(tmp_path):
    path = tmp_path / "train.toml"
    path.write_text(config_file.dumps(CONFIG, header="a test run"))
    text = path.read_text()
    assert text.startswith("# a test run\n") and "\n[rl]\n" in text and "\n[loss]\n" in text
    assert config_file.load(TrainConfig, path) == CONFIG
    over = config_file.load(TrainConfig, path, ["rl.estimator='rloo'", "lr=1e-4", "eval_ks=[1]", "iterations=7"])
    assert (over.rl.estimator, over.lr, over.eval_ks, over.iterations) == ("rloo", 1e-4, (1,), 7)
    assert over.rl.group_size == 4 and over.loss == CONFIG.loss
    # a partial file: what it leaves out keeps its default
    assert config_file.load(TrainConfig, {"rl": {"n_tasks": 3}}) == TrainConfig(rl=RLSettings(n_tasks=3))
    for bad, msg in ((["rl.n_task=3"], r"RLSettings has no field rl.n_task \(its fields:"),
                      (["iterations='many'"], "iterations must be an int, got 'many'"),
                      (["rl.estimator='ppo2'"], "rl: estimator must be one of"),
                      (["lr"], "override 'lr' must look like key=value")):
        with pytest.raises(ValueError, match=msg):
            config_file.load(TrainConfig, path, bad)
    with pytest.raises(ValueError, match="config file .*nothing.toml: cannot be read"):
        config_file.load(TrainConfig, tmp_path / "nothing.toml")


def test_loggers(tmp_path):
    echoed = []
    lg = make_logger("jsonl", tmp_path, echo=echoed.append)
    for step in range(3):
        lg.log(step, {"loss": 0.5 * step, "n": step, "name": "skipped", "bad": float("nan")})
    lg.warning(2, "nothing learned")
    assert echoed == ["warning: iteration 2: nothing learned"]
    lg.resume(1)     # a run restored from the checkpoint of iteration 0 rewrites iterations 1 and 2
    assert lg.read() == [{"step": 0, "loss": 0.0, "n": 0, "bad": None}]
    with pytest.raises(ValueError, match="logger must name some of jsonl, tensorboard, wandb; got 'csv'"):
        make_logger("csv", tmp_path)
    assert isinstance(make_logger(["jsonl"], tmp_path), JsonlLogger)


def test_iteration_warnings_name_the_figures():
    grpo = RLSettings(n_tasks=2, group_size=4)
    assert iteration_warnings({"zero_advantage_groups": 0.5, "zero_gradient_updates": 0.0}, grpo) == []
    flat = iteration_warnings({"zero_advantage_groups": 1.0, "zero_gradient_updates": 0.0, "success_rate": 1.0},
                              grpo)
    assert flat == ["every group's 4 rewards were equal (zero_advantage_groups 1.00, success_rate 1.00): grpo has no "
                    "policy-gradient signal this iteration"]
    dead = iteration_warnings({"zero_advantage_groups": 1.0, "zero_gradient_updates": 1.0, "success_rate": 0.0}, grpo)
    assert len(dead) == 1 and dead[0].startswith("every update had a zero gradient (grad_norm 0.0)")
    # PPO learns from its critic's values even when the rewards are equal: no warning from the groups
    assert iteration_warnings({"zero_advantage_groups": 1.0}, RLSettings(estimator="ppo", group_size=1)) == []


def test_pass_kt_of_rows_tiers_and_estimator():
    """A scripted rollout_fn: sample z of task 0 succeeds when z < T, task 1 never. Pass@k per task is
    1 - C(Z - c, k) / C(Z, k) (Chen et al. 2021), then the mean over the two tasks."""
    from types import SimpleNamespace

    from jaxagent.eval.pass_drivers import pass_kt_of
    calls = []

    def scripted(params, rows, budgets, key):
        calls.append(np.asarray(rows).tolist())
        win = (np.asarray(rows) == 0) & (np.arange(8) % 4 < np.asarray(budgets))
        return SimpleNamespace(success=jnp.asarray(win), status=jnp.zeros(8, jnp.int32),
                               turns_used=jnp.asarray(budgets), generated_tokens=jnp.ones(8, jnp.int32))

    with pytest.raises(ValueError, match="^t_max: give it, or a rollout_fn that holds its RolloutConfig"):
        pass_kt_of(scripted, None, jnp.arange(2), jax.random.key(0), n_samples=4, ks=(1, 2))
    res = pass_kt_of(scripted, None, jnp.arange(2), jax.random.key(0), n_samples=4, ks=(1, 2), tiers=(1, 2),
                     t_max=2, n_boot=10)
    assert calls == [[0, 0, 0, 0, 1, 1, 1, 1]] * 2
    np.testing.assert_allclose(res["grid"], [[0.125, 0.25], [0.25, (1 - 1 / 6) / 2]], atol=1e-6)
    assert res["tiers"].tolist() == [1, 2] and res["pass_at_t_k"] == 2


def test_every_frozenlake_preset_round_trips_through_toml():
    """(Host presets are not files yet: some hold None where the field's default is a number.)"""
    import tomllib

    from jaxagent.study.frozenlake.presets import PRESETS, Preset
    for name, preset in PRESETS.items():
        assert config_file.load(Preset, tomllib.loads(config_file.dumps(preset))) == preset, name
