"""The study scripts' progress bars: the `progress` the training and eval stages of `jaxagent.study.frozenlake`
report their steps to, shown with tqdm on process 0."""
from __future__ import annotations

import time

from tqdm import tqdm


def is_main_process() -> bool:
    """`run_dir.is_main_process`, imported when a bar first shows (it loads JAX; --help does not)."""
    from jaxagent.study.run_dir import is_main_process as main_process
    return main_process()


def plural(unit: str) -> str:
    """'step' -> 'steps', 'policy' -> 'policies'."""
    return unit[:-1] + "ies" if unit.endswith("y") and unit[-2:-1] not in "aeiou" else unit + "s"


class ProgressBar:
    """A tqdm bar over a stage's steps that starts after the first step. The first one also compiles the
    stage's programs, which on a CPU takes many times a later step (the `ci` preset's first SFT step: 25 s, the
    next three: a fraction of a second), so it gets its own line with its seconds and the bar's rate and ETA count
    only the steps after it. A first step under `QUICK_S` compiled nothing (a result read back from the run
    directory): no line. Process 0 only."""

    QUICK_S = 1.0

    def __init__(self, total: int, desc: str, unit: str, *, initial: int = 0, log=print):
        self.total, self.desc, self.unit, self.initial, self.log = total, desc, unit, initial, log
        self.t0, self.bar = time.time(), None

    def step(self, **postfix) -> None:
        if self.bar is None:
            took = time.time() - self.t0
            if is_main_process() and took >= self.QUICK_S:
                self.log(f"[{self.desc}] {self.unit} {self.initial + 1} of {self.total}: {took:.1f} s "
                         f"(it compiles the programs the first time they run; the rate below counts the "
                         f"{plural(self.unit)} after it)")
            self.bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, initial=self.initial + 1,
                            disable=not is_main_process())
        else:
            self.bar.update(1)
        self.bar.set_postfix(**postfix)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def bars(log=print):
    """The `progress` argument of the library's stages: a `ProgressBar` per stage, its first-step line to `log`."""
    def progress(total: int, desc: str, unit: str, *, initial: int = 0) -> ProgressBar:
        return ProgressBar(total, desc, unit, initial=initial, log=log)
    return progress
