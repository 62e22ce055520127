"""The host study's SFT base (the `*-toy` presets): a tiny random Qwen3 with the real Qwen3 tokenizer, fine-tuned
on the train split's reference solutions so that the base solves some tasks before the RL arms start from it, as
the FrozenLake toy study's base is fine-tuned on its expert's episodes (`study.stages.train_base`).

Rows (`sft_rows`): each train task's reference episode played through the env by the host rollout itself with the
reference replies as a scripted policy, so a row's tokens are exactly the context the policy sees and its targets
are the reply tokens; the prompt announces T_max or a BudgetMix draw (`HostSFTSettings.budget_mode`); episodes that
do not end solved are left out and counted. The noisy expert (`HostSFTSettings.noise`, `check`, `copies`,
`slip_fix`; `expert_replies`): the reference with one generic slip, the same kinds on every task, then, where the
budget allows, a check or a fix, so that RL has a mistake shared by all tasks to unlearn. Training
(`train_sft_base`): `study.common.sft.fit_sft`, the loss at the reply tokens only (`rl.sft.sft_loss_at_targets`).
Why and how: docs/host_study.md, "Toy presets" (Base: SFT on reference solutions, and each domain's noisy expert).

Dimension legend (CONVENTIONS.md): E rows, S slots.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from jaxagent.envs.jax.budgets import BUDGET_TEMPLATE
from jaxagent.models.chat import render_chat
from jaxagent.models.config import Qwen3Config
from jaxagent.models.tokenizer import IM_END
from jaxagent.rl.sft import max_targets
from jaxagent.rollout import BUDGET_EXHAUSTED, FAILED
from jaxagent.rollout.host_loop import host_rollout
from jaxagent.study.common import sft as sft_lib
from jaxagent.study.host.experts import NoisyExpert, check_slip_fix, expert_for
from jaxagent.study.host.stages import HostTaskSettings, HostWorld

BUDGET_MODES = ("full", "budgetmix")


@dataclasses.dataclass(frozen=True)
class HostSFTSettings:
    """The SFT base of a toy preset: `steps` updates of `batch_size` rows at peak learning rate `lr` (warm-up
    `warmup` steps), on the reference episodes of the first `max_rows` train tasks (None: every train task),
    each prompt announcing T_max ("full") or a BudgetMix draw ("budgetmix")."""

    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 30
    max_rows: Optional[int] = None
    budget_mode: str = "budgetmix"
    seed: int = 0
    noise: float = 0.0                # the share of rows with a slip (`expert_replies`)
    check: float = 0.0                # the share of rows (with a budget of 2 turns or more) that check first
    copies: int = 1                   # rows per task, each with its own budget and slip draw
    slip_fix: float = 1.0             # the chance that a slip is fixed after the feedback (`expert_replies`)
    width_bucket: Optional[int] = None  # each batch cut to its rows' slots in multiples of this (`fit_sft`)

    def __post_init__(self):
        for name in ("steps", "batch_size", "copies"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"HostSFTSettings.{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"HostSFTSettings.warmup must be an integer >= 0, got {self.warmup!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < 1:
            raise ValueError(f"HostSFTSettings.lr must be a number in (0, 1), got {self.lr!r}")
        if self.max_rows is not None and (isinstance(self.max_rows, bool) or not isinstance(self.max_rows, int)
                                          or self.max_rows < 1):
            raise ValueError(f"HostSFTSettings.max_rows must be an integer >= 1 or None, got {self.max_rows!r}")
        for name in ("noise", "check"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise ValueError(f"HostSFTSettings.{name} must be a number in [0, 1), got {v!r}")
        check_slip_fix(self.slip_fix, "HostSFTSettings.slip_fix")
        if self.width_bucket is not None and (isinstance(self.width_bucket, bool)
                                              or not isinstance(self.width_bucket, int) or self.width_bucket < 1):
            raise ValueError(f"HostSFTSettings.width_bucket must be an integer >= 1 or None, got {self.width_bucket!r}")
        if self.budget_mode not in BUDGET_MODES:
            raise ValueError(f"HostSFTSettings.budget_mode must be one of {BUDGET_MODES}, got {self.budget_mode!r}")


def expert_replies(env, tasks: Sequence, budgets_E, noise: float, check: float, seed: int, slip_fix: float = 1.0,
                   expert: Optional[NoisyExpert] = None) -> tuple[list, np.ndarray, np.ndarray]:
    """(replies [E][turn], slipped bool[E], checked bool[E]): the noisy expert of the toy base (`expert`, default
    the env's, `experts.expert_for`). Row e draws (with `seed`) whether it slips (probability `noise`) and whether
    it checks (probability `check`, only where its announced budget budgets_E[e] allows two turns). A checking row
    runs a query first, slipped or not, and then submits the reference (`NoisyExpert.checked_actions`); a slipping
    row that does not check plays `NoisyExpert.slipped_actions` where a slip applies (SQL: the reference with one
    generic mistake, submitted; coding and BFCL: that, then, after the feedback and with probability `slip_fix`,
    the reference, else giving up; a one-turn budget never reaches the fix); every other row is the reference
    (`env.ground_truth_actions`). As FrozenLake's epsilon-noisy expert (`study.stages.BaseSettings.epsilon`), the
    mistakes are the same on every task, so the base imitates them at about that rate and RL has something it can
    unlearn; checking gives the base multi-turn episodes whose second turn corrects the first. ValueError where a
    row needs an expert and the env has none."""
    rng = np.random.default_rng(seed)
    slip_draw, check_draw = rng.random(len(tasks)) < noise, rng.random(len(tasks)) < check
    budgets_E = np.asarray(budgets_E)
    expert = expert_for(env) if expert is None else expert

    def noisy() -> NoisyExpert:
        if expert is None:
            raise ValueError(f"the {type(env).__name__} env has no noisy expert (`experts.expert_for`): its toy base "
                             "cannot slip or check (HostSFTSettings.noise and check must be 0)")
        return expert

    replies, slipped, checked = [], np.zeros(len(tasks), bool), np.zeros(len(tasks), bool)
    for e, task in enumerate(tasks):
        row_seed = seed * 1_000_003 + e
        if check_draw[e] and budgets_E[e] >= 2:
            checked[e] = True
            replies.append(list(noisy().checked_actions(task, row_seed, bool(slip_draw[e]))))
            continue
        slip = noisy().slipped_actions(task, row_seed, slip_fix) if slip_draw[e] else None
        slipped[e] = slip is not None
        replies.append(list(slip) if slip is not None else list(env.ground_truth_actions(task)))
    return replies, slipped, checked


def reference_script(env, tasks: Sequence, replies: Optional[Sequence] = None) -> Callable:
    """generate_fn(t, active_B, contexts) of `host_rollout`: episode b replies its t-th reply of `replies[b]`
    (default: its task's reference, `env.ground_truth_actions`; an empty reply past its end)."""
    refs = [list(env.ground_truth_actions(task)) for task in tasks] if replies is None else [list(r) for r in replies]

    def generate(t: int, active_B, _contexts) -> list:
        return [refs[b][t] if active_B[b] and t < len(refs[b]) else "" for b in range(len(refs))]

    return generate


def sft_rows(world: HostWorld, ts: HostTaskSettings, tasks: Sequence, budgets_E, *, batch: int = 64,
             replies: Optional[Sequence] = None, slipped_E=None) -> dict:
    """The reference episodes of `tasks` with budgets_E announced, played through the world's env (module
    docstring), in rollouts of `batch` episodes; `replies` [E][turn] replaces the references (`expert_replies`),
    and a row with slipped_E[e] is kept when the env or its budget ended it, solved or not (the noisy expert's
    slip; on coding a failed submission ends the episode only at the budget). Returns
    tokens int32[E', S], mask bool[E', S] (the reply tokens), the E' kept episodes' task ids and their
    `slipped` and `solved` flags, `left_out` {task id: status or error} of the others (`n_left_out` rows), and
    `width` S (the longest kept row, a multiple of 16)."""
    # One episode group: the scripted replies take no decoding for the env steps to overlap.
    rcfg = dataclasses.replace(ts.rollout_config(), overlap_groups=1)
    toks, masks, kept, left_out, slipped, solved, n_left_out = [], [], [], {}, [], [], 0
    budgets_E = np.asarray(budgets_E, np.int32)
    slipped_E = np.zeros(len(tasks), bool) if slipped_E is None else np.asarray(slipped_E, bool)
    for lo in range(0, len(tasks), batch):
        chunk = list(tasks[lo:lo + batch])
        script = reference_script(world.env, chunk, None if replies is None else replies[lo:lo + batch])
        out = host_rollout(None, None, world.env, world.tokenizer, chunk, budgets_E[lo:lo + batch],
                           jax.random.key(0), rcfg, generate_fn=script)
        r, trace = out.rollout, out.trace
        success, length, status = np.asarray(r.success), np.asarray(r.length), np.asarray(r.status)
        for b, task in enumerate(chunk):
            slip = bool(slipped_E[lo + b])
            if success[b] or (slip and status[b] in (FAILED, BUDGET_EXHAUSTED) and trace.errors[b] is None):
                toks.append(np.asarray(r.tokens[b, :length[b]]))
                masks.append(np.asarray(r.policy_mask[b, :length[b]]))
                kept.append(task.id)
                slipped.append(slip)
                solved.append(bool(success[b]))
            else:
                n_left_out += 1
                left_out[task.id] = trace.errors[b] or f"status {int(status[b])} unsolved"
    if not kept:
        raise ValueError(f"domain {world.domain.name!r}: no reference episode ended solved with these settings "
                         f"(t_max {ts.t_max}, max_action_tokens {ts.max_action_tokens}, max_context "
                         f"{ts.max_context}); e.g. {next(iter(left_out.items()))}")
    width = int(-(-max(len(t) for t in toks) // 16) * 16)
    tokens = np.full((len(toks), width), world.tokenizer.pad_id, np.int32)
    mask = np.zeros((len(toks), width), bool)
    for e, (t, m) in enumerate(zip(toks, masks)):
        tokens[e, :len(t)], mask[e, :len(m)] = t, m
    return {"tokens": tokens, "mask": mask, "task_ids": kept, "slipped": np.asarray(slipped, bool),
            "solved": np.asarray(solved, bool), "left_out": left_out, "n_left_out": n_left_out, "width": width}


def train_sft_base(world: HostWorld, cfg: Qwen3Config, params, ts: HostTaskSettings, s: HostSFTSettings, *,
                   callback: Optional[Callable[[int, dict], None]] = None, mesh=None):
    """(params, summary): `params` fine-tuned on the reference episodes of the first `s.max_rows` train tasks
    (`sft_rows`; module docstring), a share `s.noise` of them the noisy expert's (`expert_replies`). summary: rows
    kept (slipped, and solved) and left out (with up to 5 reasons), the row width, the targets per row and the
    last step's record (loss, token accuracy, gradient norm)."""
    k_budget, k_batch = jax.random.split(jax.random.key(s.seed))
    tasks = [task for task in world.train_tasks[:s.max_rows] for _ in range(s.copies)]
    budgets = sft_lib.sft_budgets(k_budget, len(tasks), ts.t_max, s.budget_mode)
    replies, slipped, checked = expert_replies(world.env, tasks, budgets, s.noise, s.check, s.seed, s.slip_fix)
    rows = sft_rows(world, ts, tasks, budgets, replies=replies, slipped_E=slipped)
    m = max_targets(rows["mask"])
    params, records = sft_lib.fit_sft(params, cfg, rows["tokens"], rows["mask"], k_batch, steps=s.steps,
                                     batch_size=s.batch_size, lr=s.lr, warmup=s.warmup, callback=callback,
                                     mesh=mesh, targets=m, width_bucket=s.width_bucket)
    summary = {"rows": len(rows["task_ids"]), "left_out": rows["n_left_out"],
               "left_out_examples": dict(list(rows["left_out"].items())[:5]), "width": rows["width"],
               "slipped": int(rows["slipped"].sum()), "checked": int(checked.sum()),
               "solved": int(rows["solved"].sum()),
               "targets_per_row": m, "last": records[-1]}
    return params, summary


def tokenizer_corpus(env, train_tasks: Sequence, heldout_tasks: Sequence, t_max: int) -> list[str]:
    """The texts a toy preset's pruned tokenizer keeps the tokens of (`models.pruned_tokenizer`): every task's
    system prompt and first user message as the chat template renders them (with each budget text up to T_max), and
    the train tasks' reference replies. Held-out references are not read: the vocabulary is what the policy is shown
    and trained on."""
    frame = [render_chat([{"role": "user", "content": BUDGET_TEMPLATE.format(turn=t, budget=b, remaining=b - t + 1)}],
                         add_generation_prompt=True)[0] for b in range(1, t_max + 1) for t in range(1, b + 1)]
    texts = list(frame)
    for task in [*train_tasks, *heldout_tasks]:
        texts.append(render_chat([{"role": "system", "content": env.system_prompt(task)},
                                  {"role": "user", "content": env.reset(0, task)[1]}], add_generation_prompt=True)[0])
    for task in train_tasks:
        texts.extend(f"{reply}{IM_END}" for reply in env.ground_truth_actions(task))
    return texts
