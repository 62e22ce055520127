"""Unit tests of jaxagent.bench.harness (the busy rule, load arithmetic, peer-setting selection, the checked
throughput) and of the peers' worker plumbing (experiments.peers.workers), on synthetic inputs (no benchmark runs)."""
import math
import os

import pytest

from experiments.peers import workers
from jaxagent.bench import harness as bc
from jaxagent.bench.harness import DEFAULT_POLICY, PASSIVE, PeerSetting

PROC_STAT = """cpu  900 90 300 5000 40 0 7 3 0 0
cpu0 100 10 50 2000 20 0 2 1 0 0
cpu1 200 20 60 1500 10 0 3 2 0 0
cpu2 600 60 190 1500 10 0 2 0 0 0
intr 12345 0 0
ctxt 999
"""


def peer_worker(spec, threads):
    """Fake peer for the plumbing test: reports what the worker process saw."""
    return {t: {"policy": os.environ.get("OMP_WAIT_POLICY"), "threads": t, "tag": spec["tag"]} for t in threads}


# ------------------------------------------------------------------ load arithmetic
def test_parse_proc_stat_sums_busy_fields_of_chosen_cpus():
    # cpu0: user+nice+system+irq+softirq+steal = 100+10+50+0+2+1 (idle and iowait excluded)
    assert bc.parse_proc_stat(PROC_STAT, [0]) == 163
    assert bc.parse_proc_stat(PROC_STAT, [0, 1]) == 163 + 285
    with pytest.raises(ValueError, match="cpu5"):
        bc.parse_proc_stat(PROC_STAT, [0, 5])


def test_load_between_subtracts_own_time():
    a = bc.LoadSample(wall_s=100.0, cpu_busy_s=50.0, own_s=10.0, loadavg=(0.4, 0.3, 0.2))
    b = bc.LoadSample(wall_s=110.0, cpu_busy_s=65.0, own_s=15.0, loadavg=(1.2, 0.5, 0.3))
    out = bc.load_between(a, b, cores=2)
    assert out["own_cores"] == pytest.approx(0.5)
    assert out["other_cores"] == pytest.approx(1.0)  # 15 busy cpu-s / 10 s - 0.5 own
    assert out["other_cpu_s"] == pytest.approx(10.0)
    assert (out["loadavg_1m_start"], out["loadavg_1m_end"], out["cores"]) == (0.4, 1.2, 2)
    assert out["measure_s"] == pytest.approx(10.0)


def test_load_between_clamps_tick_rounding_and_handles_missing_proc_stat():
    a = bc.LoadSample(0.0, 10.0, 0.0, (0.0, 0.0, 0.0))
    b = bc.LoadSample(10.0, 19.9, 10.0, (0.0, 0.0, 0.0))  # own time a tick above the cores' busy time
    assert bc.load_between(a, b, 1)["other_cores"] == 0.0
    no_stat = bc.load_between(bc.LoadSample(0.0, None, 0.0, (0.1, 0, 0)), bc.LoadSample(5.0, None, 1.0, (0.1, 0, 0)), 2)
    assert no_stat["other_cores"] is None and no_stat["other_cpu_s"] is None and no_stat["own_cores"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="positive"):
        bc.load_between(b, a, 1)


def test_load_meter_reports_this_machine():
    out = bc.LoadMeter().fields()
    assert out["cores"] == len(bc.usable_cpus()) >= 1
    assert isinstance(out["busy"], bool)
    assert out["own_cores"] >= 0 and out["measure_s"] > 0
    assert (out["busy_reason"] is None) == (not out["busy"])


# ------------------------------------------------------------------ busy rule
@pytest.mark.parametrize("other, load, cores, busy", [
    (0.1, 0.2, 2, False),
    (0.3, 1.0, 2, False),     # at both limits: still quiet
    (0.31, 0.2, 2, True),     # other processes above 0.3 cores
    (0.0, 1.01, 2, True),     # loadavg above half the cores at start
    (0.0, 3.9, 8, False),
    (None, 0.2, 2, False),    # no /proc/stat: loadavg alone decides
    (None, 2.5, 2, True),
])
def test_busy_verdict(other, load, cores, busy):
    got, reason = bc.busy_verdict(other, load, cores)
    assert got is busy
    assert (reason is None) == (not busy)


def test_busy_verdict_names_every_reason():
    busy, reason = bc.busy_verdict(1.62, 10.98, 2)
    assert busy and "1.62 cores" in reason and "loadavg 10.98" in reason
    with pytest.raises(ValueError, match="cores"):
        bc.busy_verdict(0.0, 0.0, 0)


