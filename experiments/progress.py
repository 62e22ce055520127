"""The study scripts' progress bars: the `progress` the training and eval stages of `jaxagent.study.frozenlake`
report their steps to, shown with tqdm on process 0, and `Pipeline`, an ETA over the whole study (base SFT, RL,
evaluation) that those bars feed."""
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
    directory): no line. Process 0 only. `on_step()` runs at each step and `on_close()` when a bar that stepped
    closes (a `Pipeline`'s)."""

    QUICK_S = 1.0

    def __init__(self, total: int, desc: str, unit: str, *, initial: int = 0, log=print, on_step=None,
                 on_close=None):
        self.total, self.desc, self.unit, self.initial, self.log = total, desc, unit, initial, log
        self.on_step, self.on_close = on_step, on_close
        self.t0, self.bar = time.time(), None

    def step(self, **postfix) -> None:
        if self.on_step is not None:
            self.on_step()
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
            if self.on_close is not None:
                self.on_close()


def bars(log=print):
    """The `progress` argument of the library's stages: a `ProgressBar` per stage, its first-step line to `log`."""
    def progress(total: int, desc: str, unit: str, *, initial: int = 0) -> ProgressBar:
        return ProgressBar(total, desc, unit, initial=initial, log=log)
    return progress


class Pipeline:
    """An ETA over a study's stages, each of a known size in its own unit: `stages` is (name, units, unit) in the
    order they run, e.g. `study_stages(preset)`. `bars(name)` is the `progress` argument of that stage; when it is
    made, the stages before it are over (finished here or read back). Units count as done when a bar steps, or
    when a bar starts at `initial` (resumed, or a stage read back reporting `initial=total`). A stage's seconds
    per unit: the wall time from its first step's end to its latest step over the steps between (the first step
    compiles its programs; what runs between bars, such as a new arm's compile, is counted); a stage with no such
    step yet has no estimate, and the line says so instead of guessing. After every bar that stepped closes (the
    base, each arm x seed, the evaluation's policies), process 0 logs `line()`. `clock`: seconds (tests)."""

    def __init__(self, stages, log=print, clock=time.time):
        self.order = [name for name, _, _ in stages]
        self.total = {name: int(n) for name, n, _ in stages}
        self.unit = {name: unit for name, _, unit in stages}
        self.done = dict.fromkeys(self.order, 0)
        self.timed = {}   # stage -> [the end of its first step, steps after it, the end of the latest]
        self.log, self.clock = log, clock

    def bars(self, stage: str):
        for name in self.order[:self.order.index(stage)]:
            self.done[name] = self.total[name]

        def progress(total: int, desc: str, unit: str, *, initial: int = 0) -> ProgressBar:
            self.done[stage] = min(self.done[stage] + initial, self.total[stage])
            return ProgressBar(total, desc, unit, initial=initial, log=self.log,
                               on_step=lambda: self.step(stage), on_close=self.report)
        return progress

    def step(self, stage: str) -> None:
        """One unit of `stage` done now."""
        self.done[stage] = min(self.done[stage] + 1, self.total[stage])
        now = self.clock()
        if stage not in self.timed:
            self.timed[stage] = [now, 0, now]
        else:
            self.timed[stage][1:] = [self.timed[stage][1] + 1, now]

    def line(self) -> str:
        """'[study] base 200 of 200 steps, RL 36 of 120 iterations, eval 0 of 12 policies; about 92 s left (RL 92 s
        at 1.1 s per iteration); eval not yet timed'."""
        counts = ", ".join(f"{n} {self.done[n]} of {self.total[n]} {plural(self.unit[n])}" for n in self.order)
        left, untimed = [], []
        for n in self.order:
            rest = self.total[n] - self.done[n]
            if rest <= 0:
                continue
            first, steps, latest = self.timed.get(n, (0.0, 0, 0.0))
            if steps:
                each = (latest - first) / steps
                left.append((n, rest * each, each))
            else:
                untimed.append(n)
        if not left and not untimed:
            return f"[study] {counts}; every stage done"
        text = f"[study] {counts}; about {sum(s for _, s, _ in left):.0f} s left" if left else f"[study] {counts}"
        if left:
            text += " (" + ", ".join(f"{n} {s:.0f} s at {each:.2g} s per {self.unit[n]}" for n, s, each in left) + ")"
        if untimed:
            names = ", ".join(untimed[:-1]) + (" and " if len(untimed) > 1 else "") + untimed[-1]
            text += f"; {names} not yet timed"
        return text

    def report(self) -> None:
        if is_main_process():
            self.log(self.line())


def study_stages(preset) -> list:
    """A FrozenLake preset's stages for `Pipeline`: the base SFT's steps (none from a checkpoint), RL's iterations
    over every arm x seed, and the evaluation's Pass@(K,T) policies (the base on each seed's maps, then every arm x
    seed, then the headline evaluation's base and GRPO policy per seed when the preset has one; the diagnostics
    after them have no unit and are not counted)."""
    n_seeds, n_arms = len(preset.seeds), len(preset.arms)
    headline = 2 * n_seeds if preset.eval.headline_tasks and "grpo" in preset.arms else 0
    return [("base", 0 if preset.checkpoint else preset.base.steps, "step"),
            ("RL", n_arms * n_seeds * preset.iterations, "iteration"),
            ("eval", n_seeds * (1 + n_arms) + headline, "policy")]


def host_stages(preset) -> list:
    """A host preset's stages for `Pipeline`: the base SFT's steps (none for a checkpoint base), RL's iterations over
    every arm x seed, and the evaluation's Pass@(K,T) policies (the base once and per seed, then every arm x seed;
    the findings' diagnostics after them are not counted)."""
    n_seeds, n_arms = len(preset.seeds), len(preset.arms)
    return [("base", 0 if preset.sft is None else preset.sft.steps, "step"),
            ("RL", n_arms * n_seeds * preset.iterations, "iteration"),
            ("eval", 1 + n_seeds + n_arms * n_seeds, "policy")]
