"""Train-state checkpoints with orbax: params, optimizer state, step, PRNG key, data position and a
JSON metadata item (the model config), kept N deep, written atomically, verified on restore.

Layout: <directory>/<step>/{state, metadata}: 'state' the TrainState as a dict (`StandardSave`; the PRNG key as
its raw `jax.random.key_data`), 'metadata' (`JsonSave`) the Qwen3Config fields of the policy (and critic), the
step, the data position and caller extras. A step is written to a temporary directory and renamed once complete,
so a killed save leaves the previous checkpoint the latest; `max_to_keep` deletes the oldest steps.
Integrity: each step this code saved gets a checksum manifest (`weights.MANIFEST_NAME`), written last (its pending
record in `PENDING_NAME` until then); `restore` verifies it first and names the missing, truncated or altered file.
A format-2 step (`FORMAT_VERSION`) without manifest or pending record raises `CheckpointError`, as does an array
orbax cannot read (with TensorStore's cause). Restoring checks the saved config, the run settings (`expect_extra`)
and the parameter shapes before reading any array. Multi-process: process 0 writes, every process waits.
The format, atomicity and verification in full: docs/custom_env.md, "The checkpoints".
This is one of the library's explicit I/O modules (it writes files; it never prints).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional, Union

import jax
import orbax.checkpoint as ocp

from jaxagent.models import weights
from jaxagent.models.config import CheckpointError, Qwen3Config
from jaxagent.rl.train_state import TrainState

STATE_ITEM, META_ITEM = "state", "metadata"
FORMAT_VERSION = 2   # 2: every step has a checksum manifest (1: older steps may lack one)
PENDING_NAME = "jaxagent_manifest_pending.json"  # the step whose save began and whose manifest is not written yet
_FIELDS = ("params", "opt_state", "step", "rng", "data_pos", "ref_params", "critic_params",
           "critic_opt_state")
# Files orbax needs to restore a step (its array index and the JSON item), relative to the step dir.
_REQUIRED_FILES = (f"{STATE_ITEM}/_METADATA", f"{META_ITEM}/metadata")


def make_manager(directory: Union[str, os.PathLike], *, max_to_keep: Optional[int] = 3,
                 save_interval_steps: int = 1, async_save: bool = False,
                 read_only: bool = False) -> ocp.CheckpointManager:
    """An orbax CheckpointManager for train states (keep the newest `max_to_keep`; None = all).

    async_save=True returns from `save` while arrays are written in the background (call
    `wait_until_finished(manager)` before exiting: it also writes the last step's checksum manifest);
    the default blocks, so a saved step is on disk with its manifest when `save` returns.
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
    wait_until_finished(manager)  # an earlier async save: complete it and write its manifest
    if jax.process_index() == 0:
        weights.write_json_atomic(_pending_path(manager), {"step": step})
    saved = manager.save(step, args=ocp.args.Composite(
        **{STATE_ITEM: ocp.args.StandardSave(_state_tree(state)),
           META_ITEM: ocp.args.JsonSave(_plain_json(meta))}), force=force)
    _finish_pending(manager, f"save:{step}")
    return bool(saved)


def wait_until_finished(manager: ocp.CheckpointManager) -> None:
    """Waits for an async save to land, then writes the checksum manifest of the step `save` recorded
    as pending (orbax has committed it, so it is complete)."""
    manager.wait_until_finished()
    _finish_pending(manager, "wait")


def step_directory(manager: ocp.CheckpointManager, step: int) -> str:
    return os.path.join(os.fspath(manager.directory), str(int(step)))


def _pending_path(manager) -> str:
    return os.path.join(os.fspath(manager.directory), PENDING_NAME)


def pending_step(manager: ocp.CheckpointManager) -> Optional[int]:
    """The step whose save `save` began and whose manifest is not written yet (None: none)."""
    try:
        with open(_pending_path(manager)) as f:
            step = json.load(f).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _finish_pending(manager, tag: str) -> None:
    """Process 0: once no save is in flight, writes the pending step's manifest if orbax committed it and
    drops the record; then every process waits for it."""
    if jax.process_index() == 0 and not manager.is_saving_in_progress():
        step = pending_step(manager)
        if step is not None:
            d = step_directory(manager, step)
            if os.path.isdir(d) and not os.path.isfile(os.path.join(d, weights.MANIFEST_NAME)):
                weights.write_manifest(d)
            os.remove(_pending_path(manager))
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(f"checkpoint_manifest:{manager.directory}:{tag}")


def _plain_json(x):
    """`x` as plain JSON types (tuples -> lists, dataclasses -> dicts), so saved == expected compares."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        x = dataclasses.asdict(x)
    return json.loads(json.dumps(x, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def settings_diff(saved: Any, expected: Any, prefix: str = "") -> list[str]:
    """'path: saved X vs expected Y' for every leaf where two JSON-like trees differ (dicts recursed)."""
    saved, expected = _plain_json(saved), _plain_json(expected)
    if isinstance(saved, dict) and isinstance(expected, dict):
        out = []
        for k in sorted(set(saved) | set(expected)):
            p = f"{prefix}.{k}" if prefix else str(k)
            if k not in saved or k not in expected:
                out.append(f"{p}: {saved.get(k, '<absent>')!r} vs {expected.get(k, '<absent>')!r}")
            else:
                out.extend(settings_diff(saved[k], expected[k], p))
        return out
    return [] if saved == expected else [f"{prefix or '<value>'}: {saved!r} vs {expected!r}"]


def _saved_format(d: str) -> Optional[int]:
    """The `format` in a step's metadata file, None when the file is missing (named later) or holds none."""
    try:
        with open(os.path.join(d, META_ITEM, "metadata")) as f:
            meta = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {d}: file {META_ITEM}/metadata is unreadable ({e})") from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    return fmt if isinstance(fmt, int) else None


def verify_step(manager: ocp.CheckpointManager, step: int, *, checksums: bool = True) -> bool:
    """Raises CheckpointError naming the step and the file when step `step` is incomplete, corrupt (with
    `checksums`: a file that does not match its manifest) or of a format that has manifests but lacks its
    own (module doc); returns whether the checksums were verified."""
    d = step_directory(manager, step)
    if not os.path.isdir(d):
        raise CheckpointError(f"no checkpoint at step {step} in {manager.directory} (no directory {d})")
    verified = checksums and weights.verify_manifest(d, what=f"checkpoint step {step} at")
    has_manifest = os.path.isfile(os.path.join(d, weights.MANIFEST_NAME))
    if checksums and not has_manifest and (_saved_format(d) or 0) >= 2 and pending_step(manager) != step:
        raise CheckpointError(
            f"checkpoint step {step} at {d} has no checksum manifest ({weights.MANIFEST_NAME}), which every step of "
            "its format has: its files cannot be verified and it is not restored; delete this step directory to "
            "resume from the previous step")
    for rel in _REQUIRED_FILES:
        if not os.path.isfile(os.path.join(d, rel)):
            raise CheckpointError(f"checkpoint {d} is incomplete: file {rel} is missing (orbax cannot restore the "
                                  "step without it); delete this step directory to restore the previous step")
    return verified


def _first_line(e: BaseException) -> str:
    text = str(e).strip().split(" See full TensorStore details")[0]
    return f"{type(e).__name__}: " + (text.splitlines()[0][:300] if text else "(no message)")


def _orbax_call(what: str, d: str, verified: bool, fn):
    """Runs an orbax read; its errors (e.g. a TensorStore spec dump) become a CheckpointError naming `d` and
    the innermost cause (TensorStore's own message names the array and the byte range)."""
    try:
        return fn()
    except Exception as e:  # orbax/tensorstore raise bare Exception, TypeError, KeyError, ...
        chain, c = [], e
        while c is not None and len(chain) < 8:
            chain.append(c)
            c = c.__cause__ or c.__context__
        why = ("its files match their checksums, so the target or the orbax version is the likely cause"
               if verified else "a file under it is probably truncated or corrupt (it has no checksum "
               "manifest to say which)")
        cause = _first_line(chain[-1]) + ("" if len(chain) == 1 else f" (raised as {_first_line(e)})")
        raise CheckpointError(f"checkpoint {d}: orbax could not read the {what}: {cause}; {why}") from e


def read_metadata(manager: ocp.CheckpointManager, step: Optional[int] = None) -> Optional[dict]:
    """The JSON metadata of `step` (default: the latest), or None when there is no checkpoint."""
    step = manager.latest_step() if step is None else step
    if step is None:
        return None
    d = step_directory(manager, step)
    if not os.path.isfile(os.path.join(d, META_ITEM, "metadata")):
        raise CheckpointError(f"checkpoint {d} is incomplete: file {META_ITEM}/metadata is missing")
    out = _orbax_call("metadata item", d, False, lambda: manager.restore(
        step, args=ocp.args.Composite(**{META_ITEM: ocp.args.JsonRestore()})))
    meta = out[META_ITEM]
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {d}: file {META_ITEM}/metadata holds {type(meta).__name__}, not the "
                              "metadata object `save` writes")
    return meta


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
    are unambiguous); raises CheckpointError listing the differences."""
    d = step_directory(manager, step)
    saved_tree = _orbax_call("array index (state/_METADATA)", d, False,
                             lambda: manager.item_metadata(step)[STATE_ITEM])
    saved_tree = getattr(saved_tree, "tree", saved_tree)
    if not isinstance(saved_tree, dict):
        raise CheckpointError(f"checkpoint {d}: orbax found no readable array index in {STATE_ITEM}/_METADATA "
                              f"(got {type(saved_tree).__name__}); the file is missing or corrupt")
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
        raise CheckpointError(
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
            cfg: Qwen3Config, critic_cfg: Optional[Qwen3Config] = None,
            expect_extra: Optional[dict] = None, verify: bool = True) -> TrainState:
    """Restores checkpoint `step` into the structure, dtypes and shardings of `abstract_state`
    (ShapeDtypeStructs, e.g. `train_step.abstract_train_state`, or a concrete TrainState).

    The saved model config must equal `cfg` (required: equal shapes do not make equal models), else
    CheckpointError listing the differing fields; each key of `expect_extra` (the run settings that
    matter) must equal the saved `extra`'s; the saved parameter shapes must match the target's.
    verify: check the step's checksum manifest first (module doc).
    """
    if not isinstance(cfg, Qwen3Config):
        raise ValueError(f"restore needs cfg, the Qwen3Config the checkpoint must have been saved for; "
                         f"got {type(cfg).__name__}")
    d = step_directory(manager, step)
    verified = verify_step(manager, step, checksums=verify)
    meta = read_metadata(manager, step)
    if expect_extra:
        saved_extra = meta.get("extra") or {}
        diff = [x for k in sorted(expect_extra)
                for x in settings_diff({k: saved_extra.get(k, "<absent>")}, {k: expect_extra[k]})]
        if diff:
            raise CheckpointError(f"checkpoint {d} was saved with other run settings (checkpoint vs expected): "
                                  + "; ".join(diff[:12]) + (f" (and {len(diff) - 12} more)" if len(diff) > 12 else ""))
    for name, want, saved in (("model", cfg, meta.get("model_config")),
                              ("critic", critic_cfg, meta.get("critic_config"))):
        if want is not None:
            diff = _config_diff(saved, want)
            if diff:
                raise CheckpointError(f"checkpoint step {step} in {manager.directory} was saved for "
                                      f"another {name} config: " + "; ".join(diff))
    target = {f: getattr(abstract_state, f) for f in _FIELDS
              if getattr(abstract_state, f) is not None}
    missing = sorted(set(target) - set(meta.get("items", target)))
    if missing:
        raise CheckpointError(f"checkpoint step {step} lacks {missing}, which the target state has")
    _check_shapes(manager, step, target, meta)
    rng = abstract_state.rng
    rng_abs = jax.eval_shape(jax.random.key_data, rng)
    target["rng"] = jax.ShapeDtypeStruct(rng_abs.shape, rng_abs.dtype,
                                         sharding=getattr(rng, "sharding", None))
    target = jax.tree.map(_abstract, target)
    out = _orbax_call("saved arrays", d, verified, lambda: manager.restore(step, args=ocp.args.Composite(
        **{STATE_ITEM: ocp.args.StandardRestore(target)}))[STATE_ITEM])
    out["rng"] = jax.random.wrap_key_data(out["rng"], impl=meta.get("rng_impl") or None)
    return TrainState(**{f: out.get(f) for f in _FIELDS})


def restore_latest(directory: Union[str, os.PathLike, ocp.CheckpointManager],
                   abstract_state: TrainState, *, cfg: Qwen3Config,
                   critic_cfg: Optional[Qwen3Config] = None, expect_extra: Optional[dict] = None,
                   verify: bool = True) -> Optional[TrainState]:
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
    return restore(manager, step, abstract_state, cfg=cfg, critic_cfg=critic_cfg, expect_extra=expect_extra,
                   verify=verify)


def all_steps(directory: Union[str, os.PathLike]) -> list[int]:
    """Steps of the complete checkpoints in `directory`, ascending."""
    if not os.path.isdir(directory):
        return []
    return sorted(make_manager(directory, max_to_keep=None, read_only=True).all_steps())