def test_flag_busy_moves_ratios_out_of_reach():
    busy = bc.flag_busy({"busy": True, "decode_ratio": 3.9, "other": 1.0}, ("decode_ratio", "absent_ratio"))
    assert busy == {"busy": True, "decode_ratio": None, "decode_ratio_busy": 3.9, "other": 1.0}
    quiet = bc.flag_busy({"busy": False, "decode_ratio": 3.5}, ("decode_ratio",))
    assert quiet == {"busy": False, "decode_ratio": 3.5, "decode_ratio_busy": None}
    with pytest.raises(ValueError, match="busy"):
        bc.flag_busy({"decode_ratio": 3.5}, ("decode_ratio",))


# ------------------------------------------------------------------ peer settings
def test_peer_settings_grid():
    assert bc.peer_settings(2) == [PeerSetting(1, DEFAULT_POLICY), PeerSetting(2, DEFAULT_POLICY),
                                   PeerSetting(2, PASSIVE)]
    assert len(bc.peer_settings(4)) == 1 + 2 * 3
    assert bc.peer_settings(2, threads=1) == [PeerSetting(1, DEFAULT_POLICY)]
    assert bc.peer_settings(2, threads=3) == [PeerSetting(3, DEFAULT_POLICY), PeerSetting(3, PASSIVE)]
    assert bc.peer_settings(2, policies=(PASSIVE,)) == [PeerSetting(1, PASSIVE), PeerSetting(2, PASSIVE)]
    with pytest.raises(ValueError, match="cores"):
        bc.peer_settings(0)
    with pytest.raises(ValueError, match="policies"):
        bc.peer_settings(2, policies=("ACTIVE",))


def test_setting_labels_and_table_order():
    s = [PeerSetting(2, PASSIVE), PeerSetting(1), PeerSetting(2)]
    assert [x.label for x in s] == ["t2-passive", "t1", "t2"]
    assert list(bc.per_setting({x: x.threads for x in s}, lambda r: r)) == ["t1", "t2", "t2-passive"]
    assert bc.setting_fields(PeerSetting(2, PASSIVE)) == {"torch_threads": 2, "omp_wait_policy": "PASSIVE"}


def test_pick_best_takes_fastest_with_tie_breaks():
    t1, t2, t2p = PeerSetting(1), PeerSetting(2), PeerSetting(2, PASSIVE)
    # default spin-waiting at 2 threads on a loaded machine loses to 1 thread
    assert bc.pick_best({t1: 0.015, t2: 0.489, t2p: 0.021}) == t1
    assert bc.pick_best({t1: 0.015, t2: 0.009, t2p: 0.010}) == t2
    assert bc.pick_best({t2p: 0.01, t2: 0.01, t1: 0.02}) == t2      # tie: the default policy
    assert bc.pick_best({t2: 0.01, t1: 0.01}) == t1                 # tie: fewer threads
    assert bc.pick_best({t1: None, t2: math.inf, t2p: 0.5}) == t2p  # failed settings skipped
    with pytest.raises(ValueError, match="finite"):
        bc.pick_best({t1: None, t2: math.nan})


# ------------------------------------------------------------------ workers
def test_worker_env_sets_or_removes_the_policy():
    base = {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": "7", "PATH": "/bin"}
    assert workers.worker_env(PASSIVE, base)["OMP_WAIT_POLICY"] == PASSIVE
    env = workers.worker_env(DEFAULT_POLICY, base)
    assert "OMP_WAIT_POLICY" not in env and "OMP_NUM_THREADS" not in env and env["PATH"] == "/bin"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == workers.REPO_ROOT


def test_run_peer_workers_gives_each_policy_its_process():
    settings = bc.peer_settings(2, threads=0) + [PeerSetting(3, PASSIVE)]
    got = workers.run_peer_workers("tests.test_bench_harness", {"tag": "x"}, settings, timeout_s=120)
    assert set(got) == set(settings)
    for s, r in got.items():
        assert r == {"policy": None if s.wait_policy == DEFAULT_POLICY else PASSIVE, "threads": s.threads, "tag": "x"}


def test_run_peer_workers_reports_a_failing_worker():
    with pytest.raises(RuntimeError, match="peer worker"):
        workers.run_peer_workers("experiments.peers.workers", {}, [PeerSetting(1)], timeout_s=120)


# ------------------------------------------------------------------ checked throughput
def test_rate_divides_a_positive_time():
    assert bc.rate(64, 0.5) == 128.0 and bc.rate(0, 2.0) == 0.0


@pytest.mark.parametrize("count, seconds, says", [
    (10, 0.0, "not > 0"), (10, -1e-3, "not > 0"), (10, math.nan, "not > 0"), (10, math.inf, "not > 0"),
    (None, 1.0, "count is missing"), (10, None, "time is missing"), (-1, 1.0, "non-negative"),
    (math.nan, 1.0, "non-negative"),
])
def test_rate_refuses_what_is_no_measurement(count, seconds, says):
    with pytest.raises(ValueError, match=says) as err:
        bc.rate(count, seconds)
    assert str(err.value).startswith("no throughput") and "\n" not in str(err.value)
