"""What every benchmark shares: the machine load during a run and the busy flag (`LoadMeter`, `busy_verdict`,
`flag_busy`), the PyTorch peer's settings and the best of them (`peer_settings`, `pick_best`), the square-matmul
peak, median timing, a checked throughput (`rate`) and the JSON output (`dump`).

Busy rule (`busy_verdict`). A run is *busy* when either holds:
  (a) processes other than the benchmark used more than `MAX_OTHER_CORES` = 0.3 cores on average over the run
      (/proc/stat's busy time on this process's CPUs minus the benchmark's own CPU time, over the wall time);
  (b) the 1-minute load average at the start of the run exceeded `MAX_LOAD_FRAC` = 0.5 x `os.cpu_count()`.
Where /proc/stat cannot be read, (b) alone decides. A busy run's ratios against the peer are null and moved to
`<name>_busy` (`flag_busy`), so a ratio taken on a loaded machine cannot be quoted.
Peer settings: torch intra-op threads 1..N under OMP_WAIT_POLICY unset and PASSIVE (one thread once), one worker
process per policy; the fastest wins (ties: fewer threads, then the default policy), named in the JSON
(`torch_threads`, `omp_wait_policy`, every setting's time in `torch_settings`). The rule's inputs, the load fields
every run reports and why each policy has its own process: docs/performance.md, "How to measure".
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from typing import Callable, Mapping, Sequence

MAX_OTHER_CORES = 0.3
MAX_LOAD_FRAC = 0.5
PASSIVE = "PASSIVE"
DEFAULT_POLICY = "default"  # OMP_WAIT_POLICY removed from the worker's environment


# ------------------------------------------------------------------ machine load
def usable_cpus() -> list[int]:
    """CPU indices this process may run on (its affinity mask), or range(os.cpu_count())."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def parse_proc_stat(text: str, cpus: Sequence[int]) -> float:
    """Busy clock ticks (user+nice+system+irq+softirq+steal; guest time is inside user) summed over
    the `cpuK` lines of /proc/stat for K in `cpus`."""
    want = {f"cpu{k}" for k in cpus}
    total, seen = 0, set()
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in want:
            v = [int(x) for x in fields[1:9]] + [0] * max(0, 9 - len(fields))
            user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
            total += user + nice + system + irq + softirq + steal
            seen.add(fields[0])
    if seen != want:
        raise ValueError(f"/proc/stat lacks lines for {sorted(want - seen)}")
    return float(total)


@dataclasses.dataclass(frozen=True)
class LoadSample:
    """One reading: wall clock, busy CPU-seconds of the usable cores (None without /proc/stat), this
    process's own CPU-seconds (reaped children included) and the load averages."""
    wall_s: float
    cpu_busy_s: float | None
    own_s: float
    loadavg: tuple[float, float, float]


def sample_load(cpus: Sequence[int] | None = None) -> LoadSample:
    cpus = usable_cpus() if cpus is None else cpus
    try:
        with open("/proc/stat") as f:
            busy = parse_proc_stat(f.read(), cpus) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = None
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return LoadSample(time.monotonic(), busy, own, tuple(os.getloadavg()))


def load_between(start: LoadSample, end: LoadSample, cores: int) -> dict:
    """Average cores used by other processes and by us between two samples, and the 1-min loadavg."""
    wall = end.wall_s - start.wall_s
    if wall <= 0:
        raise ValueError(f"load window must have positive length, got {wall} s")
    own = (end.own_s - start.own_s) / wall
    other = None
    if start.cpu_busy_s is not None and end.cpu_busy_s is not None:
        # clock-tick rounding can make the difference slightly negative on an idle machine
        other = max(0.0, (end.cpu_busy_s - start.cpu_busy_s) / wall - own)
    return {"cores": cores, "measure_s": wall, "other_cores": other,
            "other_cpu_s": None if other is None else other * wall, "own_cores": own,
            "loadavg_1m_start": start.loadavg[0], "loadavg_1m_end": end.loadavg[0]}


