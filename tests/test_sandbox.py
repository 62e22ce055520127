"""The code sandbox contains hostile code and reports it as failed calls, quickly, without hurting
the test process."""

import os
import socket
import time

import pytest

from jaxagent.envs.sandbox import SandboxLimits, run_calls

LIMITS = SandboxLimits(wall_s=2.0, per_call_s=0.5, cpu_s=3)
STRONG = os.geteuid() == 0  # CI runs as root: namespaces + a private uid
# Any successful containment must finish within the wall limit plus process start-up and cleanup.
MAX_S = LIMITS.wall_s + 3.0


def _run(code, args_list=([],), limits=LIMITS):
    t0 = time.monotonic()
    r = run_calls(code, "f", [list(a) for a in args_list], limits)
    return r, time.monotonic() - t0


def _sandbox_uids():
    uids = set()
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            uid = int(line.split()[1])
                            if uid >= 200_000:
                                uids.add(uid)
                            break
            except OSError:
                pass
    return uids


def test_values_round_trip_and_errors():
    code = "def f(x):\n    if x == 3:\n        raise ValueError('three')\n    return (x, {x}, [x * 1.5], {'k': x})\n"
    r, _ = _run(code, [[1], [3]])
    assert r.load_error is None
    assert r.outcomes[0].status == "ok" and r.outcomes[0].value == [1, [1], [1.5], {"k": 1}]
    assert r.outcomes[1].status == "error" and r.outcomes[1].error == "ValueError: three"
    if STRONG:
        assert r.isolation == "namespaces"


def test_load_errors_are_reported():
    r, _ = _run("def f(:\n    pass\n")
    assert r.load_error.startswith("SyntaxError")
    assert r.outcomes[0].status == "not_run"
    r, _ = _run("def g():\n    return 1\n")
    assert "function 'f' is not defined" in r.load_error


@pytest.mark.parametrize("code", [
    "def f():\n    while True:\n        pass\n",
    "while True:\n    pass\n",
    "def f():\n    while True:\n        try:\n            while True:\n                pass\n        except BaseException:\n            pass\n",
    "import time\ndef f():\n    time.sleep(100)\n",
], ids=["loop-in-call", "loop-at-import", "loop-swallowing-timeouts", "sleep"])
def test_infinite_loops_time_out(code):
    r, dt = _run(code)
    assert r.outcomes[0].status in ("timeout", "not_run")
    assert dt < MAX_S


def test_fork_bomb_is_contained():
    code = ("import os\ndef f():\n    while True:\n        try:\n            os.fork()\n"
            "        except BaseException:\n            pass\n")
    r, dt = _run(code)
    assert r.outcomes[0].status != "ok"
    assert dt < MAX_S
    time.sleep(0.2)
    assert not _sandbox_uids(), "sandbox processes survived the run"


def test_background_process_dies_with_the_run():
    code = "import os, time\ndef f():\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(60)\n    return 1\n"
    r, dt = _run(code)
    assert dt < MAX_S
    time.sleep(0.2)
    if STRONG:
        assert r.outcomes[0].value == 1
        assert not _sandbox_uids(), "a detached child outlived the sandbox"
    else:
        assert r.outcomes[0].status != "ok"  # weak mode refuses fork


@pytest.mark.parametrize("code", [
    "def f():\n    x = bytearray(10 ** 10)\n    return 1\n",
    "def f():\n    x = [0] * (10 ** 9)\n    return 1\n",
    "def f():\n    s = 'x'\n    while True:\n        s = s + s\n",
], ids=["bytearray", "list", "doubling-string"])
def test_huge_allocations_fail(code):
    r, dt = _run(code)
    assert r.outcomes[0].status != "ok"  # MemoryError, or killed, or out of time while copying
    assert dt < MAX_S


def test_writes_outside_the_work_dir_are_blocked(tmp_path):
    home_dir = os.path.join(os.path.expanduser("~"), ".cache")
    os.makedirs(home_dir, exist_ok=True)
    targets = [str(tmp_path / "escape.txt"), os.path.join(home_dir, f"jaxagent-escape-{os.getpid()}.txt"),
               "/etc/jaxagent-escape.txt"]
    code = "def f(path):\n    with open(path, 'w') as fh:\n        fh.write('escaped')\n    return 1\n"
    try:
        r, dt = _run(code, [[t] for t in targets])
        for o in r.outcomes:
            assert o.status == "error", o
        assert dt < MAX_S
        for t in targets:
            assert not os.path.exists(t), f"sandbox wrote {t}"
    finally:
        for t in targets:
            if os.path.exists(t):
                os.remove(t)


def test_work_dir_is_writable_but_file_size_is_limited():
    code = ("def f(n):\n    with open('out.bin', 'wb') as fh:\n        fh.write(b'x' * n)\n"
            "    with open('out.bin', 'rb') as fh:\n        return len(fh.read())\n")
    r, _ = _run(code, [[1000], [64 * 2 ** 20]])
    assert r.outcomes[0].value == 1000
    assert r.outcomes[1].status == "error"


def test_network_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = ("import socket\ndef f(host, port):\n    s = socket.create_connection((host, port), timeout=1.0)\n"
            "    return 'connected'\n")
    try:
        r, dt = _run(code, [["127.0.0.1", port], ["10.0.0.1", 80]])
        for o in r.outcomes:
            assert o.status in ("error", "timeout"), o
        assert dt < MAX_S
        server.settimeout(0.2)
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_exit_and_signals_do_not_reach_the_caller():
    r, _ = _run("import os\ndef f():\n    os._exit(0)\n")
    assert r.outcomes[0].status == "not_run"
    r, _ = _run("import os, signal\ndef f():\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 1\n")
    assert r.outcomes[0].status == "error"
    r, _ = _run("import os, signal\ndef f():\n    os.kill(-1, signal.SIGKILL)\n    return 1\n")
    assert os.getpid() > 0  # still alive


def test_expected_values_never_enter_the_sandbox():
    # The harness only sends arguments; a solution cannot find expected outputs to echo back.
    code = "import gc\ndef f():\n    return [type(o).__name__ for o in gc.get_objects() if isinstance(o, dict) and 'expected' in o][:1]\n"
    r, _ = _run(code)
    assert r.outcomes[0].value == []


def test_weak_mode_blocks_sockets_and_outside_writes(tmp_path):
    limits = SandboxLimits(wall_s=3.0, per_call_s=1.0, mode="rlimits")
    target = str(tmp_path / "weak-escape.txt")
    code = ("import os\ndef f(kind, path):\n    if kind == 'net':\n        import socket\n        socket.socket()\n"
            "        return 'socket'\n    with open(path, 'w') as fh:\n        fh.write('x')\n    return 'wrote'\n")
    r = run_calls(code, "f", [["net", ""], ["write", target], ["write", "inside.txt"]], limits)
    assert r.isolation == "rlimits"
    assert r.outcomes[0].status == "error" and r.outcomes[1].status == "error"
    assert r.outcomes[2].value == "wrote"
    assert not os.path.exists(target)


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError):
        run_calls("def f(): pass", "not an identifier", [[]])
    with pytest.raises(ValueError):
        run_calls("def f(x): pass", "f", [[object()]])
    with pytest.raises(ValueError):
        SandboxLimits(mode="docker")
