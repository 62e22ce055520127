"""docs/aot.md's tables, rendered from the stored records (docs/aot_records/*.jsonl).

A records directory holds the JSON lines of `python -m experiments.aot_check --preset NAME --json` runs:
`<preset>.jsonl` (every program of the preset), `<preset>.<part>.jsonl` (some programs, compiled in a run of
their own: they join the preset's table and replace the same program's line of the files before them in name
order) and `<preset>.mesh_<D>x<F>x<T>.jsonl` (the preset compiled on another (data, fsdp, tensor) mesh with
`--mesh D F T`: a table of its own). Records of another topology than the preset's other files (e.g. a GPU
preset's TPU proxy, `--topology v5p:...`, or its H200 records, `--target h200`) make a table of their own too.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

from jaxagent.aot.verdict import FLOPS_TOLERANCE

BEGIN = "<!-- aot_report: begin (python -m experiments.aot_report writes this section) -->"
END = "<!-- aot_report: end -->"


@dataclasses.dataclass
class Table:
    """The records of one preset configuration and the files they come from."""
    preset: str
    mesh: str                 # "" for the preset's own mesh, else 'DxFxT' (`--mesh`)
    files: list[str]
    records: list[dict]
    topology: str = ""


def load_records(path: str) -> list[dict]:
    """The JSON records of one file (lines that are not JSON objects are skipped)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def tables(records_dir: str) -> list[Table]:
    """The records of `records_dir` grouped into tables (module docstring), by preset and mesh; within a table
    `<preset>.jsonl` first, then the parts in name order."""
    files = []
    for name in os.listdir(records_dir):
        if not name.endswith(".jsonl"):
            continue
        recs = load_records(os.path.join(records_dir, name))
        preset, stem = (recs[0].get("preset") if recs else None), name[:-len(".jsonl")]
        if preset is None or not (stem == preset or stem.startswith(preset + ".")):
            raise ValueError(f"{name}: a records file is named <preset>[.<part>].jsonl after its records' preset "
                             f"(here {preset!r})")
        files.append((preset, stem != preset, name, stem[len(preset) + 1:], recs))
    out: dict[tuple[str, str, str], Table] = {}
    for preset, _, name, part, recs in sorted(files, key=lambda f: f[:3]):
        m = re.fullmatch(r"mesh_(\d+x\d+x\d+)", part)
        mesh = m.group(1) if m else ""
        topology = recs[0].get("topology", "") if recs else ""
        table = out.setdefault((preset, mesh, topology), Table(preset, mesh, [], [], topology))
        table.files.append(name)
        for rec in recs:
            same = [i for i, r in enumerate(table.records) if r["program"] == rec["program"]]
            if same:
                table.records[same[0]] = rec
            else:
                table.records.append(rec)
    return sorted(out.values(), key=lambda t: (t.preset, t.mesh, t.topology))


def _memory(rec: dict) -> str:
    mem = rec["memory_gib"]
    own = (f"{mem['program']:.2f} + {mem['resident']:.2f} = " if "program" in mem else "")
    return f"{own}{mem['total']:.2f} / {rec['hbm_gib']:.1f} ({rec['hbm_fraction']:.2f})"


def _flops(rec: dict) -> str:
    ratio = rec.get("flops_ratio")
    text = f"{rec['flops_per_chip']:.3g}"
    if ratio is None:
        return text
    if ratio > FLOPS_TOLERANCE and rec["status"] != "flops_over":
        return f"{text} (x{ratio}: an upper bound, not checked)"
    return f"{text} (x{ratio})"


def _collectives(rec: dict) -> str:
    coll = rec["collectives"]
    if not coll:
        return "none (one chip)" if rec["chips"] == 1 else "none"
    return "; ".join(f"{k} {v['count']} / {v['gib']:.1f}" for k, v in sorted(coll.items()))