def busy_verdict(other_cores: float | None, loadavg_1m_start: float, cores: int, *,
                 max_other_cores: float = MAX_OTHER_CORES,
                 max_load_frac: float = MAX_LOAD_FRAC) -> tuple[bool, str | None]:
    """The busy rule of the module docstring: (busy, reason or None); `cores` = the machine's cores."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    reasons = []
    if other_cores is not None and other_cores > max_other_cores:
        reasons.append(f"other processes used {other_cores:.2f} cores on average (limit {max_other_cores})")
    if loadavg_1m_start > max_load_frac * cores:
        reasons.append(f"1-min loadavg {loadavg_1m_start:.2f} at start > {max_load_frac} x {cores} cores")
    return bool(reasons), ("; ".join(reasons) or None)


class LoadMeter:
    """Built at the start of a run; `fields()` at its end gives the load keys and the busy verdict."""

    def __init__(self):
        self.cpus = usable_cpus()
        self.start_sample = sample_load(self.cpus)

    def fields(self) -> dict:
        out = load_between(self.start_sample, sample_load(self.cpus), len(self.cpus))
        machine_cores = max(os.cpu_count() or 1, out["cores"])
        out["busy"], out["busy_reason"] = busy_verdict(out["other_cores"], out["loadavg_1m_start"], machine_cores)
        return out


def flag_busy(out: dict, ratio_keys: Sequence[str]) -> dict:
    """Moves each ratio in `ratio_keys` to `<key>_busy` (and sets `<key>` to None) when out["busy"];
    on a quiet run `<key>_busy` is None. Keys absent from `out` are skipped."""
    if "busy" not in out:
        raise ValueError("flag_busy needs out['busy'] (from LoadMeter.fields())")
    for k in ratio_keys:
        if k in out:
            value = out[k]
            out[k], out[f"{k}_busy"] = (None, value) if out["busy"] else (value, None)
    return out


# ------------------------------------------------------------------ peer settings
@dataclasses.dataclass(frozen=True)
class PeerSetting:
    """torch intra-op threads and OMP_WAIT_POLICY (DEFAULT_POLICY: the variable unset)."""
    threads: int
    wait_policy: str = DEFAULT_POLICY

    @property
    def label(self) -> str:
        return f"t{self.threads}" + ("" if self.wait_policy == DEFAULT_POLICY else f"-{self.wait_policy.lower()}")


def peer_settings(cores: int, threads: int = 0, policies: Sequence[str] = (DEFAULT_POLICY, PASSIVE)) -> list[PeerSetting]:
    """Threads 1..cores (or only `threads` when > 0) x `policies`; one thread once (no pool to wait)."""
    if cores < 1 or threads < 0:
        raise ValueError(f"need cores >= 1 and threads >= 0, got cores={cores}, threads={threads}")
    if not policies or any(p not in (DEFAULT_POLICY, PASSIVE) for p in policies):
        raise ValueError(f"policies must be a non-empty subset of {(DEFAULT_POLICY, PASSIVE)}, got {policies}")
    counts = [threads] if threads else list(range(1, cores + 1))
    out = []
    for t in counts:
        out.extend([PeerSetting(t, policies[0])] if t == 1 else [PeerSetting(t, p) for p in policies])
    return out


def pick_best(times: Mapping[PeerSetting, float | None]) -> PeerSetting:
    """The fastest setting; ties go to fewer threads, then the default policy. None / non-finite
    times (a failed setting) are skipped."""
    ok = {s: t for s, t in times.items() if t is not None and math.isfinite(t)}
    if not ok:
        raise ValueError(f"no setting has a finite time: {dict(times)}")
    return min(ok, key=lambda s: (ok[s], s.threads, s.wait_policy != DEFAULT_POLICY))


def per_setting(results: Mapping[PeerSetting, dict], fn) -> dict:
    """{label: fn(result)} in the order t1, t2, t2-passive, ..., for the JSON's per-setting table."""
    order = sorted(results, key=lambda s: (s.threads, s.wait_policy != DEFAULT_POLICY, s.wait_policy))
    return {s.label: fn(results[s]) for s in order}


def setting_fields(best: PeerSetting, threads_key: str = "torch_threads",
                   policy_key: str = "omp_wait_policy") -> dict:
    """The winning setting as JSON keys."""
    return {threads_key: best.threads, policy_key: best.wait_policy}


# ------------------------------------------------------------------ timing and rates
def time_call(fn: Callable[[], object]) -> float:
    """Wall seconds of one call of `fn`, by `time.perf_counter` (monotonic: never negative)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of `repeats` calls of `fn`."""
    return statistics.median(time_call(fn) for _ in range(repeats))


def rate(count, seconds) -> float:
    """count / seconds (a throughput), refusing what would be no measurement: a missing count or time, a time
    <= 0 or not finite, a negative count. ValueError with one line naming what is wrong."""
    if count is None or seconds is None:
        raise ValueError(f"no throughput: the {'count' if count is None else 'time'} is missing")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"no throughput: measured time {seconds!r} s is not > 0")
    if not math.isfinite(count) or count < 0:
        raise ValueError(f"no throughput: count {count!r} is not a non-negative number")
    return count / seconds


def matmul_peak_gflops(n: int, repeats: int, dtype=None, compiler_options=None) -> float:
    """Best-of-`repeats` GFLOP/s of a jitted n x n @ n x n matmul (2 n^3 FLOPs), f32 unless `dtype`."""
    import jax
    import jax.numpy as jnp

    dtype = jnp.float32 if dtype is None else dtype
    k1, k2 = jax.random.split(jax.random.key(0))
    a, b = jax.random.normal(k1, (n, n), dtype), jax.random.normal(k2, (n, n), dtype)
    mm = jax.jit(jnp.matmul, compiler_options=compiler_options)
    mm(a, b).block_until_ready()
    best = min(median_time(lambda: mm(a, b).block_until_ready(), 1) for _ in range(repeats))
    return 2 * n ** 3 / best / 1e9


def jax_matmul_gflops(n: int, repeats: int) -> float:
    """Best f32 n x n matmul GFLOP/s through XLA, with its default options and with jaxagent's."""
    from jaxagent.xla_options import DECODING_CPU_OPTIONS
    return max(matmul_peak_gflops(n, repeats, compiler_options=o) for o in (None, DECODING_CPU_OPTIONS))


def dump(result: dict, one_line: bool) -> str:
    """The result as JSON: one line (`--json`) or indented."""
    return json.dumps(result) if one_line else json.dumps(result, indent=1)
