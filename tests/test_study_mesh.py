"""The study's stages on a (data, fsdp, tensor) = (2, 2, 2) mesh of the 8 fake CPU devices (conftest) with
bfloat16 compute: a miniature of the `ci` preset (one arm, one seed, two iterations), an interruption
after the first checkpoint and the resume, the placement of every array on the mesh, and the errors for
a mesh that does not fit the devices."""
import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import cli
from jaxagent import sharding
from jaxagent.models import qwen3
from jaxagent.rl import checkpoint as ckpt_lib
from jaxagent.study import run_dir, stages
from jaxagent.study.common import arms as arms_lib
from jaxagent.study.frozenlake.presets import PRESETS
from jaxagent.study.common.policies import save_policy
from jaxagent.study.frozenlake.run import Run
from jaxagent.study.frozenlake.train import make_runtime, run_arm, run_base

MESH = (2, 2, 2)
ITERATIONS = 2
# The oracle-process-reward arm: a random-init policy never succeeds, so outcome-only GRPO would have zero
# advantages (and gradients); the per-turn process reward gives every update a real gradient.
ARM = "grpo_oracle"


class Interrupted(Exception):
    pass


def _preset(**kw):
    kw = {"arms": (ARM,), "seeds": (0,), "iterations": ITERATIONS, "mesh": MESH, "compute_dtype": "bfloat16", **kw}
    return dataclasses.replace(PRESETS["ci"], **kw)


@pytest.fixture(scope="module")
def mesh_run(tmp_path_factory):
    """Base (random init, saved and reloaded onto the mesh) -> RL arm killed after checkpoint 0 -> resumed."""
    root = str(tmp_path_factory.mktemp("runs"))
    run = Run(_preset(), root)
    assert run.mesh is not None and dict(run.mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    # The base stage as for a checkpoint preset: a saved policy, loaded onto the mesh (skips the SFT compile).
    save_policy(os.path.join(run.path("base"), "policy"), run.cfg, qwen3.init(run.cfg, jax.random.key(3)))
    run_dir.mark_done(run.path("base"))
    base = run_base(run, log=lambda *_: None)

    seen = {"rollout_params": [], "rollout_tasks": [], "train_step_kw": [], "rollout_mesh": []}
    real_rollout, real_make_step, real_save = stages.rollout, arms_lib.build_train_step, ckpt_lib.save

    def spy_rollout(params, *args, **kw):
        seen["rollout_params"].append(jax.tree.leaves(params))
        seen["rollout_tasks"].append(jax.tree.leaves(args[4]))
        seen["rollout_mesh"].append(jax.sharding.get_abstract_mesh())
        return real_rollout(params, *args, **kw)

    def spy_make_step(cfg, opt, ls, memory, mesh=None, **kw):
        seen["train_step_kw"].append(dict(memory=memory, mesh=mesh, **kw))
        return real_make_step(cfg, opt, ls, memory, mesh, **kw)

    def save_then_stop(manager, state, *args, **kw):  # the process "dies" right after checkpoint 0
        real_save(manager, state, *args, **kw)
        raise Interrupted

    logs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stages, "rollout", spy_rollout)
        mp.setattr(arms_lib, "build_train_step", spy_make_step)
        rt = make_runtime(run, run.arm_settings(ARM))
        mp.setattr(ckpt_lib, "save", save_then_stop)
        with pytest.raises(Interrupted):
            run_arm(run, ARM, 0, base, runtime=rt, log=logs.append)
        mp.setattr(ckpt_lib, "save", real_save)
        params = run_arm(run, ARM, 0, base, runtime=rt, log=logs.append)
    return dict(run=run, base=base, params=params, rt=rt, seen=seen, logs=logs,
                out=os.path.join(run.dir, "arms", ARM, "seed0"))


def _assert_on_rules(params, cfg, mesh):
    """Every leaf sharded exactly as sharding.RULES says, over all 8 devices; some leaves really split."""
    axes = qwen3.logical_axes(cfg)
    want = jax.tree.map(lambda ax, x: sharding.spec_for(ax, x.shape, mesh), axes, params, is_leaf=sharding.is_axes)
    split = 0
    for (path, x), spec in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(
            want, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))):
        name = jax.tree_util.keystr(path)
        assert isinstance(x.sharding, jax.sharding.NamedSharding), name
        assert x.sharding.mesh.shape == mesh.shape, name
        assert len(x.sharding.device_set) == 8, name
        assert x.sharding.spec == spec, (name, x.sharding.spec, spec)
        split += not x.sharding.is_fully_replicated
    assert split >= 3


@pytest.mark.slow
def test_base_and_trained_params_are_sharded_per_rules(mesh_run):
    run = mesh_run["run"]
    _assert_on_rules(mesh_run["base"], run.cfg, run.mesh)
    _assert_on_rules(mesh_run["params"], run.cfg, run.mesh)
    emb = mesh_run["params"]["embed"]
    assert emb.dtype == jnp.float32  # master weights stay f32 under bf16 compute
    # the saved policy reloads onto the mesh, equal to the returned params
    reloaded = run.load_policy(mesh_run["out"])
    _assert_on_rules(reloaded, run.cfg, run.mesh)
    np.testing.assert_array_equal(np.asarray(reloaded["embed"]), np.asarray(emb))


