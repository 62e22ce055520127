"""The multi-turn rollout for host (Python) environments: a Python turn loop around jitted generation.

`host_rollout` runs len(tasks) episodes of a host env in Qwen3's chat format, append-only (the KV cache is
reused across turns): per turn the active episodes' chunks go in with jitted `append` calls, one jitted
`decode` samples their replies, and the env steps run on worker threads (`host_turn`'s named steps). Its
settings are one `HostRolloutConfig`; it returns `HostRollout(rollout, trace)`: the `types.Rollout` the
jitted loop returns and the host-side record (`HostTrace`).

The design (the chat layout, the turn steps, overlapping episode groups, time limits, several processes,
forced and scripted replies, compiles, the output's fields) is docs/host_rollout.md.

Dimension legend (CONVENTIONS.md): B episodes, S context slots (= KV-cache slots), N turns (T_max),
C append width (chunk tokens), M action tokens, V vocab.
"""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.envs.host.base import host_cores
from jaxagent.envs.jax import budgets as budgets_lib
from jaxagent.envs.jax.budgets import BUDGET_TEMPLATE
from jaxagent.models import chat
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rollout import types
from jaxagent.rollout.episode import EpisodeConfig
from jaxagent.rollout.host_env_calls import EnvCalls, EnvShare
from jaxagent.rollout.host_policy import HostPolicy, Placement
from jaxagent.rollout.host_schedule import EnvSide, Group, episode_groups
from jaxagent.rollout.host_timing import HostTiming, TurnClock
from jaxagent.rollout.host_turn import (EpisodeBuffers, finish_steps, group_replies, reset_all, submit_steps,
                                        write_chunks, write_replies)

# system_fn(env, task) -> (system content or None, tools list or None) for `chat.system_turn`.
SystemFn = Callable[[Any, Any], tuple[Optional[str], Optional[list]]]
# generate_fn(turn, active_B, contexts) -> a reply text per episode (entries where not active are
# ignored); contexts[b] is episode b's token ids so far, ending with the assistant generation prompt.
# Called once per turn of each episode group, with that group's active episodes.
GenerateFn = Callable[[int, np.ndarray, list], Sequence[Optional[str]]]
# process_reward_fn(env, state_before, action_text, remaining_turns) -> float, called before the step
# (e.g. `lambda env, s, a, r: env.step_quality(s, a)`).
HostProcessRewardFn = Callable[[Any, Any, str, int], float]


@dataclasses.dataclass(frozen=True)
class HostRolloutConfig(EpisodeConfig):
    """Settings of a host rollout (hashable): `EpisodeConfig`'s t_max, max_action_tokens, max_context (KV slots
    per episode) and sampler, and how the host loop runs them (checked by `host_rollout`). The per-call data
    (policy, env, tokenizer, tasks, budgets, key) and the replies given instead of the model's are
    `host_rollout` arguments."""

    # On one device a reply's token loop goes on over fewer rows as replies end (`host_policy.compact_rows`); False
    # keeps every row stepping until the group's longest reply ends (the replies' distribution is the same).
    compact_decode: bool = True
    hide_budget: bool = False       # no budget text in the prompts (the episodes still stop at their budgets)
    enable_thinking: bool = False   # False appends Qwen3's empty think block to every generation prompt
    # Threads that run the env calls (resets and steps); None: `env.max_parallel` where the env has one (the code
    # sandbox's runs at once), else the cores this process may run on (`base.host_cores`).
    workers: Optional[int] = 4
    # str.format template with {turn} (1-based), {budget} and {remaining} (including this turn)
    budget_template: str = BUDGET_TEMPLATE
    system_fn: Optional[SystemFn] = None  # the system turn's (content, tools); None: `default_system`
    max_append_width: int = 1024    # the widest append call (a power of two >= 16); longer chunks take several
    # Host hook (env, state_before, action_text, remaining) -> float, recorded in Turns.process_reward (it must
    # not change the state).
    process_reward_fn: Optional[HostProcessRewardFn] = None
    # G, the episode groups whose env steps overlap the other groups' decoding (at most B are used;
    # docs/host_rollout.md). 1: the whole batch decodes, then all its envs step.
    overlap_groups: int = 1
    # Seconds an env reset or step may run before its episode fails with a time-out (None: no limit).
    step_timeout_s: Optional[float] = 60.0


