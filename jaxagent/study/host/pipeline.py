"""The host-domain study (SQL, BFCL multi-turn, multi-turn coding; the preset names the domain) in order, over one
run directory: base checkpoint (`run.run_base`) -> RL arms x seeds (`run.run_arms`) -> held-out Pass@(K,T) with the
structural bound and the findings (`evaluate.evaluate`) -> runs/<name>/report.md (`write_report`); docs/host_study.md.

runs/<name>/
  config.json, tiny_checkpoint/, base/, arms/   `run` (module docstring)
  eval/                                         `evaluate` (module docstring)
  metrics.json, report.md                       `write_report`
  timing.json                                   `run_study`: wall seconds of the base, RL and eval stages
Every stage is reused when finished (DONE markers, cached evaluations); a rerun resumes where the last one stopped.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from jaxagent.study import run_dir
from jaxagent.study.common.banner import report_banner
from jaxagent.study.common.progress import no_progress
from jaxagent.study.host import (error_recovery as host_error_recovery, likelihood as host_likelihood,
                                 metrics as host_metrics, report as host_report, domains as host_domains,
                                 step_quality as host_step_quality)
from jaxagent.study.host.evaluate import evaluate
from jaxagent.study.host.presets import HostPreset
from jaxagent.study.host.run import HostRun, no_log, run_arms, run_base


def write_report(run: HostRun, metrics: dict) -> tuple[str, dict]:
    """Stage 'report': report.md (the run's settings, then the domain's section, `host_report.domain_section`) and
    metrics.json, written by process 0; returns (report path, verdicts {finding key: verdict})."""
    p, dom = run.preset, run.world.domain
    findings = host_metrics.domain_findings(dom.name, dom.title)
    section, verdicts = host_report.domain_section(
        dom.name, dom.title, metrics, findings, policies=["base", *p.arms], tiers=run.tiers, ks=p.eval.ks,
        t_max=p.task.t_max, splits=(dom.train_split, dom.heldout_split),
        notes=(dom.split_note, dom.bound_note))
    meta = report_banner(p)
    if p.scope_note:
        meta["what these findings show"] = p.scope_note
    meta |= split_meta(run)
    meta |= {"preset": p.name, "checkpoint": run.checkpoint, "arms": ", ".join(p.arms),
            "seeds": ", ".join(map(str, p.seeds)), "RL iterations per arm": str(p.iterations),
            "episodes per iteration": f"{p.n_tasks} tasks x {p.group_size}",
            "domain": f"{dom.name} ({dom.title}; env '{dom.env}')",
            "T_max": str(p.task.t_max), "tool-output cap (tokens per turn)": str(p.task.max_obs_tokens),
            "Pass@(K,T) mode": "announced", "samples per task and tier": str(p.eval.n_samples)}
    if p.sft is not None:
        done = run_dir.read_done(os.path.join(run.dir, "base")) or {}
        sft = done.get("sft") or {}
        last = sft.get("last") or {}
        meta["base policy"] = (
            f"the tiny random Qwen3 ({run.cfg.num_hidden_layers} layers, width {run.cfg.hidden_size}, vocabulary "
            f"{run.cfg.vocab_size}"
            + (": Qwen3's tokenizer pruned to the domain's texts" if p.pruned_vocabulary else "")
            + f") after SFT on the train split's reference solutions: {p.sft.steps} steps of {p.sft.batch_size} "
            f"episodes, {sft.get('rows', '?')} reference episodes ({sft.get('left_out', '?')} left out: not solved "
            f"within the limits); last loss {last.get('loss', float('nan')):.3f}, token accuracy "
            f"{last.get('token_accuracy', float('nan')):.3f}")
    if host_domains.uses_env(dom.name, host_error_recovery.DOMAINS):
        meta["finding 4 error prefixes"] = ("base's and each GRPO seed's full-budget held-out episodes, steps with "
                                            "a tool-call error that did not end the episode; one reply per policy")
    if host_domains.uses_env(dom.name, host_step_quality.DOMAINS):
        meta["finding 3 matched states"] = (f"up to {p.eval.step_states} from each of base's and each GRPO seed's "
                                            "full-budget held-out episodes (equal numbers); "
                                            f"{p.eval.step_samples} replies per policy and state, each scored by its "
                                            "unit-test pass rate")
    if host_domains.uses_env(dom.name, host_likelihood.DOMAINS):
        meta["finding 5 likelihood"] = ("base's and each GRPO seed's full-budget held-out episodes, every policy "
                                        f"token scored teacher-forced under both policies ({p.compute_dtype})")
    text = host_report.build_host_report(meta, metrics, [section])
    path = os.path.join(run.dir, "report.md")
    if run_dir.is_main_process():  # several processes: process 0 writes the report
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        run_dir.write_json(os.path.join(run.dir, "metrics.json"), metrics)
    run_dir.sync_processes(f"report:{run.dir}")
    return path, verdicts


def split_meta(run: HostRun) -> dict:
    """The report's lines on the data: its source and layout (and any warning about it, e.g. training on a
    benchmark's test questions), the held-out split and the further splits evaluated, the grading the env ran and,
    on BFCL, which cut of the benchmark (the env's `report`, `split_notes`, `grading_note`, `cut_note`)."""
    env, dom = run.world.env, run.world.domain
    out = {}
    report = getattr(env, "report", None)
    if report is not None:
        out["data"] = f"{report.layout} from {report.source}"
        for i, w in enumerate(report.warnings):
            out[f"data warning {i + 1}"] = w
    note = getattr(env, "split_notes", {}).get(dom.heldout_split, dom.split_note)
    out["trained on split"] = (f"'{dom.train_split}' ({len(run.world.train_tasks)} tasks; the seed health table's "
                               "success rates are its rollouts')")
    out["held-out split"] = f"'{dom.heldout_split}'" + (f": {note}" if note else "")
    for name, tasks in run.world.extra_heldout.items():
        out[f"also evaluated on split '{name}'"] = f"{len(tasks)} tasks: {env.split_notes.get(name, '')}"
    for key, attr in (("grading", "grading_note"), ("benchmark cut", "cut_note")):
        if isinstance(getattr(env, attr, None), str):
            out[key] = getattr(env, attr)
    return out


def run_study(preset: HostPreset, root: str = "runs", name: str | None = None, *, force: bool = False,
              log: Callable[[str], None] = no_log, progress_for: Callable | None = None) -> tuple[str, dict, dict]:
    """Every stage of `preset`'s study in <root>/<name or preset.name> (`HostRun`: checked, created and locked;
    `force` empties a run directory made with other settings); `log` receives the arms' progress lines,
    `progress_for(stage)` ("base", "RL", "eval") the `progress` of that stage (`common.progress`). Returns
    (report path, verdicts {finding key: verdict}, timing {base_s, rl_s, eval_s, total_s}: wall seconds, also
    written to timing.json by process 0)."""
    t0 = time.time()
    run = HostRun(preset, root, name, force=force)
    bars = progress_for or (lambda _stage: no_progress)
    base = run_base(run, log=log, progress=bars("base"))
    t_base = time.time()
    policies = run_arms(run, base, log=log, progress=bars("RL"))
    t_rl = time.time()
    metrics = evaluate(run, base, policies, progress=bars("eval"))
    path, verdicts = write_report(run, metrics)
    t_end = time.time()
    timing = {"base_s": t_base - t0, "rl_s": t_rl - t_base, "eval_s": t_end - t_rl, "total_s": t_end - t0}
    if run_dir.is_main_process():
        run_dir.write_json(os.path.join(run.dir, "timing.json"), timing)
    return path, verdicts, timing
