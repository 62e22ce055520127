"""The PyTorch peers' worker processes: one fresh process per OpenMP wait policy (OpenMP reads
OMP_WAIT_POLICY when torch starts its runtime), each running `MODULE.peer_worker(spec, threads)` over
its thread counts and printing one JSON line. The settings, the best of them and the busy rule are
`jaxagent.bench.harness`'s.

    python -m experiments.peers.workers MODULE SPEC.json THREADS(csv)      # what run_peer_workers runs
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from typing import Mapping, Sequence

from jaxagent.bench.harness import DEFAULT_POLICY, PeerSetting

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker_env(policy: str, base: Mapping[str, str] | None = None) -> dict:
    """The environment of a peer worker: OMP_WAIT_POLICY set to `policy` or removed for the default."""
    env = dict(os.environ if base is None else base)
    env.pop("OMP_NUM_THREADS", None)  # torch.set_num_threads decides
    env["JAX_PLATFORMS"] = "cpu"  # the worker's incidental jax use (building inputs) must not probe accelerators
    if policy == DEFAULT_POLICY:
        env.pop("OMP_WAIT_POLICY", None)
    else:
        env["OMP_WAIT_POLICY"] = policy
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_peer_workers(module: str, spec: dict, settings: Sequence[PeerSetting], *,
                     timeout_s: float = 3600.0) -> dict[PeerSetting, dict]:
    """Runs `module.peer_worker(spec, threads)` once per wait policy in a fresh process and returns
    each setting's result dict. `spec` must be JSON-serialisable."""
    by_policy: dict[str, list[int]] = {}
    for s in settings:
        by_policy.setdefault(s.wait_policy, []).append(s.threads)
    results = {}
    with tempfile.TemporaryDirectory() as d:
        spec_path = os.path.join(d, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        for policy, threads in by_policy.items():
            cmd = [sys.executable, "-m", "experiments.peers.workers", module, spec_path,
                   ",".join(str(t) for t in sorted(threads))]
            proc = subprocess.run(cmd, env=worker_env(policy), cwd=REPO_ROOT, capture_output=True, text=True,
                                  timeout=timeout_s)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                raise RuntimeError(f"peer worker {module} (OMP_WAIT_POLICY={policy}, threads {threads}) failed "
                                   f"with exit code {proc.returncode}:\n{proc.stderr[-4000:]}")
            reply = json.loads(lines[-1])
            seen = reply["omp_wait_policy"] or DEFAULT_POLICY
            if seen != policy:
                raise RuntimeError(f"peer worker saw OMP_WAIT_POLICY={seen}, expected {policy}")
            for t, r in reply["results"].items():
                results[PeerSetting(int(t), policy)] = r
    return results


def _worker_main(argv: Sequence[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m experiments.peers.workers MODULE SPEC.json THREADS(csv)", file=sys.stderr)
        return 2
    module, spec_path, threads = argv
    with open(spec_path) as f:
        spec = json.load(f)
    counts = sorted(int(t) for t in threads.split(","))
    results = importlib.import_module(module).peer_worker(spec, counts)
    print(json.dumps({"omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                      "results": {str(t): r for t, r in results.items()}}))
    return 0



def torch_matmul_gflops(n: int, repeats: int) -> float:
    """Best-of-`repeats` GFLOP/s of the square f32 n x n matmul through torch (its BLAS), after one untimed call."""
    import time

    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
