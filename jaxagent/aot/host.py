"""The host-domain presets' accelerator programs (`python -m experiments.aot_check --preset <host preset>`).

A host preset's run (`study.host.pipeline`, presets in `study.host.presets`) executes on the accelerator:
  host_train_step   its arms' RL train step (`host_stages.make_host_arm_runtime`; arms with equal optimisation
                    settings share one program);
  host_append*, host_decode*   the host rollout's `append_jit` at one width C and `decode_jit`
                    (`rollout/host_policy.py`), per episode group, every argument placed as `HostPolicy` places it
                    (`append_args`, `decode_args`); batches: training (""), evaluation (`_eval`) and finding 4's
                    continuations (`_f4`), each only where its rows or sampler differ;
  host_f5_logprobs  finding 5's scoring (`likelihood_scoring.score_records`) on its widest batch;
  init_params, train_state_init, params_finite   as the FrozenLake list's (`aot.arms`).
The append compiles at the widest width (`--programs host_append_w<W>`: width W). Each program carries its shapes
(`Program.calls`) and analytic FLOPs (`flops_checked`): docs/aot.md, "The host-domain presets".

Dimension legend (CONVENTIONS.md): B episodes, C append width, S context slots, M action tokens, V vocab, D model
width, F MLP width, H query heads, K key/value heads, E head dim.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxagent import sharding
from jaxagent.aot.analytic import analytic_flops, cached_forward_flops
from jaxagent.aot.memory import Resident, per_chip_bytes
from jaxagent.aot.arms import (SHARED, abstract_key, compute_dtype_of, init_params_program, params_abstract, program,
                               state_programs, train_step_programs)
from jaxagent.aot.coverage import Call
from jaxagent.aot.programs import qwen3_tokenizer
from jaxagent.aot.record import Program
from jaxagent.models import chat, qwen3
from jaxagent.rl.logprobs import packed_policy_positions
from jaxagent.rl.memory_plan import MemoryPlan
from jaxagent.rollout.host_loop import HostRolloutConfig
from jaxagent.rollout.host_policy import append_jit, compact_rows, decode_jit
from jaxagent.rollout.host_schedule import episode_groups
from jaxagent.sampling import Sampler, bucket
from jaxagent.study.host import (domains as host_domains, dynamics as host_dynamics,
                                 error_recovery as host_error_recovery, likelihood as host_likelihood,
                                 likelihood_scoring, stages as host_stages, step_quality as host_step_quality)

MAX_WIDTHS = 7  # append widths 16 .. 1024 (HostRolloutConfig's default max_append_width)
WIDTHS = tuple(16 << i for i in range(MAX_WIDTHS))
BATCHES = ("", "_eval", "_f4")
PROGRAM_NAMES = (("host_train_step", "host_f5_logprobs") + SHARED
                 + tuple(f"host_{ph}{b}" for b in BATCHES for ph in ("append", "decode"))
                 + tuple(f"host_append{b}_w{w}" for b in BATCHES for w in WIDTHS))


def max_append_width() -> int:
    """The host rollout's widest append call (`HostRolloutConfig`'s default; `host_stages` does not set it)."""
    return int(HostRolloutConfig.max_append_width)


def widest_width(task) -> int:
    """The widest append a run of `task` (HostTaskSettings) can make: a chunk is written only while it and a
    full reply fit the context, so at most max_context - max_action_tokens tokens, in pieces of the widest."""
    return min(max_append_width(), bucket(max(1, task.max_context - task.max_action_tokens)))


def group_shape(n_episodes: int, overlap_groups: int) -> tuple[int, int]:
    """(episode groups, policy rows per group) of a host rollout over `n_episodes` (`host_schedule.episode_groups`)."""
    groups = episode_groups(n_episodes, overlap_groups)
    return len(groups), len(groups[0])


def _sds(shape, dtype, sh):
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sh)


def policy_state(cfg, mesh, rows: int, slots: int, dtype):
    """(KV cache, logits [B, V] f32) as `HostPolicy` holds them on `mesh` (`host_policy.Placement`): every
    array in its rule-table sharding (`sharding.RULES` over `qwen3.cache_logical_axes`; the logits' rows over
    the batch axes, vocab over tensor), the cache in the params' dtype."""
    cache = jax.eval_shape(lambda: qwen3.init_cache(cfg, rows, slots, dtype))
    sh = sharding.shardings_for(qwen3.cache_logical_axes(cfg), cache, mesh)
    logits = NamedSharding(mesh, sharding.spec_for(("batch", "vocab"), (rows, cfg.vocab_size), mesh))
    return (jax.tree.map(lambda a, s: _sds(a.shape, a.dtype, s), cache, sh),
            _sds((rows, cfg.vocab_size), jnp.float32, logits))


