"""The study's RL stage on host (Python) environments: SQL, BFCL multi-turn and multi-turn coding.

The base policy is a checkpoint (the toy presets: a tiny random Qwen3 after SFT on reference solutions,
`study.host.sft`). The RL arms (grpo, budgetmix, gigpo; `HOST_ARMS`) run through the same `rl.loop.rl_iteration`
and `common.arms.train_rl` as FrozenLake, with a host rollout in place of the jitted one: a task is its int32 index
into the domain's task list (`task_sampler`), mapped back to task objects by `make_host_rollout_fn`.
`CappedObservations` cuts every step's observation to `max_obs_tokens` tokens of the policy's tokenizer (each
<tool_response> block on its own; `obs_truncated_tokens` in the info); the reset observation is never cut.
The domains (env, splits, the structural bound's turns per task) are `study.host.domains`'.
Rewards are the envs' outcome rewards (PAPER.md): 1 when the episode ends solved, else 0.
Placement (`mesh`, `compute_dtype`) as the FrozenLake arms': rollouts sample from `rollout_params` under
`jax.set_mesh`, the train step is the sharded `build_train_step(mesh=...)`. The domains' tasks, splits and bounds:
docs/host_study.md, "Domains" and "Data"; the rest: "How the host findings are measured" (The RL stage).

Dimension legend (CONVENTIONS.md): B episodes (= n_tasks x G), G group size, S context slots, P tasks.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxagent.models.config import Qwen3Config
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rl.loop import CRITIC_ESTIMATORS, ORACLE_ESTIMATORS
from jaxagent.rl.memory_plan import MemoryPlan, resolve_compute_dtype
from jaxagent.rollout.host_loop import HostRolloutConfig, HostTrace, host_rollout
from jaxagent.rollout.host_policy import Placement
from jaxagent.rollout.types import SUCCESS, Rollout
from jaxagent.sampling import Sampler
from jaxagent.sampling.generate import rollout_params
from jaxagent.study.common import arms as arms_lib
from jaxagent.study.host.domains import HostDomain, get_domain

# the arms whose estimators need neither a critic nor an exact step oracle (`make_host_arm_runtime`), at the
# full budget or BudgetMix's (the tight-budget arms are FrozenLake's finding 7)
HOST_ARMS = tuple(name for name, rl in arms_lib.ARMS.items()
                  if rl.estimator not in CRITIC_ESTIMATORS + ORACLE_ESTIMATORS and rl.budget_mode != "tight")
# Packed policy positions per train step in multiples of this (`make_host_arm_runtime(packed_policy=)`): each value
# of N is one more compile of the step (about 6 s for the toy model), and a few unused positions cost less: bfcl-toy's
# minibatches of 32 rows hold about 1,400-2,200 policy tokens (N = 2,048 or 4,096), and its step on one of them
# (32 x 960 slots, 2,166 tokens) took 1.53 s packed into 4,096 positions and 1.54 s into 3,072
# (`python -m experiments.bench_host_step --preset bfcl-toy`, 2-core Intel Xeon).
PACK_BUCKET = 2048
NO_FIT = 1 << 20  # `HostWorld.min_turns` of a task whose reference reply does not fit the reply cap: no tier holds it


# ----------------------------------------------------------------------------- settings and world
@dataclasses.dataclass(frozen=True)
class HostTaskSettings:
    """The domain and the interaction limits every host stage shares."""

    domain: str = "sql"
    t_max: int = 10
    max_action_tokens: int = 256
    max_context: int = 4096          # KV-cache slots per episode = the train step's sequence width
    max_obs_tokens: int = 512        # tool-output cap per turn (module docstring)
    enable_thinking: bool = False    # False: Qwen3's empty think block before every reply
    max_train_tasks: Optional[int] = None    # n of the train split (None: all), picked per `task_subset`
    max_heldout_tasks: Optional[int] = None  # n of the held-out split (None: all), picked per `task_subset`
    # Further held-out splits whose Pass@(K,T) every policy gets beside the held-out split's (the built-in sets'
    # "test_constants": train's templates with other constants), n of each picked as the held-out split's
    extra_heldout: tuple = ()
    max_extra_heldout_tasks: Optional[int] = None
    # The structural bound counts a task whose reference reply does not fit max_action_tokens as unsolvable at every
    # tier (`HostWorld.min_turns`, on `HostDomain.whole_replies` domains). False for the CI miniatures and rehearsals,
    # whose 4- and 16-token replies hold no reference: their bound would be 0 and findings 2 and 7 never estimated.
    reply_cap_bound: bool = True
    task_subset: str = "first"       # "first": the split's first n; "spread": n evenly spaced over the split
    max_system_tokens: Optional[int] = None  # keep only tasks whose system prompt has at most this many tokens
    workers: Optional[int] = 4       # threads stepping the envs (None: the env's own count, `CodeEnv.max_parallel`)
    overlap_groups: int = 1          # episode groups whose env steps overlap the others' decoding (`host_rollout`)
    step_timeout_s: Optional[float] = 60.0   # an env call running longer fails its episode (`host_rollout`)
    # Each rollout's [B, S] arrays cut to the smallest multiple of slot_bucket slots holding every episode
    # (`trim_slots`), so the train step computes over the slots used, one compile per width; None: all
    # max_context slots (one compile)
    slot_bucket: Optional[int] = None

    def __post_init__(self):
        if self.max_obs_tokens < 1:
            raise ValueError(f"max_obs_tokens must be >= 1, got {self.max_obs_tokens}")
        for name in ("max_train_tasks", "max_heldout_tasks", "max_system_tokens", "max_extra_heldout_tasks"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {v}")
        if self.task_subset not in ("first", "spread"):
            raise ValueError(f"task_subset must be 'first' or 'spread', got {self.task_subset!r}")
        if self.overlap_groups < 1:
            raise ValueError(f"overlap_groups must be >= 1, got {self.overlap_groups}")
        if self.slot_bucket is not None and not 1 <= self.slot_bucket <= self.max_context:
            raise ValueError(f"slot_bucket must be in [1, max_context = {self.max_context}] or None, got "
                             f"{self.slot_bucket}")

    def rollout_config(self, sampler: Sampler = Sampler()) -> HostRolloutConfig:
        """The host rollout's settings for these tasks, sampling with `sampler`."""
        return HostRolloutConfig(t_max=self.t_max, max_action_tokens=self.max_action_tokens,
                                 max_context=self.max_context, sampler=sampler, enable_thinking=self.enable_thinking,
                                 workers=self.workers, overlap_groups=self.overlap_groups,
                                 step_timeout_s=self.step_timeout_s)