def _attention(rec: dict) -> str:
    dense = rec.get("dense_scores")
    fused = f"{rec['fused_attention_calls']} fused calls"
    return fused + (f"; dense scores {dense['shape']} ({dense['gib']:.2f} GiB)" if dense else "")


def program_table(recs: list[dict]) -> str:
    """One markdown row per record: status, memory per chip, FLOPs, collectives, (GPU) attention, compile time
    and shapes."""
    gpu = any(r.get("platform") == "gpu" for r in recs)
    rows = ["| program | status | GiB per chip: program + resident = total / HBM (fraction) | FLOPs per chip "
            "(x analytic) | collectives: executions / GiB |" + (" attention |" if gpu else "") + " compile s | shapes |",
            "|---|---|---|---|---|" + ("---|" if gpu else "") + "---|---|"]
    for rec in recs:
        name = rec["program"] + (f" (= {rec['same_program_as']})" if "same_program_as" in rec else "")
        if rec["status"] == "compile_error":
            rows.append(f"| {name} | compile_error: {rec['error'][:200]} | | | |" + (" |" if gpu else "")
                        + f" {rec.get('compile_s', '')} | {rec.get('shapes', '')} |")
            continue
        att = f" {_attention(rec)} |" if gpu else ""
        rows.append(f"| {name} | {rec['status']} | {_memory(rec)} | {_flops(rec)} | {_collectives(rec)} |{att} "
                    f"{rec.get('compile_s', '')} | {rec.get('shapes', '')} |")
    return "\n".join(rows)


def _title(t: Table) -> str:
    rec = t.records[0]
    unit = "GPU" if rec.get("platform") == "gpu" else "chip"
    where = f"{rec['topology']}, {rec['chips']} {unit}{'s' if rec['chips'] > 1 else ''}"
    if unit == "GPU":
        where += f", {rec['hbm_gib']:g} GiB pool each"
    if "proxy" in rec:
        where += f", as {rec['chips']} GPU{'s' if rec['chips'] > 1 else ''} of {rec['hbm_gib']:g} GiB"
    mesh = f", mesh {t.mesh.replace('x', ' x ')} (`--mesh {t.mesh.replace('x', ' ')}`)" if t.mesh else ""
    layers = f", {rec['layers']} layers" if rec.get("layers") else ""
    return f"{t.preset} ({where}{mesh}{layers})"


def summary_table(ts: list[Table]) -> str:
    """One row per table: how many programs are 'ok' and the largest fraction of HBM."""
    rows = ["| preset | programs ok | largest fraction of HBM | records |", "|---|---|---|---|"]
    for t in ts:
        ok = sum(r["status"] == "ok" for r in t.records)
        fits = [r for r in t.records if "hbm_fraction" in r]
        top = max(fits, key=lambda r: r["hbm_fraction"]) if fits else None
        largest = f"{top['hbm_fraction']:.2f} ({top['program']})" if top else "-"
        files = ", ".join(f"`{f}`" for f in t.files)
        rows.append(f"| {_title(t)} | {ok} / {len(t.records)} | {largest} | {files} |")
    return "\n".join(rows)


def render(records_dir: str) -> str:
    """The tables section of docs/aot.md: the summary, then one table per preset configuration."""
    ts = tables(records_dir)
    parts = [BEGIN, "", summary_table(ts)]
    for t in ts:
        parts += ["", f"**{_title(t)}**: " + ", ".join(f"`docs/aot_records/{f}`" for f in t.files), "",
                  program_table(t.records)]
    return "\n".join(parts + ["", END])


def replace_section(doc: str, section: str) -> str:
    """`doc` with the text from BEGIN to END replaced by `section`; ValueError when the markers are missing."""
    i, j = doc.find(BEGIN), doc.find(END)
    if i < 0 or j < i:
        raise ValueError(f"the document has no '{BEGIN}' ... '{END}' markers for the tables")
    return doc[:i] + section + doc[j + len(END):]
