"""What every noisy expert of the host study's toy bases offers (`NoisyExpert`), and the check of its fix
probability (`check_slip_fix`); the per-env experts are in `sql`, `code` and `bfcl`, found by `expert_for`
(the package).

No dimension legend: host-side Python, no arrays.
"""
from __future__ import annotations


class NoisyExpert:
    """The noisy expert of one env's tasks: the env's reference (`env.ground_truth_actions`) with a generic
    mistake, and what is wrong with an episode's submission. A method an expert does not define raises
    NotImplementedError.

      slipped_actions(task, seed, fix=1.0) -> [str] | None   the reference with one generic mistake (a slip;
                          None where none applies): the toy base's noise; on coding and BFCL followed, with
                          probability `fix` (drawn with seed), by the reference, else by giving up
      checked_actions(task, seed, slip) -> [str]   a reference that checks before it answers (its first turn a
                          tool call, slipped with `slip`; the toy base's multi-turn episodes)
      submission_mistake(task, actions, solved) -> str   what is wrong with an episode's final submission, one
                          of `mistake_kinds` (the toy studies' mistake tables, `study.host.mistakes`)
    """

    env_class: type | None = None  # the env class (and its subclasses) the expert plays (`expert_for`)
    mistake_kinds: tuple = ()  # what `submission_mistake` can return; () where the expert sorts no submissions

    def __init__(self, env):
        self.env = env

    def slipped_actions(self, task, seed: int, fix: float = 1.0) -> list[str] | None:
        raise NotImplementedError(f"{type(self).__name__} defines no slipped reference solution")

    def checked_actions(self, task, seed: int, slip: bool) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__} defines no checked reference solution")

    def submission_mistake(self, task, actions: list, solved: bool) -> str:
        raise NotImplementedError(f"{type(self).__name__} does not sort submissions by mistake")


def check_slip_fix(fix, what: str = "slip fix probability") -> float:
    """`fix` of `slipped_actions` (the probability that the noisy expert fixes its slip) as a float; ValueError
    (naming it `what`) unless it is a number in [0, 1]."""
    if isinstance(fix, bool) or not isinstance(fix, (int, float)) or not 0 <= fix <= 1:
        raise ValueError(f"{what} must be a number in [0, 1], got {fix!r}")
    return float(fix)
