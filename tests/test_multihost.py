"""Multi-host: two local processes (4 fake CPU devices each, gloo collectives on 127.0.0.1) form one
8-device mesh and run the sharded train step; losses and parameters equal a one-process run on 8
fake devices (the test process itself)."""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests import multihost_worker as worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "multihost_worker.py"), "--process-id", str(i),
         "--num-processes", "2", "--port", str(port), "--out", str(tmp_path / f"p{i}.npz")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    try:
        # the one-process reference runs here meanwhile (conftest gives this process 8 devices)
        ref_losses, ref_checksum, ref_params = worker.run()
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT_S)
            outs.append(out)
    except subprocess.TimeoutExpired:
        pytest.fail("multi-host workers timed out")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    results = [np.load(tmp_path / f"p{i}.npz") for i in range(2)]
    assert np.all(np.isfinite(ref_losses)) and len(ref_losses) == worker.STEPS
    for r in results:
        assert int(r["process_count"]) == 2
        np.testing.assert_allclose(r["losses"], ref_losses, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(float(r["checksum"]), ref_checksum, rtol=1e-5)
        assert sorted(k for k in r.files if k.startswith("[")) == sorted(ref_params)
        for k, v in ref_params.items():
            np.testing.assert_allclose(r[k], v, atol=1e-5, rtol=1e-5, err_msg=k)
    # the two processes agree with each other exactly (same program, same collectives)
    np.testing.assert_array_equal(results[0]["losses"], results[1]["losses"])