def append_args(cfg, mesh, *, rows: int, slots: int, width: int, dtype) -> tuple:
    """`append_jit`'s positional arguments (params, cache, tokens [B, C], n_valid [B], logits [B, V]) as
    `HostPolicy.append` passes them: params in `dtype` per `sharding.ROLLOUT_RULES` (`rollout_params`), the
    token rows and counts over the batch axes (`Placement.rows`)."""
    cache, logits = policy_state(cfg, mesh, rows, slots, dtype)
    row = lambda ndim: sharding.batch_sharding(mesh, ndim, batch_size=rows)  # noqa: E731
    return (params_abstract(cfg, mesh, dtype, sharding.ROLLOUT_RULES), cache,
            _sds((rows, width), jnp.int32, row(2)), _sds((rows,), jnp.int32, row(1)), logits)


def decode_args(cfg, mesh, *, rows: int, slots: int, dtype) -> tuple:
    """`decode_jit`'s positional arguments (params, cache, logits, key, active [B]) as `HostPolicy.sample`
    passes them: the key replicated (`Placement.key`), the active flags over the batch axes."""
    cache, logits = policy_state(cfg, mesh, rows, slots, dtype)
    key = abstract_key(NamedSharding(mesh, P()))
    return (params_abstract(cfg, mesh, dtype, sharding.ROLLOUT_RULES), cache, logits, key,
            _sds((rows,), jnp.bool_, sharding.batch_sharding(mesh, 1, batch_size=rows)))


def host_train_programs(preset, cfg, mesh, run_mesh, arms: list) -> list[Program]:
    """The host arms' train steps as `host_stages.make_host_arm_runtime` builds them (`arms.train_step_programs`
    with the arms' settings `arms`, as `study.host.run.HostRun.arm_settings` makes them, and the preset's XLA options),
    one per distinct settings, on batches of n_tasks x group_size / minibatches rows of max_context tokens; with
    `policy_positions` the batch carries each micro-batch's packed policy positions (`packed_sizes`: the widest
    compiled, the others its family)."""
    return train_step_programs(cfg, mesh, run_mesh, arms, seq=preset.task.max_context,
                               name=lambda arm: "host_train_step", packed_sizes=packed_sizes(preset),
                               **step_options(preset))


def step_options(preset) -> dict:
    """`stages.make_arm_step`'s options (its `MemoryPlan`) as `study.host.run.run_arms` passes them."""
    return dict(memory=MemoryPlan(compute_dtype=preset.compute_dtype, micro_batches=preset.micro_batches,
                                  remat=preset.remat, compiler_options=preset.compiler_options,
                                  packed_policy=preset.policy_positions, scan_layers=preset.scan_layers))


def packed_sizes(preset) -> tuple[int, ...]:
    """The lengths N a packed step's `policy_index` [micro_batches, N] can take (`logprobs.packed_policy_positions` at
    `host_stages.PACK_BUCKET`: powers of two from 16, then multiples of the bucket), up to a micro-batch whose every
    row holds t_max x max_action_tokens policy tokens; () without `policy_positions`."""
    if not preset.policy_positions:
        return ()
    rows = preset.n_tasks * preset.group_size // preset.minibatches // preset.micro_batches
    most = rows * min(preset.policy_tokens, preset.task.max_context - 1)
    top = packed_policy_positions(np.arange(most + 1)[None, :] > 0, host_stages.PACK_BUCKET).shape[1]
    bucket = host_stages.PACK_BUCKET
    return tuple([n for n in (16 << i for i in range(bucket.bit_length())) if n <= min(bucket, top)]
                 + list(range(2 * bucket, top + 1, bucket)))


def resident(preset, cfg, mesh, run_mesh, arms: list) -> Resident:
    """What a run of the host preset holds on each chip beside a program (`memory.Resident`, from its arms)."""
    return Resident.of(cfg, mesh, run_mesh, arms, **step_options(preset))