def host_config(rcfg: EpisodeConfig) -> HostRolloutConfig:
    """`rcfg` as a HostRolloutConfig. A config with more fields (the JAX loop's `RolloutConfig`) is
    accepted only while each extra field has its default: the host loop would ignore it."""
    if type(rcfg) is HostRolloutConfig:
        return rcfg
    if not isinstance(rcfg, EpisodeConfig):
        raise TypeError(f"rcfg must be a HostRolloutConfig (or EpisodeConfig), got {type(rcfg).__name__}")
    base = [f.name for f in dataclasses.fields(EpisodeConfig)]
    set_extra = [f.name for f in dataclasses.fields(rcfg) if f.name not in base and getattr(rcfg, f.name) != (
        f.default_factory() if f.default is dataclasses.MISSING else f.default)]
    if set_extra:
        raise ValueError(f"host_rollout has no use for {type(rcfg).__name__}.{', '.join(set_extra)} (jittable-env "
                         "settings); for host envs pass process_reward_fn=(env, state, action_text, remaining) -> "
                         "float or generate_fn, and use HostRolloutConfig")
    return HostRolloutConfig(**{name: getattr(rcfg, name) for name in base})


def default_system(env, task) -> tuple[Optional[str], Optional[list]]:
    """The env's system prompt verbatim and no separate tool list: the host env with tools (BFCL)
    already lists them, with the tool-call protocol, in `system_prompt`; passing `env.tools(...)` too
    would list them twice. For an env whose prompt omits its tools, Qwen3's native tool layout is
    `system_fn=lambda env, task: (env.system_prompt(task), env.tools(task, 0))`."""
    return env.system_prompt(task), None


@dataclasses.dataclass
class HostTrace:
    """Host-side record of a host rollout; every field is a list over episodes b."""

    tasks: list
    seeds: list                 # the seed env.reset got
    errors: list                # None, or the exception the env raised ("where: Type: message")
    actions: list               # [b][t] the reply text the env was stepped with
    observations: list          # [b][k]: k = 0 the reset observation, k = t + 1 the one after turn t
    infos: list                 # [b][t] the env's info dict of each step
    dones: list                 # [b][t] the env's done flag of each step
    final_states: list          # env state after the last step (None if the reset failed or a call timed out, and
                                # on the processes that did not step the episode)
    timing: Optional[HostTiming] = None  # per-turn model vs env seconds (`host_timing`)

    @classmethod
    def empty(cls, tasks: list, seeds: list) -> "HostTrace":
        """The trace of len(tasks) episodes before their resets: every per-episode list empty."""
        n_ep = len(tasks)
        return cls(tasks=tasks, seeds=seeds, errors=[None] * n_ep, actions=[[] for _ in range(n_ep)],
                   observations=[[] for _ in range(n_ep)], infos=[[] for _ in range(n_ep)],
                   dones=[[] for _ in range(n_ep)], final_states=[None] * n_ep)

    def trajectories(self, policy: str = "") -> list[dict]:
        """Per episode {task, seed, actions, infos, dones, policy}: the input of
        `eval.error_prefix.collect_error_prefixes` and similar host-side analyses."""
        return [dict(task=t, seed=s, actions=a, infos=i, dones=d, policy=policy)
                for t, s, a, i, d in zip(self.tasks, self.seeds, self.actions, self.infos, self.dones)]


class HostRollout(NamedTuple):
    rollout: types.Rollout      # the arrays RL and the diagnostics consume (as from the jitted loop)
    trace: HostTrace            # texts, infos, errors and final states, on the host


