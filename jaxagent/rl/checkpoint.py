"""Train-state checkpoints with orbax: params, optimizer state, step, PRNG key, data position and a
JSON metadata item (the model config), kept N deep, written atomically.

Layout: <directory>/<step>/{state, metadata}. 'state' is the TrainState as a dict
(`StandardSave`; the typed PRNG key as its raw `jax.random.key_data`, re-wrapped on restore with the
saved key implementation); 'metadata' (`JsonSave`) holds the Qwen3Config fields of the policy (and
critic), the step, the data position and caller extras.

Atomicity: orbax writes each step into '<step>.orbax-checkpoint-tmp*' and renames it to '<step>'
only once every item is written (rename is atomic on a local filesystem), so a process killed
mid-save leaves a temporary directory that `latest_step` never lists: the previous checkpoint
stays the latest. Keep-N: `max_to_keep` deletes the oldest steps after each save.

Restoring checks the saved config JSON against the expected one (and the saved parameter shapes
against the target's) before reading any array, so a checkpoint of another model shape fails with
a ValueError naming the differing fields instead of an error deep inside tensorstore.
This is one of the library's explicit I/O modules (it writes files; it never prints).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Union

import jax
import orbax.checkpoint as ocp

from jaxagent.models.config import Qwen3Config
from jaxagent.rl.train_step import TrainState

STATE_ITEM, META_ITEM = "state", "metadata"
FORMAT_VERSION = 1
_FIELDS = ("params", "opt_state", "step", "rng", "data_pos", "ref_params", "critic_params",
           "critic_opt_state")


def make_manager(directory: Union[str, os.PathLike], *, max_to_keep: Optional[int] = 3,
                 save_interval_steps: int = 1, async_save: bool = False,
                 read_only: bool = False) -> ocp.CheckpointManager:
    """An orbax CheckpointManager for train states (keep the newest `max_to_keep`; None = all).

    async_save=True returns from `save` while arrays are written in the background (call
    `manager.wait_until_finished()` before exiting); the default blocks, so a saved step is on disk.
    """
    if max_to_keep is not None and max_to_keep < 1:
        raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
    if save_interval_steps < 1:
        raise ValueError(f"save_interval_steps must be >= 1, got {save_interval_steps}")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, save_interval_steps=save_interval_steps,
        enable_async_checkpointing=async_save, create=not read_only, read_only=read_only)
    handlers = {STATE_ITEM: ocp.StandardCheckpointHandler(), META_ITEM: ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(os.fspath(os.path.abspath(directory)), options=options,
                                 item_handlers=handlers)


def _state_tree(state: TrainState) -> dict:
    tree = {f: getattr(state, f) for f in _FIELDS if getattr(state, f) is not None}
    tree["rng"] = jax.random.key_data(state.rng)
    return tree


def _config_dict(cfg: Optional[Qwen3Config]) -> Optional[dict]:
    return None if cfg is None else dataclasses.asdict(cfg)


def save(manager: ocp.CheckpointManager, state: TrainState, cfg: Qwen3Config, *,
         step: Optional[int] = None, critic_cfg: Optional[Qwen3Config] = None,
         extra: Optional[dict] = None, force: bool = False) -> bool:
    """Saves `state` as checkpoint `step` (default: state.step); True if a checkpoint was written
    (the manager's save interval may skip a step unless force=True). `extra` must be JSON-able."""
    if not isinstance(cfg, Qwen3Config):
        raise ValueError(f"cfg must be a Qwen3Config, got {type(cfg).__name__}")
    step = int(state.step) if step is None else int(step)
    meta = {"format": FORMAT_VERSION, "model_config": _config_dict(cfg),
            "critic_config": _config_dict(critic_cfg), "step": step,
            "data_pos": int(state.data_pos), "rng_impl": str(jax.random.key_impl(state.rng)),
            "items": sorted(k for k in _state_tree(state)), "extra": extra or {}}
    saved = manager.save(step, args=ocp.args.Composite(
        **{STATE_ITEM: ocp.args.StandardSave(_state_tree(state)),
           META_ITEM: ocp.args.JsonSave(meta)}), force=force)
    return bool(saved)


def read_metadata(manager: ocp.CheckpointManager, step: Optional[int] = None) -> Optional[dict]:
    """The JSON metadata of `step` (default: the latest), or None when there is no checkpoint."""
    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    out = manager.restore(step, args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()}))
    return out[META_ITEM]


def _config_diff(saved: Optional[dict], expected: Qwen3Config) -> list[str]:
    if saved is None:
        return ["the checkpoint has no config"]
    exp = dataclasses.asdict(expected)
    keys = sorted(set(saved) | set(exp))
    return [f"{k}: checkpoint {saved.get(k, '<absent>')!r} vs expected {exp.get(k, '<absent>')!r}"
            for k in keys if saved.get(k) != exp.get(k)]