_BLOCK_RE = re.compile(r"(<tool_response>\n)(.*?)(\n</tool_response>)", re.DOTALL)


def cap_text(text: str, tokenizer: Tokenizer, max_tokens: int) -> tuple[str, int]:
    """(text cut to its first max_tokens tokens plus a marker naming the rest, tokens cut); uncut: (text, 0)."""
    ids = tokenizer.encode(text)
    cut = len(ids) - max_tokens
    if cut <= 0:
        return text, 0
    return tokenizer.decode(ids[:max_tokens]) + f"\n[... output truncated: {cut} more tokens]", cut


def cap_observation(obs: str, tokenizer: Tokenizer, max_tokens: int) -> tuple[str, int]:
    """An observation capped to max_tokens tokens, each `<tool_response>` block separately when it has them."""
    if not isinstance(obs, str):
        return obs, 0
    if not _BLOCK_RE.search(obs):
        return cap_text(obs, tokenizer, max_tokens)
    cuts = []

    def one(m):
        body, n = cap_text(m.group(2), tokenizer, max_tokens)
        cuts.append(n)
        return m.group(1) + body + m.group(3)

    return _BLOCK_RE.sub(one, obs), sum(cuts)


class CappedObservations:
    """A host env whose step observations are capped to `max_tokens` tokens (module docstring); every other
    attribute is the wrapped env's."""

    def __init__(self, env, tokenizer: Tokenizer, max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.env, self.tokenizer, self.max_tokens = env, tokenizer, int(max_tokens)

    def step(self, state, action_text):
        state, obs, reward, done, info = self.env.step(state, action_text)
        obs, cut = cap_observation(obs, self.tokenizer, self.max_tokens)
        if cut and isinstance(info, dict):
            info = {**info, "obs_truncated_tokens": cut}
        return state, obs, reward, done, info

    def __getattr__(self, name):
        if name == "env" or name.startswith("__"):  # unset during copy / unpickling: no recursion
            raise AttributeError(name)
        return getattr(self.env, name)


@dataclasses.dataclass(frozen=True, eq=False)
class HostWorld:
    """A domain's env (observations capped), the policy's tokenizer and the train / held-out task lists;
    `extra_heldout` the further held-out splits' tasks by name (`HostTaskSettings.extra_heldout`, those the env
    offers), `missing_splits` the ones it does not (loaded data has no "test_constants")."""

    domain: HostDomain
    env: Any
    tokenizer: Tokenizer
    train_tasks: tuple
    heldout_tasks: tuple
    extra_heldout: dict = dataclasses.field(default_factory=dict)
    missing_splits: tuple = ()
    max_action_tokens: Optional[int] = None  # the reply cap a reference reply must fit (`min_turns`)

    def min_turns(self, tasks: Sequence) -> np.ndarray:
        """int32 [P]: the reference solution's turns per task (the structural bound's input); on a domain of
        `whole_replies`, NO_FIT for a task one of whose reference replies (`env.ground_truth_actions`, with its end
        token) does not fit `max_action_tokens`: no tier can hold it (a 30-line program under a 128-token cap)."""
        return np.asarray([self.domain.min_turns(self.env, t) if self.reference_fits(t) else NO_FIT for t in tasks],
                          np.int32)

    def reference_fits(self, task) -> bool:
        if self.max_action_tokens is None or not self.domain.whole_replies:
            return True
        try:
            replies = self.env.ground_truth_actions(task)
        except NotImplementedError:
            return True
        return all(len(self.tokenizer.encode(r)) + 1 <= self.max_action_tokens for r in replies)


def pick_tasks(tasks: Sequence, n: Optional[int], how: str = "first") -> list:
    """n of `tasks` (all when n is None or >= their number): the first n, or n evenly spaced ("spread": indices
    round(i (P - 1) / (n - 1)), first and last included; BFCL's list is ordered by category)."""
    tasks = list(tasks)
    if n is None or n >= len(tasks):
        return tasks
    if how == "first":
        return tasks[:n]
    if how != "spread":
        raise ValueError(f"unknown task subset {how!r}; expected 'first' or 'spread'")
    idx = np.round(np.linspace(0, len(tasks) - 1, n)).astype(int) if n > 1 else np.zeros((1,), int)
    return [tasks[i] for i in idx]


def make_host_world(ts: HostTaskSettings, tokenizer: Tokenizer, env=None) -> HostWorld:
    """The world of `ts.domain`; `env` replaces the registry's env (tests)."""
    domain = get_domain(ts.domain)
    env = domain.make_env() if env is None else env

    n_tokens: dict[str, int] = {}  # per distinct system prompt (BFCL's depend on the task's tool classes only)

    def fits(task) -> bool:
        text = env.system_prompt(task)
        if text not in n_tokens:
            n_tokens[text] = len(tokenizer.encode(text))
        return n_tokens[text] <= ts.max_system_tokens

    def split(name, n):
        tasks = list(env.tasks(name))
        if ts.max_system_tokens is not None:
            tasks = [t for t in tasks if fits(t)]
        return pick_tasks(tasks, n, ts.task_subset)

    train, heldout = split(domain.train_split, ts.max_train_tasks), split(domain.heldout_split, ts.max_heldout_tasks)
    if not train or not heldout:
        raise ValueError(f"domain {domain.name!r}: {len(train)} train and {len(heldout)} held-out tasks; "
                         "both splits need at least one")
    offered = getattr(env, "split_notes", {})
    extra = {name: tuple(split(name, ts.max_extra_heldout_tasks)) for name in ts.extra_heldout if name in offered}
    return HostWorld(domain, CappedObservations(env, tokenizer, ts.max_obs_tokens), tokenizer, tuple(train),
                     tuple(heldout), {k: v for k, v in extra.items() if v},
                     tuple(name for name in ts.extra_heldout if not extra.get(name)),
                     ts.max_action_tokens if ts.reply_cap_bound else None)


# ----------------------------------------------------------------------------- the task-index adapter
def task_sampler(n_tasks: int) -> Callable[[Any, int], jax.Array]:
    """sample(key, n): n task indices drawn uniformly from [0, n_tasks), int32 [n] (`rl_iteration`'s
    `sample_tasks_fn` on a task list of n_tasks)."""
    def sample(key, n: int) -> jax.Array:
        return jax.random.randint(key, (n,), 0, n_tasks, dtype=jnp.int32)

    return sample


def tasks_from_indices(task_list: Sequence, idx_B) -> list:
    """[task_list[i] for i in idx_B]; ValueError for a non-integer array or an index out of range."""
    idx = np.asarray(idx_B)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"task indices must be a 1-D integer array, got dtype {idx.dtype} shape {idx.shape}")
    bad = idx[(idx < 0) | (idx >= len(task_list))]
    if bad.size:
        raise ValueError(f"task indices {bad[:5].tolist()} out of range [0, {len(task_list)})")
    return [task_list[int(i)] for i in idx]


