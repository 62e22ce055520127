"""The host study's domains: a registered env (`envs.host.base` registry name) with its constructor keywords, train and
held-out splits and the structural bound's turns per task (`HostDomain`); built in (`DOMAINS`): sql, bfcl (BFCL v4
multi-turn), code (multi-turn coding), bfcl-first and bfcl-two (BFCL cut to its first one or two requests, tools as
signatures: the toy presets'). `register_domain` adds one; `uses_env(domain, envs)` says whether an env-specific
finding applies to a domain. Splits, bounds and the cuts: docs/host_study.md, "Domains" and "Data".
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from jaxagent.envs.host import base as host_envs

@dataclasses.dataclass(frozen=True)
class HostDomain:
    """A study domain on a host env: `env` (an `envs.host.base` registry name) built with `env_kwargs`
    ((name, value) pairs), its train / held-out splits, and `bound_fn(env, task) -> int`, the turns of the
    reference solution (None: `env.upper_bound_turns`). `split_note` and `bound_note` say, in the report, how
    the env makes the splits and what the reference solution's turns are."""

    name: str
    title: str
    env: str
    env_kwargs: tuple = ()
    train_split: str = "train"
    heldout_split: str = "test"
    bound_fn: Optional[Callable[[Any, Any], int]] = None
    split_note: str = ""
    bound_note: str = ""
    # a reference reply longer than the reply cap leaves its task unsolvable at every tier (`HostWorld.min_turns`):
    # true where one reply cannot be split over turns (a query, a program); BFCL's calls can be
    whole_replies: bool = False

    def make_env(self):
        return host_envs.make(self.env, **dict(self.env_kwargs))

    def min_turns(self, env, task) -> int:
        return int(self.bound_fn(env, task) if self.bound_fn is not None else env.upper_bound_turns(task))


DOMAINS: dict[str, HostDomain] = {
    "sql": HostDomain("sql", "SQL", "sql", split_note="the env's held-out split", whole_replies=True,
                      bound_note="1 turn for every task (the schema is in the prompt: one answer)"),
    "bfcl": HostDomain(
        "bfcl", "BFCL multi-turn", "bfcl",
        split_note="BFCL v4 multi-turn base, long_context, miss_func and miss_param; scenario index % 4 == 3 held "
                   "out (the same scenarios in every category); the tasks whose ground truth cannot replay left out",
        bound_note="per user turn one message with all its ground-truth calls (if it has any) plus one closing "
                   "message: the replayed ground truth"),
    "code": HostDomain("code", "Multi-turn coding", "code", whole_replies=True,
                       split_note="the env's held-out split",
                       bound_note="1 turn for every task whose reference fits the reply cap (it passes in one "
                                  "submission); none for a longer one"),
    # The bfcl-toy preset's domain: BFCL's tasks cut to their first request, the tools as one-line signatures
    # (`BFCLEnv` user_turns, tool_docs): prompts of 176-485 tool tokens instead of 2,031-4,878, so a 2-core CPU
    # can fine-tune and train on them. Not the BFCL benchmark: one request per task, no tool descriptions.
    "bfcl-first": HostDomain(
        "bfcl-first", "BFCL first requests", "bfcl",
        env_kwargs=(("user_turns", 1), ("tool_docs", "signatures")),
        split_note="BFCL v4 multi-turn base, long_context, miss_func and miss_param cut to their first user request, "
                   "tools as one-line signatures; scenario index % 4 == 3 held out; the tasks whose ground truth "
                   "cannot replay, and those whose first request has no ground-truth call, left out",
        bound_note="one message with the request's ground-truth calls plus one closing message (2 turns)"),
    # The bfcl2-toy preset's domain: the first two user requests of every task, so that the state one request leaves
    # is what the next works on (a multi-turn cut of BFCL, where bfcl-first is single-request tool calling).
    "bfcl-two": HostDomain(
        "bfcl-two", "BFCL first two requests", "bfcl",
        env_kwargs=(("user_turns", 2), ("tool_docs", "signatures")),
        split_note="BFCL v4 multi-turn base, long_context, miss_func and miss_param cut to their first two user "
                   "requests, tools as one-line signatures; scenario index % 4 == 3 held out; the tasks whose ground "
                   "truth cannot replay, and those whose two requests have no ground-truth call, left out",
        bound_note="per request one message with its ground-truth calls (if any) plus one closing message (3-4 "
                   "turns)"),
}


def register_domain(domain: HostDomain, *, overwrite: bool = False) -> None:
    """Adds a domain (e.g. `HostDomain('bfcl-base', 'BFCL base', 'bfcl', env_kwargs=(('categories', ('base',)),))`);
    ValueError if the name is taken."""
    if domain.name in DOMAINS and not overwrite:
        raise ValueError(f"domain {domain.name!r} is already registered (pass overwrite=True to replace)")
    DOMAINS[domain.name] = domain


def uses_env(domain: str, envs: Sequence[str]) -> bool:
    """Whether the registered `domain` runs one of `envs` (env registry names): an env-specific finding (3-6,
    each module's `DOMAINS`) applies to every domain on its env, e.g. finding 4 to bfcl and bfcl-first."""
    return get_domain(domain).env in envs


def get_domain(name: str) -> HostDomain:
    if name not in DOMAINS:
        raise ValueError(f"unknown host domain {name!r}; registered: {sorted(DOMAINS)}")
    return DOMAINS[name]