def _key_str(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _shapes_by_path(tree) -> dict[str, tuple]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: x is None)
    return {"/".join(_key_str(k) for k in path): tuple(getattr(x, "shape", ()))
            for path, x in flat if x is not None}


def _check_shapes(manager, step, target: dict, meta: dict):
    """Compares saved vs target shapes of the params-like items (plain nested dicts, so their paths
    are unambiguous); raises ValueError listing the differences."""
    saved_tree = manager.item_metadata(step)[STATE_ITEM]
    saved_tree = getattr(saved_tree, "tree", saved_tree)
    problems = []
    for item in ("params", "ref_params", "critic_params"):
        if item not in target:
            continue
        if item not in saved_tree:
            problems.append(f"the checkpoint has no {item!r}")
            continue
        saved, want = _shapes_by_path(saved_tree[item]), _shapes_by_path(target[item])
        for p in sorted(set(saved) | set(want)):
            if saved.get(p) != want.get(p):
                problems.append(f"{item}/{p}: checkpoint shape {saved.get(p, '<absent>')} vs "
                                f"expected {want.get(p, '<absent>')}")
    if problems:
        more = f" (and {len(problems) - 8} more)" if len(problems) > 8 else ""
        raise ValueError(
            f"checkpoint step {step} in {manager.directory} does not fit the target state: "
            + "; ".join(problems[:8]) + more
            + f". It was saved for model config {meta.get('model_config')}")


def _abstract(x):
    if isinstance(x, jax.ShapeDtypeStruct):
        if x.sharding is None:
            return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                        sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
        return x
    return ocp.utils.to_shape_dtype_struct(x)


def restore(manager: ocp.CheckpointManager, step: int, abstract_state: TrainState, *,
            cfg: Optional[Qwen3Config] = None,
            critic_cfg: Optional[Qwen3Config] = None) -> TrainState:
    """Restores checkpoint `step` into the structure, dtypes and shardings of `abstract_state`
    (ShapeDtypeStructs, e.g. `train_step.abstract_train_state`, or a concrete TrainState).

    With `cfg` (recommended) the saved model config must equal it, else ValueError listing the
    differing fields; the saved parameter shapes must match the target's in any case.
    """
    meta = read_metadata(manager, step)
    if meta is None:
        raise ValueError(f"no checkpoint at step {step} in {manager.directory}")
    for name, want, saved in (("model", cfg, meta.get("model_config")),
                              ("critic", critic_cfg, meta.get("critic_config"))):
        if want is not None:
            diff = _config_diff(saved, want)
            if diff:
                raise ValueError(f"checkpoint step {step} in {manager.directory} was saved for "
                                 f"another {name} config: " + "; ".join(diff))
    target = {f: getattr(abstract_state, f) for f in _FIELDS
              if getattr(abstract_state, f) is not None}
    missing = sorted(set(target) - set(meta.get("items", target)))
    if missing:
        raise ValueError(f"checkpoint step {step} lacks {missing}, which the target state has")
    _check_shapes(manager, step, target, meta)
    rng = abstract_state.rng
    rng_abs = jax.eval_shape(jax.random.key_data, rng)
    target["rng"] = jax.ShapeDtypeStruct(rng_abs.shape, rng_abs.dtype,
                                         sharding=getattr(rng, "sharding", None))
    target = jax.tree.map(_abstract, target)
    out = manager.restore(step, args=ocp.args.Composite(
        **{STATE_ITEM: ocp.args.StandardRestore(target)}))[STATE_ITEM]
    out["rng"] = jax.random.wrap_key_data(out["rng"], impl=meta.get("rng_impl") or None)
    return TrainState(**{f: out.get(f) for f in _FIELDS})


def restore_latest(directory: Union[str, os.PathLike, ocp.CheckpointManager],
                   abstract_state: TrainState, *, cfg: Optional[Qwen3Config] = None,
                   critic_cfg: Optional[Qwen3Config] = None) -> Optional[TrainState]:
    """The newest complete checkpoint in `directory` (or a manager) restored like `restore`, or
    None if there is none (a missing directory counts as empty)."""
    if isinstance(directory, ocp.CheckpointManager):
        manager = directory
    else:
        if not os.path.isdir(directory):
            return None
        manager = make_manager(directory, max_to_keep=None, read_only=True)
    step = manager.latest_step()
    if step is None:
        return None
    return restore(manager, step, abstract_state, cfg=cfg, critic_cfg=critic_cfg)


def all_steps(directory: Union[str, os.PathLike]) -> list[int]:
    """Steps of the complete checkpoints in `directory`, ascending."""
    if not os.path.isdir(directory):
        return []
    return sorted(make_manager(directory, max_to_keep=None, read_only=True).all_steps())