# ----------------------------------------------------------------------------- the checks
def _check_inputs(env, rcfg, tasks, budgets, forced_actions):
    """Host-side checks; returns (HostRolloutConfig, tasks list, budgets int32[B])."""
    if getattr(env, "jittable", False):
        raise ValueError("host_rollout runs host (Python) envs; use jaxagent.rollout.rollout for jittable envs")
    hcfg = host_config(rcfg)
    tasks = list(tasks)
    budget_B = budgets_lib.validate_budgets(budgets, hcfg.t_max)
    if budget_B.ndim != 1 or budget_B.shape[0] != len(tasks):
        raise ValueError(f"{len(tasks)} tasks but budgets has shape {budget_B.shape}; give one budget per task")
    workers, max_append_width = hcfg.workers, hcfg.max_append_width
    overlap_groups, step_timeout_s = hcfg.overlap_groups, hcfg.step_timeout_s
    if workers is not None and (isinstance(workers, bool) or int(workers) != workers or workers < 1):
        raise ValueError(f"workers must be an integer >= 1 or None, got {workers!r}")
    if max_append_width < 16 or max_append_width & (max_append_width - 1):
        raise ValueError(f"max_append_width must be a power of two >= 16, got {max_append_width}")
    if isinstance(overlap_groups, bool) or int(overlap_groups) != overlap_groups or overlap_groups < 1:
        raise ValueError(f"overlap_groups must be an integer >= 1, got {overlap_groups!r}")
    if step_timeout_s is not None and (isinstance(step_timeout_s, bool) or not 0 < step_timeout_s < float("inf")):
        raise ValueError(f"step_timeout_s must be a finite number of seconds > 0 (None: no limit), "
                         f"got {step_timeout_s!r}")
    if forced_actions is not None and len(forced_actions) != len(tasks):
        raise ValueError(f"forced_actions has {len(forced_actions)} rows for {len(tasks)} tasks")
    return hcfg, tasks, budget_B


# ----------------------------------------------------------------------------- the turn loop's steps
def _policy_groups(params, cfg, hcfg: HostRolloutConfig, pieces, pad_id: int, n_ep: int,
                   generate_fn: Optional[GenerateFn], k_loop) -> list:
    """The episode groups (`episode_groups`), each with its own policy (none with `generate_fn`). A single group
    samples with the loop's key as it is; several fold in their index, so that no two groups share their random
    numbers."""
    all_rows = episode_groups(n_ep, hcfg.overlap_groups)
    return [Group(rows, np.isin(np.arange(n_ep), rows), None if generate_fn is not None else HostPolicy(
        params, cfg, hcfg, tuple(int(i) for i in pieces.stop_ids), pad_id, hcfg.max_append_width,
        k_loop if len(all_rows) == 1 else jax.random.fold_in(k_loop, g))) for g, rows in enumerate(all_rows)]


def _forced_text(forced_actions: Optional[Sequence[Sequence[Optional[str]]]], b: int, t: int) -> Optional[str]:
    """The reply text episode b gives at turn t instead of the policy's (None: the policy replies)."""
    row = forced_actions[b] if forced_actions is not None else ()
    return row[t] if t < len(row) else None


def _collect_steps(ready: collections.deque, running: list, buf: EpisodeBuffers, envs: EnvSide, calls: EnvCalls,
                   clock: TurnClock, spmd: bool) -> None:
    """Moves the groups whose env steps have returned from `running` to `ready`, their results recorded; it blocks
    only while no group is ready, so that a group waits on its envs only when there is nothing else to decode."""
    while running:
        if spmd:  # a fixed order (the same on every process): the oldest, once no group is ready
            i = None if ready else 0
        else:
            i = calls.first_done([g.inflight.calls for g in running], block=not ready)
        if i is None:
            break
        group = running.pop(i)
        clock.lap("env_wait_s", group.inflight.t)
        finish_steps(buf, envs, calls, group.inflight, clock)
        group.inflight, group.t = None, group.t + 1
        ready.append(group)


def _play_turn(group: Group, buf: EpisodeBuffers, envs: EnvSide, calls: EnvCalls, clock: TurnClock,
               hcfg: HostRolloutConfig, budget_B, n_ep: int, forced_actions, generate_fn: Optional[GenerateFn],
               tokenizer: Tokenizer) -> bool:
    """The group's next turn: its chunks in, its replies decoded (or given), its env steps submitted (in flight in
    `group.inflight`). False when the group has no turn left: past T_max, or none of its episodes plays on."""
    t = group.t
    if t >= hcfg.t_max:
        return False
    active, start_slot = write_chunks(buf, t, budget_B, hcfg, group.member)
    if not active.any():
        return False
    given = {b: _forced_text(forced_actions, b, t) for b in np.flatnonzero(active)}
    given = {b: x for b, x in given.items() if x is not None}
    is_given = np.isin(np.arange(n_ep), list(given))
    clock.lap("host_s", t)
    r_tok, r_lp, r_len, r_stop = group_replies(buf, group, t, active, start_slot, given, generate_fn, tokenizer,
                                               hcfg)
    clock.lap("model_s", t)
    if generate_fn is None:  # the group's decode call, its slots counted (`host_timing.decode_slot_counts`)
        clock.timing.add_decode(t, len(group.rows), int(np.sum(group.rows < 0)), r_len[active & ~is_given])
    replies = (r_tok, r_lp, np.where(active, r_len, 0).astype(np.int32), r_stop)
    is_forced = active & (is_given | (generate_fn is not None))
    trains = active & ~is_given  # a scripted policy's replies are its SFT targets
    texts = write_replies(buf, t, active, start_slot, replies, trains, tokenizer)
    group.inflight = submit_steps(buf, envs, calls, t, active, start_slot, replies, texts, is_forced, tokenizer)
    clock.lap("host_s", t)
    return True


