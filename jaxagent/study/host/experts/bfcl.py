"""The BFCL env's noisy expert (`BFCLExpert`), for `BFCLEnv` and its cuts (`user_turns`, `tool_docs`; the toy
study's `bfcl-first` and `bfcl-two` domains).

The slip (`BFCLExpert.slipped_actions`): in the first user turn with ground-truth calls, one call with one required
argument left out, alone in its message; the env answers it with a schema error and executes nothing. With
probability `fix` the expert then sends the reference (which solves the task one step later), otherwise it closes
the turn ("Done.": it gives up, and the turn fails). A slip it always fixed would cost nothing at the full budget,
so RL trained there would have nothing to unlearn. What is wrong with an episode (`BFCLExpert.submission_mistake`,
one of BFCL_MISTAKE_KINDS) is found by replaying it.

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations

import random
from typing import Any

from jaxagent.envs.host.base import coerce_action, parse_tool_calls, strip_think
from jaxagent.envs.host.bfcl_calls import MAX_CALLS_PER_MESSAGE, format_tool_call, validate_call
from jaxagent.envs.host.bfcl_env import BFCLEnv, BFCLTask
from jaxagent.study.host.experts.base import NoisyExpert, check_slip_fix

# What is wrong with an unsolved episode (`BFCLExpert.submission_mistake`), in this order of precedence
BFCL_MISTAKE_KINDS = ("solved", "slip", "wrong calls", "no call", "out of budget", "other")


class BFCLExpert(NoisyExpert):
    """The noisy expert of `BFCLEnv` (module docstring)."""

    env_class = BFCLEnv
    mistake_kinds = BFCL_MISTAKE_KINDS

    def slipped_actions(self, task: BFCLTask, seed: int, fix: float = 1.0) -> list[str] | None:
        """The noisy expert's episode (module docstring): the reference, with one message inserted before the
        first user turn's calls that has ground-truth calls: its call with a required argument, that argument
        left out (call and argument drawn with `seed`); with probability 1 - fix (drawn with `seed`) the
        expert then gives up: the slip and a closing message. None when no call of that turn has a required
        argument."""
        check_slip_fix(fix)
        env = self.env
        calls_per_turn = env.ground_truth_calls(task)
        docs = env.function_docs(task)
        turn = next((i for i, c in enumerate(calls_per_turn) if c), None)
        if turn is None:
            return None
        rng = random.Random(seed)
        options = [(name, kwargs, [a for a in docs[name][1].get("parameters", {}).get("required", ())
                                   if a in kwargs]) for name, kwargs in calls_per_turn[turn]]
        options = [o for o in options if o[2]]
        if not options:
            return None
        name, kwargs, required = rng.choice(options)
        drop = rng.choice(required)
        slip = format_tool_call(name, {k: v for k, v in kwargs.items() if k != drop})
        fixes = rng.random() < fix
        actions = env.ground_truth_actions(task)
        at = sum(1 + bool(c) for c in calls_per_turn[:turn])  # the reference's message of that turn
        return actions[:at] + [slip] + (actions[at:] if fixes else ["Done."])

    def is_slip(self, task: BFCLTask, action: Any) -> bool:
        """Whether `action` has the noisy expert's slip form (`slipped_actions`): one call of a known function with
        a required argument missing."""
        text, err = coerce_action(action)
        calls = parse_tool_calls(strip_think(text), MAX_CALLS_PER_MESSAGE) if err is None else []
        docs = self.env.function_docs(task)
        if len(calls) != 1 or calls[0].error is not None or calls[0].name not in docs:
            return False
        _, problem = validate_call(docs[calls[0].name][1], calls[0].arguments)
        return problem is not None and "missing the required argument" in problem

    def submission_mistake(self, task: BFCLTask, actions: list, solved: bool) -> str:
        """What is wrong with an episode (BFCL_MISTAKE_KINDS), found by replaying `actions` in a fresh episode:
        'solved'; 'slip' (some message has the slip form, `is_slip`); 'wrong calls' (a user turn closed with
        calls whose state or results differ from the ground truth's); 'no call' (a turn closed without the calls
        its ground truth makes); 'out of budget' (the replies ran out before every turn closed); 'other' (e.g. the
        20-step force-quit)."""
        if solved:
            return "solved"
        if any(self.is_slip(task, a) for a in actions):
            return "slip"
        state, _ = self.env.reset(0, task)
        for a in actions:
            if state.done:
                break
            state = self.env.step(state, a)[0]
        failure = state.failure or ""
        if "mismatch" in failure:
            return "wrong calls"
        if "empty_turn" in failure:
            return "no call"
        return "out of budget" if not state.done else "other"
