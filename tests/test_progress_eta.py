"""The study's ETA covers every stage: `progress.Pipeline` counts the base SFT's steps, RL's iterations over every
arm x seed and the evaluation's policies, measures each stage's seconds per unit after its first (compiling) step,
counts stages read back from the run directory as done, and says which stages are not yet timed."""
from experiments import progress
from jaxagent.study.frozenlake.presets import PRESETS


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _steps(bar, clock, times):
    for t in times:
        clock.now = t
        bar.step()


def test_the_eta_covers_base_rl_and_eval(monkeypatch):
    monkeypatch.setattr(progress, "is_main_process", lambda: True)
    lines, clock = [], Clock()
    pipe = progress.Pipeline([("base", 4, "step"), ("RL", 6, "iteration"), ("eval", 3, "policy")],
                             log=lines.append, clock=clock)
    assert pipe.line() == ("[study] base 0 of 4 steps, RL 0 of 6 iterations, eval 0 of 3 policies; base, RL and eval "
                           "not yet timed")
    base = pipe.bars("base")(4, "base SFT", "step")
    _steps(base, clock, [10.0, 11.0])             # the first step compiles: 1 s per step after it
    assert pipe.line() == ("[study] base 2 of 4 steps, RL 0 of 6 iterations, eval 0 of 3 policies; about 2 s left "
                           "(base 2 s at 1 s per step); RL and eval not yet timed")
    _steps(base, clock, [12.0, 13.0])
    base.close()
    assert lines[-1].startswith("[study] base 4 of 4 steps, RL 0 of 6 iterations") and len(lines) == 1
    rl = pipe.bars("RL")
    rl(3, "grpo seed 0", "iteration", initial=3).close()    # read back from the run directory: done, no line
    assert pipe.done["RL"] == 3 and len(lines) == 1
    run = rl(3, "grpo seed 1", "iteration")
    _steps(run, clock, [20.0, 22.0, 24.0])
    run.close()
    assert lines[-1] == ("[study] base 4 of 4 steps, RL 6 of 6 iterations, eval 0 of 3 policies; eval not yet timed")
    ev = pipe.bars("eval")(3, "eval Pass@(K,T)", "policy")
    _steps(ev, clock, [30.0, 35.0])
    assert pipe.line().endswith("eval 2 of 3 policies; about 5 s left (eval 5 s at 5 s per policy)")
    _steps(ev, clock, [40.0])
    ev.close()
    assert lines[-1].endswith("eval 3 of 3 policies; every stage done")


def test_a_stage_that_starts_marks_the_ones_before_it_done():
    pipe = progress.Pipeline([("base", 200, "step"), ("RL", 10, "iteration"), ("eval", 2, "policy")], log=print)
    pipe.bars("eval")
    assert pipe.done == {"base": 200, "RL": 10, "eval": 0}


def test_the_study_stages_of_a_preset():
    q = PRESETS["quick"]
    arms = len(q.arms)  # RL: arms x 5 seeds x 12 iterations; eval: the base and every arm on each seed's maps
    assert progress.study_stages(q) == [("base", 200, "step"), ("RL", arms * 5 * 12, "iteration"),
                                        ("eval", 5 * (arms + 1) + 2 * 5, "policy")]  # + the headline's base, GRPO
    assert progress.study_stages(PRESETS["ci"])[0] == ("base", 4, "step")


def test_the_host_study_stages_of_a_preset():
    from jaxagent.study.host.presets import HOST_PRESETS
    p = HOST_PRESETS["sql-toy"]
    assert progress.host_stages(p) == [("base", p.sft.steps, "step"),
                                       ("RL", len(p.arms) * len(p.seeds) * p.iterations, "iteration"),
                                       ("eval", 1 + len(p.seeds) * (1 + len(p.arms)), "policy")]
    assert progress.host_stages(HOST_PRESETS["ci-sql"])[0] == ("base", 0, "step")  # a checkpoint base: no SFT
