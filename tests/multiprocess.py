"""Two local JAX processes as one job, for the multi-host tests (tests/test_multihost.py, test_host_multihost.py).

`start_workers` launches a worker script once per process (4 fake CPU devices each, gloo collectives on
127.0.0.1) and `wait_workers` collects them; the script's `main` calls `init_worker(argv)`, which joins the job
and returns the output path its results go to.
"""
import argparse
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_workers(script: str, out_dir, n: int = 2) -> list:
    """`tests/<script>` in n processes of 8 / n CPU devices each; returns [(Popen, output path)]."""
    port = _free_port()
    flags = os.environ.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={8 // n}",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outs = [os.path.join(str(out_dir), f"p{i}.npz") for i in range(n)]
    return [(subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", script), "--process-id", str(i),
                               "--num-processes", str(n), "--port", str(port), "--out", outs[i]],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), outs[i])
            for i in range(n)]


def wait_workers(workers: list, timeout_s: float) -> list:
    """The workers' output paths once every one exited 0 (else the test fails with its log's tail)."""
    try:
        logs = [p.communicate(timeout=timeout_s)[0] for p, _ in workers]
    except subprocess.TimeoutExpired:
        pytest.fail("multi-process workers timed out")
    finally:
        for p, _ in workers:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for (p, _), log in zip(workers, logs):
        assert p.returncode == 0, log[-4000:]
    return [out for _, out in workers]


def init_worker(argv=None) -> str:
    """Joins the job as the process named on the command line; returns the path to write results to."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--num-processes", type=int, default=2)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.num_processes,
                               process_id=args.process_id, initialization_timeout=120)
    assert jax.process_count() == args.num_processes and len(jax.devices()) == 8, jax.devices()
    assert len(jax.local_devices()) == 8 // args.num_processes
    return args.out
