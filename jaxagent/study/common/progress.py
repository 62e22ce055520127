"""What a study stage reports its steps to: `progress(total, desc, unit, initial=0)` returns an object with
`step(**postfix)` and `close()`; the default `no_progress` shows nothing (the scripts pass bars and an ETA,
experiments/progress.py). A stage read back from the run directory reports its size as done (`initial=total`)."""
from __future__ import annotations


class NoProgress:
    """A progress report that shows nothing (`no_progress`)."""

    def step(self, **postfix) -> None:
        """One step done; `postfix` the numbers a bar would show beside it."""

    def close(self) -> None:
        """The stage is over."""


def no_progress(total: int, desc: str, unit: str, *, initial: int = 0) -> NoProgress:
    """The default `progress`: a stage of `total` steps (`initial` already done) that shows nothing."""
    return NoProgress()