@pytest.mark.slow
def test_rollouts_and_train_step_get_the_mesh_and_bf16(mesh_run):
    seen = mesh_run["seen"]
    assert len(seen["train_step_kw"]) == 1
    kw = seen["train_step_kw"][0]
    assert kw["mesh"] is mesh_run["run"].mesh and kw["memory"].compute_dtype == jnp.bfloat16
    # one rollout per iteration (ITERATIONS in all, over the two processes' lifetimes)
    assert len(seen["rollout_params"]) == ITERATIONS
    for leaves, tasks, mesh in zip(seen["rollout_params"], seen["rollout_tasks"], seen["rollout_mesh"]):
        assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}
        assert all(len(x.sharding.device_set) == 8 for x in leaves)
        assert any(not x.sharding.is_fully_replicated for x in leaves)
        # sharding.ROLLOUT_RULES: split over tensor only, no weight gathered over fsdp while decoding
        assert all("fsdp" not in jax.tree.leaves(tuple(x.sharding.spec)) for x in leaves)
        # the rollout runs under the mesh context, so the model pins its activations to the batch axes
        assert not mesh.empty and dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
        # the episodes are split over data x fsdp
        assert any(x.sharding.spec and x.sharding.spec[0] == ("data", "fsdp") for x in tasks)


@pytest.mark.slow
def test_metrics_finite_and_resume_continues_where_it_stopped(mesh_run):
    out = mesh_run["out"]
    assert any("resuming at iteration 1" in str(m) for m in mesh_run["logs"])
    assert os.path.isfile(os.path.join(out, "DONE"))
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))  # each iteration once
    for r in rows:
        for k in ("loss", "pg_loss", "grad_norm", "entropy", "drift", "success_rate", "mean_generated_tokens"):
            assert math.isfinite(r[k]), (k, r[k])
        assert r["skipped"] == 0.0 and r["tokens"] > 0 and r["grad_norm"] > 0
    dyn = [json.loads(line) for line in open(os.path.join(out, "dynamics.jsonl"))]
    assert [d["step"] for d in dyn] == [-1, 0, 1]
    assert all(0.0 <= d["r_single"] <= 1.0 for d in dyn)
    assert ckpt_lib.all_steps(os.path.join(out, "ckpt")) == [0, 1]


@pytest.mark.slow
def test_checkpoint_restores_into_the_mesh_shardings(mesh_run):
    run, rt = mesh_run["run"], mesh_run["rt"]
    abstract = stages.abstract_arm_state(rt, run.cfg, jax.random.key(0), mesh_run["base"])
    state = ckpt_lib.restore_latest(os.path.join(mesh_run["out"], "ckpt"), abstract, cfg=run.cfg)
    assert int(state.data_pos) == ITERATIONS * run.preset.n_tasks
    _assert_on_rules(state.params, run.cfg, run.mesh)
    for x, sh in zip(jax.tree.leaves(state), jax.tree.leaves(rt.state_shardings)):
        assert x.sharding.is_equivalent_to(sh, x.ndim)
    np.testing.assert_array_equal(np.asarray(state.params["embed"]), np.asarray(mesh_run["params"]["embed"]))


def test_mesh_that_does_not_fit_the_devices_is_a_clear_error(tmp_path):
    assert jax.device_count() == 8
    with pytest.raises(ValueError, match=r"\(2, 2, 1\).*jax\.device_count\(\) = 8"):
        Run(_preset(mesh=(2, 2, 1)), str(tmp_path))
    with pytest.raises(ValueError, match="data x fsdp = 8"):
        Run(_preset(mesh=(2, 4, 1), n_tasks=1), str(tmp_path))
    with pytest.raises(ValueError, match="compute_dtype"):
        Run(_preset(compute_dtype="bf17"), str(tmp_path))
    assert not os.listdir(tmp_path)  # nothing written before the checks


def test_one_device_mesh_runs_unsharded(tmp_path):
    run = Run(dataclasses.replace(PRESETS["ci"], mesh=(1, 1, 1)), str(tmp_path))
    assert run.mesh is None and run.compute_dtype == jnp.float32
    assert stages.resolve_compute_dtype(run.compute_dtype) is None  # float32: nothing cast, the plain program


def test_cli_mesh_dtype_and_distributed_options():
    p = cli.parser("t")
    args = p.parse_args(["--preset", "ci", "--mesh", "2", "2", "2", "--compute-dtype", "bfloat16"])
    preset = cli.preset_from(args)
    assert preset.mesh == (2, 2, 2) and preset.compute_dtype == "bfloat16"
    assert not args.distributed
    with pytest.raises(SystemExit, match="needs --distributed"):
        cli.preset_from(p.parse_args(["--preset", "ci", "--process-id", "1"]))
    assert "jax.distributed.initialize()" in p.format_help()
