"""The first meta line of a study's report when its figures measure nothing: a rehearsal or a `ci` preset."""
from __future__ import annotations

# The first line of a rehearsal's report (`frozenlake.presets.rehearsal_preset`, `host.presets.rehearsal_preset`).
REHEARSAL_NOTE = ("a rehearsal: the preset's pipeline with its counts cut (one seed, one iteration, a few episodes "
                  "and held-out tasks, short turns); its figures check that every stage runs, they measure nothing "
                  "of the study")

# The first line of a `ci` / `ci-*` preset's report: a test of the pipeline, not a study.
PLUMBING_NOTE = ("a plumbing check: a tiny random Qwen3 runs every stage for minutes; nothing is expected to learn, "
                 "so its seeds are flagged collapsed and its verdicts measure nothing of the study")


def report_banner(preset) -> dict:
    """The report's first meta line when its figures measure nothing: a rehearsal (`REHEARSAL_NOTE`) or a `ci`
    preset (`PLUMBING_NOTE`, named ci or ci-<domain>); else {}."""
    if getattr(preset, "rehearsal", False):
        return {"rehearsal": REHEARSAL_NOTE}
    if preset.name == "ci" or preset.name.startswith("ci-"):
        return {"plumbing check": PLUMBING_NOTE}
    return {}
