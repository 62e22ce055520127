"""Multi-host: two local processes (4 fake CPU devices each, gloo collectives on 127.0.0.1) form one
8-device mesh and run the sharded train step; losses and parameters equal a one-process run on 8
fake devices (the test process itself)."""
import numpy as np
import pytest

from tests import multihost_worker as worker
from tests.multiprocess import start_workers, wait_workers

TIMEOUT_S = 420


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
    workers = start_workers("multihost_worker.py", tmp_path)
    # the one-process reference runs here meanwhile (conftest gives this process 8 devices)
    ref_losses, ref_checksum, ref_params = worker.run()
    paths = wait_workers(workers, TIMEOUT_S)
    results = [np.load(path) for path in paths]
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
