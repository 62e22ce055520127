"""Bad messages from the command line: a coordinator address that cannot be one, and a job whose processes never
meet.

Class "bad message" of the hostile-input suite (test_hostile_graders.py has the suite's list). Expected, in each
case: one line on stderr, exit code 2, no traceback, nothing written, and no hang (`--distributed
--coordinator-address ::::` used to wait past 240 s with no output).
"""
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from experiments import cli, host_study, reproduce

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("address, message", [
    ("::::", r"expected host:port, an IPv6 address in brackets \(\[::1\]:1234\); got '::::'"),
    ("::1:8476", r"expected host:port, an IPv6 address in brackets"),
    ("[zz]:8476", r"\[zz\] is not an IPv6 address"),
    ("host:0", r"the port must be an integer in 1..65535, got '0'"),
    ("host:99999", r"the port must be an integer in 1..65535, got '99999'"),
    ("host", r"expected host:port"),
    ("bad_host!:8476", r"'bad_host!' is not a host name or IPv4 address"),
])
@pytest.mark.parametrize("main", [host_study.main, reproduce.main])
def test_a_coordinator_address_that_cannot_be_one_is_a_usage_error(main, address, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--preset", "ci-sql", "--root", str(tmp_path), "--distributed", "--coordinator-address", address])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and re.search("argument --coordinator-address: " + message, err[0]), err
    assert not os.listdir(tmp_path)


def test_addresses_that_are_addresses_are_kept():
    for address in ("[::1]:8476", "[fe80::1%eth0]:1", "127.0.0.1:8476", "node-3.cluster.local:65535", "localhost:1"):
        assert cli.coordinator_address(address) == address


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_coordinator_nobody_answers_ends_in_one_line_at_the_connect_timeout(tmp_path):
    """Process 1 of 2 with a coordinator port nobody listens on and --connect-timeout 3. Expected: exit code 2 and
    one line naming the address and the timeout, well before JAX's own deadline aborts the process with a C++
    stack trace; no run directory."""
    address = f"127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "experiments.host_study", "--preset", "ci-sql", "--root",
                           str(tmp_path / "runs"), "--distributed", "--coordinator-address", address,
                           "--num-processes", "2", "--process-id", "1", "--connect-timeout", "3"],
                          cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(err) == 1, proc.stderr[-3000:]
    assert err[0].startswith(f"error: --distributed: process 1 of 2 and the job's other processes did not all "
                             f"connect to {address} within 3 s (--connect-timeout)"), err
    assert time.monotonic() - t0 < 200 and not (tmp_path / "runs").exists()