def make_host_rollout_fn(world: HostWorld, cfg: Qwen3Config, ts: HostTaskSettings, task_list: Sequence, *,
                         sampler: Sampler = Sampler(), compute_dtype=None, mesh: Optional[Mesh] = None,
                         on_trace: Optional[Callable[[HostTrace], None]] = None,
                         compact_decode: bool = True) -> Callable[..., Rollout]:
    """rollout_fn(params, idx_B, budgets_B, key) -> Rollout: `host_rollout` on task_list[idx_B] with the
    budgets announced in the prompt, on the rollouts' copy of the params (`rollout_params`: cast
    to `compute_dtype`, placed on `mesh`; module docstring). `on_trace(trace)` sees each rollout's host record
    (texts, errors, `trace.timing`). `compact_decode`: `HostRolloutConfig`'s."""
    rcfg = dataclasses.replace(ts.rollout_config(sampler), compact_decode=compact_decode)
    cdt = resolve_compute_dtype(compute_dtype)  # a bad dtype name fails here, not at the first rollout
    context = contextlib.nullcontext if mesh is None else (lambda: jax.set_mesh(mesh))

    def rollout_fn(params, idx_B, budgets_B, key) -> Rollout:
        idx_B, budgets_B = Placement().fetch((idx_B, budgets_B))  # host copies, also of multi-process arrays
        tasks = tasks_from_indices(task_list, idx_B)
        params = rollout_params(params, cfg, mesh=mesh, compute_dtype=cdt)
        with context():
            out = host_rollout(params, cfg, world.env, world.tokenizer, tasks, np.asarray(budgets_B), key, rcfg)
        if on_trace is not None:
            on_trace(out.trace)
        return out.rollout if ts.slot_bucket is None else trim_slots(out.rollout, ts.slot_bucket)

    return rollout_fn