def rollout_programs(cfg, mesh, run_mesh, *, rows: int, slots: int, max_action_tokens: int, widest: int, dtype,
                     sampler, stop_ids, pad_id: int, suffix: str, label: str, want, widths=()) -> list[Program]:
    """The policy's `append_jit` (`host_append<suffix>` at the widest width, `host_append<suffix>_w<W>` at
    width W) and `decode_jit` (`host_decode<suffix>`) programs of one batch, lowered on `append_args` /
    `decode_args` under `jax.set_mesh(run_mesh)` when the run has a mesh (`host_stages.make_host_rollout_fn`)."""
    dt = jnp.dtype(dtype).name
    progs = []

    def append_call(width):
        return Call(append_jit, append_args(cfg, mesh, rows=rows, slots=slots, width=width, dtype=dtype),
                    dict(cfg=cfg), run_mesh)

    def append_prog(name, width, note, family=()):
        return program(name, append_call(width), cached_forward_flops(cfg, rows, width, slots),
                       f"{label}: append_jit, {rows} rows x {width} tokens into {slots} slots, {dt} params on "
                       f"ROLLOUT_RULES ({note})", family)

    if want(f"host_append{suffix}"):
        progs.append(append_prog(f"host_append{suffix}", widest,
                                 f"the widest append; it bounds the narrower: host_append{suffix}_w<W>",
                                 tuple(append_call(w) for w in WIDTHS if w < widest)))
    if want(f"host_decode{suffix}"):
        # compaction as `HostPolicy.sample` chooses it (the study's rollouts compact on one device)
        compact = compact_rows(rows, run_mesh)
        call = Call(decode_jit, decode_args(cfg, mesh, rows=rows, slots=slots, dtype=dtype), dict(
            cfg=cfg, max_steps=max_action_tokens, sampler=sampler, stop_ids=tuple(int(s) for s in stop_ids),
            pad_id=int(pad_id), **({} if compact is None else {"compact_rows": compact})), run_mesh)
        # the FLOP counter applies each while loop's trip count, so every compaction level's loop counts at
        # max_steps: the figure compared with it does the same (a call runs at most rows x max_steps steps of rows)
        levels = (rows,) + tuple(compact or ())
        progs.append(program(f"host_decode{suffix}", call,
                             max_action_tokens * sum(cached_forward_flops(cfg, r, 1, slots) for r in levels),
                             f"{label}: decode_jit, {rows} rows x {max_action_tokens} steps over {slots} slots, "
                             f"{dt} params on ROLLOUT_RULES, temperature {sampler.temperature:g}"
                             + ("" if compact is None else
                                f", compacted to {compact} rows (FLOPs: each level at {max_action_tokens} steps)")))
    for w in widths:
        name = f"host_append{suffix}_w{w}"
        if w <= widest and want(name):
            progs.append(append_prog(name, w, f"width {w} of 16..{widest}"))
    return progs