def host_rollout(params, cfg, env, tokenizer: Tokenizer, tasks: Sequence, budgets, key, rcfg: EpisodeConfig, *,
                 generate_fn: Optional[GenerateFn] = None,
                 forced_actions: Optional[Sequence[Sequence[Optional[str]]]] = None) -> HostRollout:
    """Runs len(tasks) episodes of the host env `env`: episode b on tasks[b] with budget budgets[b].

    params, cfg: the Qwen3 policy (unused, may be None, with `generate_fn`).
    rcfg: a HostRolloutConfig (the episode sizes, the sampler and the run's settings); a JAX-loop
      RolloutConfig whose jittable-env fields are set raises (`host_config`).
    generate_fn: a scripted policy replacing the model, called once per group and turn; its replies are the
      acting policy's (in `policy_mask`, the SFT targets).
    forced_actions: [B][t] reply texts (None or a missing entry: the model replies) that episode b
      replies at turn t instead of sampling (not in `policy_mask`; e.g. error prefixes to continue from).

    Returns HostRollout(rollout: types.Rollout, trace: HostTrace) (docs/host_rollout.md).
    Raises ValueError for a jittable env, a task/budget count mismatch, budgets outside [1, t_max],
    bad settings, or when no episode's first turn fits into max_context (an episode whose first turn
    alone does not fit ends with status context_exhausted after 0 turns).
    """
    start = time.perf_counter()
    hcfg, tasks, budget_B = _check_inputs(env, rcfg, tasks, budgets, forced_actions)
    clock = TurnClock(hcfg.t_max, start)
    n_ep = len(tasks)
    pieces = chat.turn_pieces(tokenizer, enable_thinking=hcfg.enable_thinking)
    k_reset, k_loop = jax.random.split(key)
    seeds = [int(x) for x in np.asarray(jax.random.randint(k_reset, (n_ep,), 0, 2**31 - 1))]
    envs = EnvSide(env, tokenizer, pieces, tasks, seeds, budget_B, hcfg.hide_budget, hcfg.budget_template,
                   default_system if hcfg.system_fn is None else hcfg.system_fn, hcfg.process_reward_fn)
    buf = EpisodeBuffers.empty(hcfg, tokenizer.pad_id, HostTrace.empty(tasks, seeds))
    groups = _policy_groups(params, cfg, hcfg, pieces, tokenizer.pad_id, n_ep, generate_fn, k_loop)
    spmd = jax.process_count() > 1  # several processes: docs/host_rollout.md
    workers = hcfg.workers if hcfg.workers is not None else getattr(env, "max_parallel", None) or host_cores()
    calls = EnvCalls(workers, hcfg.step_timeout_s, share=EnvShare(n_ep) if spmd else None)
    try:
        reset_all(buf, envs, calls, hcfg)
        for group in groups:
            if group.policy is not None:
                group.policy.start(len(group.rows))
        clock.reset_done()
        # A group decodes as soon as its envs' results are in; while no group can, wait for the first.
        ready, running = collections.deque(groups), []
        while ready or running:
            _collect_steps(ready, running, buf, envs, calls, clock, spmd)
            group = ready.popleft()
            if _play_turn(group, buf, envs, calls, clock, hcfg, budget_B, n_ep, forced_actions, generate_fn,
                          tokenizer):
                running.append(group)
    finally:
        calls.close()
    buf.trace.final_states, buf.trace.timing = buf.states, clock.finish(len(groups))
    put = Placement.of(params).replicated if spmd and params is not None else jnp.asarray
    return HostRollout(buf.to_rollout(budget_B, put), buf.trace)