def trim_slots(rollout: Rollout, multiple: int) -> Rollout:
    """`rollout` with its [B, S] arrays (tokens, policy_mask, turn_index, logprobs) cut to W = the smallest multiple
    of `multiple` (at most S) holding every episode's `length`: the slots past an episode's length hold padding
    that no policy token attends to (causal) and no loss reads (policy_mask False), so per-token values on the kept
    slots are those of the full width."""
    s = int(rollout.tokens.shape[1])
    w = min(s, -(-int(np.max(Placement().fetch(rollout.length))) // multiple) * multiple)
    if w == s:
        return rollout
    return rollout._replace(tokens=rollout.tokens[:, :w], policy_mask=rollout.policy_mask[:, :w],
                            turn_index=rollout.turn_index[:, :w], logprobs=rollout.logprobs[:, :w])


def trace_metrics(trace: HostTrace) -> dict:
    """Per-rollout host numbers for a metrics log: the wall seconds of model vs env (`HostTiming.summary`, as
    `host_<name>`), and the episodes an env error or time-out ended (`host_env_errors`, `host_env_timeouts`)."""
    out = {f"host_{k}": v for k, v in trace.timing.summary().items()} if trace.timing is not None else {}
    errors = [e for e in trace.errors if e is not None]
    out["host_env_errors"] = len(errors)
    out["host_env_timeouts"] = sum("EnvTimeout" in e for e in errors)
    return out


# ----------------------------------------------------------------------------- the RL stage
def episode_grid(n_tiers: int, n_tasks: int, n_samples: int) -> np.ndarray:
    """int32 [U*P*Z, 3]: (tier, task, sample) of every evaluation episode, tier-major."""
    u, p, z = np.meshgrid(np.arange(n_tiers), np.arange(n_tasks), np.arange(n_samples), indexing="ij")
    return np.stack([u.ravel(), p.ravel(), z.ravel()], axis=1).astype(np.int32)


def run_pass_episodes(rollout_fn: Callable, n_tasks: int, tiers: Sequence[int], n_samples: int, key,
                      batch_size: int) -> dict:
    """Every (tier, task, sample) episode of the announced-mode Pass@(K,T) grid, in rollout batches of
    `batch_size` episodes (the last padded with copies of its first episode, dropped after).

    rollout_fn(task_idx_B, budgets_B, key) -> Rollout. Returns numpy arrays [U, P, Z]: success (bool),
    status (int32), turns (int32 turns used) and the tiers (int32 [U]): the raw log the grid is computed from.
    """
    if batch_size < 1 or n_samples < 1 or n_tasks < 1 or not tiers:
        raise ValueError(f"need batch_size, n_samples, n_tasks >= 1 and some tiers, got {batch_size}, {n_samples}, "
                         f"{n_tasks}, {list(tiers)}")
    tiers_U = np.asarray(tiers, np.int32)
    grid = episode_grid(len(tiers_U), n_tasks, n_samples)
    shape = (len(tiers_U), n_tasks, n_samples)
    status = np.zeros(len(grid), np.int32)
    turns = np.zeros(len(grid), np.int32)
    for i, start in enumerate(range(0, len(grid), batch_size)):
        rows = grid[start:start + batch_size]
        n = len(rows)
        rows = np.concatenate([rows, np.repeat(rows[:1], batch_size - n, axis=0)])
        ro = rollout_fn(rows[:, 1], tiers_U[rows[:, 0]], jax.random.fold_in(key, i))
        status[start:start + n] = np.asarray(ro.status)[:n]
        turns[start:start + n] = np.asarray(ro.turns_used)[:n]
    status, turns = status.reshape(shape), turns.reshape(shape)
    return {"success": status == SUCCESS, "status": status, "turns": turns, "tiers": tiers_U}


def make_host_arm_runtime(world: HostWorld, cfg: Qwen3Config, ts: HostTaskSettings, arm: arms_lib.ArmSettings, *,
                          mesh: Optional[Mesh] = None, compute_dtype=None, micro_batches: int = 1,
                          remat: Optional[str] = None, compiler_options: Optional[dict] = None,
                          on_trace: Optional[Callable[[HostTrace], None]] = None,
                          policy_tokens: Optional[int] = None, packed_policy: bool = False,
                          scan_layers: bool = False) -> arms_lib.ArmRuntime:
    """`common.arms.ArmRuntime` of a host arm: the host rollout on the train tasks and the arms' train step
    (`arms_lib.make_arm_step`: PPO-clip with the arm's clip / KL / entropy settings, AdamW at `arm.lr`) as
    `arms_lib.placed_step` calls it, sharded on `mesh` when given (module docstring). No critic. `on_trace`: see
    `make_host_rollout_fn`. `policy_tokens` (e.g. t_max x max_action_tokens: a reply is cut at max_action_tokens):
    the step projects onto the vocabulary at each row's policy tokens only (`MemoryPlan(policy_tokens=)`); a
    batch with more raises. `packed_policy`: the same at the batch's policy tokens packed into one list per
    micro-batch, in multiples of `PACK_BUCKET` positions (a smaller count: the next power of two;
    `MemoryPlan(packed_policy=)`, `logprobs.packed_policy_positions`): the unembedding's work follows the
    tokens the policy wrote, not the most a row could hold. `scan_layers`: `MemoryPlan.scan_layers`."""
    if arm.rl.estimator in CRITIC_ESTIMATORS + ORACLE_ESTIMATORS:
        raise ValueError(f"host arms use outcome or anchor-group estimators (grpo, gigpo, ...); {arm.name!r} "
                         f"needs {arm.rl.estimator!r} (a critic or an exact step oracle)")
    memory = MemoryPlan(micro_batches=micro_batches, remat=remat, compute_dtype=compute_dtype,
                        policy_tokens=policy_tokens, packed_policy=packed_policy, compiler_options=compiler_options,
                        scan_layers=scan_layers)
    arm_step = arms_lib.make_arm_step(cfg, arm, mesh=mesh, memory=memory)
    step, st_sh = arms_lib.placed_step(arm_step, cfg, mesh=mesh, memory=memory, pack_bucket=PACK_BUCKET)
    rollout_fn = make_host_rollout_fn(world, cfg, ts, world.train_tasks, sampler=Sampler(temperature=arm.temperature),
                                      compute_dtype=compute_dtype, mesh=mesh, on_trace=on_trace)
    return arms_lib.ArmRuntime(rollout_fn, step, arm_step.optimizer, None, None, None, mesh, st_sh,
                               with_ref_params=arm_step.with_ref_params)


def train_host_rl(world: HostWorld, cfg: Qwen3Config, base_params, key, ts: HostTaskSettings,
                  arm: arms_lib.ArmSettings, runtime: arms_lib.ArmRuntime,
                  callback: Optional[Callable[[int, dict, object], None]] = None, state=None):
    """Returns (state, history): `arms_lib.train_rl` with the host runtime, tasks drawn uniformly from the train
    split by index (`task_sampler`). `state`: a restored TrainState (a checkpoint) to resume from, at iteration
    data_pos / n_tasks (None: a fresh state from the base params and `key`)."""
    if state is None:
        state = arms_lib.init_arm_state(runtime, cfg, key, base_params)
    return arms_lib.train_rl(runtime, arm, task_sampler(len(world.train_tasks)), ts.t_max, state, callback=callback)