def likelihood_program(cfg, mesh, run_mesh, *, rows: int, width: int, positions: int, dtype) -> Program:
    """Finding 5's scoring (`likelihood_scoring.score_records`): `policy_logprobs_jit` over chunks of `rows` episodes
    of W tokens (the longest episode rounded up to `WIDTH_MULTIPLE`, at most `width`) with M policy positions (the most
    policy tokens of an episode rounded up to `POSITION_MULTIPLE`, at most `positions` rounded up), on the params as
    the evaluation rollouts use them (`rollout_params`: `dtype`, per `sharding.ROLLOUT_RULES`), the rows over the
    batch axes, under `jax.set_mesh` (`driver_common.row_placement`): compiled at the widest W and M, every other
    (W, M) its family."""
    params = params_abstract(cfg, mesh, dtype, sharding.ROLLOUT_RULES)
    row = sharding.batch_sharding(mesh, 2, batch_size=rows)
    wm, pm = likelihood_scoring.WIDTH_MULTIPLE, likelihood_scoring.POSITION_MULTIPLE
    widths = sorted({min(w, width) for w in range(wm, width + wm, wm)})
    top = -(-min(positions, width - 1) // pm) * pm

    def call(w, m):
        return Call(likelihood_scoring.policy_logprobs_jit, (params, _sds((rows, w), jnp.int32, row),
                                                             _sds((rows, m), jnp.int32, row)), dict(cfg=cfg), run_mesh)
    family = tuple(call(w, m) for w in widths for m in range(pm, top + 1, pm) if (w, m) != (width, top))
    return program("host_f5_logprobs", call(width, top),
                   analytic_flops(cfg, rows, width, backward=False, unembed_positions=rows * top),
                   f"finding 5 scoring: policy_logprobs, {rows} rows x {width} tokens, {top} policy positions (the "
                   f"widest scoring batch), {jnp.dtype(dtype).name} params on ROLLOUT_RULES", family)


def host_programs(preset, cfg, mesh, arms: list, only=None) -> list[Program]:
    """Every program a run of the host preset `preset` (`study.host.presets`) executes on the accelerator
    (module docstring), for the model `cfg` on `mesh` (the preset's mesh over the topology's chips) and its arms'
    settings `arms` (`stages.ArmSettings`, as `study.host.run.HostRun.arm_settings` makes them); `only`: just these
    names (the others are not even built). With the default (only=None): the train step and each rollout phase
    at the widest append, per distinct batch."""
    want = lambda name: only is None or name in only  # noqa: E731
    # the run: a mesh over every device unless the preset's is (1, 1, 1) (`study.make_run_mesh`)
    run_mesh = None if mesh.devices.size == 1 else mesh
    progs = []
    if preset.checkpoint is None and preset.tiny_model is not None and preset.aot_model is None and want("init_params"):
        progs.append(init_params_program(cfg, mesh))  # the random model written as the run's tiny checkpoint
    if want("train_state_init") or want("params_finite") or want("params_cast"):
        progs += [pr for pr in state_programs(cfg, mesh, run_mesh, arms, **step_options(preset)) if want(pr.name)]
    progs += host_train_programs(preset, cfg, mesh, run_mesh, arms) if want("host_train_step") else []
    task = preset.task
    tok = qwen3_tokenizer()  # the Qwen3 checkpoints' tokenizer: stop and pad ids
    stop_ids = tuple(int(i) for i in chat.turn_pieces(tok, enable_thinking=task.enable_thinking).stop_ids)
    dtype = compute_dtype_of(preset.compute_dtype)
    widest = widest_width(task)
    widths = WIDTHS if only is not None else ()
    n_eval = preset.eval.batch_size
    # (suffix, label, episode groups, rows per group, sampler)
    batches = [("", "training rollout", *group_shape(preset.n_tasks * preset.group_size, task.overlap_groups),
                Sampler(temperature=preset.temperature))]
    eval_batch = (*group_shape(n_eval, task.overlap_groups), Sampler(temperature=1.0))
    batches.append(("_eval", "evaluation rollout", *eval_batch))
    # finding 3's step samples and finding 6's R_single (coding) run the evaluation's batches and groups
    if host_domains.uses_env(task.domain, host_step_quality.DOMAINS):
        batches.append(("_eval", "finding 3 step-sample rollout", *eval_batch))
    if host_domains.uses_env(task.domain, host_dynamics.DOMAINS):
        batches.append(("_eval", "finding 6 R_single rollout", *eval_batch))
    if host_domains.uses_env(task.domain, host_error_recovery.DOMAINS):  # one group of eval.batch_size rows
        batches.append(("_f4", "finding 4 continuation", 1, n_eval, Sampler(temperature=1.0)))
    seen, built = {}, set()
    for suffix, label, n_groups, rows, sampler in batches:
        same = seen.get((rows, sampler))
        asked = only is not None and suffix not in built and any(
            n.startswith("host_") and n.split("_w")[0].endswith(suffix or "@") for n in only)
        if same is not None and not asked:  # the programs of an earlier batch: said on that batch's records
            for pr in progs:
                if pr.note.startswith(same + ":"):
                    pr.note += f"; also the {label}'s ({rows} rows per group)"
            continue
        seen.setdefault((rows, sampler), label)
        built.add(suffix)
        batch = rollout_programs(cfg, mesh, run_mesh, rows=rows, slots=task.max_context,
                                 max_action_tokens=task.max_action_tokens, widest=widest, dtype=dtype,
                                 sampler=sampler, stop_ids=stop_ids, pad_id=tok.pad_id, suffix=suffix, label=label,
                                 want=want, widths=widths)
        if n_groups > 1:  # every episode group's policy holds its cache at once (`host_schedule`)
            others = (n_groups - 1) * per_chip_bytes(policy_state(cfg, mesh, rows, task.max_context, dtype))
            for pr in batch:
                pr.resident_bytes += others
                pr.resident_note = f"the other {n_groups - 1} episode group(s)' KV cache and logits"
        progs += batch
    if host_domains.uses_env(task.domain, host_likelihood.DOMAINS) and want("host_f5_logprobs"):
        # rows per scoring batch: the train step's micro-batch; width: the longest episode, at most max_context
        progs.append(likelihood_program(cfg, mesh, run_mesh, dtype=dtype, width=task.max_context,
                                        positions=task.t_max * task.max_action_tokens,
                                        rows=preset.n_tasks * preset.group_size // preset.micro_batches))
    return resident(preset, cfg, mesh, run_mesh, arms).apply(progs, ("host_train_step",),
                                                             ("init_params", "train_state_init"))
