"""The code sandbox contains hostile code and reports it as failed calls, quickly, without hurting
the test process; it refuses to run without strong isolation unless told to, reports its own
failures as infrastructure errors, bounds the memory of a whole run, and cannot be lied to."""

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from jaxagent.envs.host import sandbox
from jaxagent.envs.host.sandbox import (SandboxLimits, SandboxSetupError, SandboxUnavailable, run_calls,
                                   strong_isolation_problem)

LIMITS = SandboxLimits(wall_s=2.0, per_call_s=0.5, cpu_s=3)
WEAK = SandboxLimits(wall_s=2.0, per_call_s=0.5, cpu_s=3, mode="unsafe-rlimits-only")
PROBLEM = strong_isolation_problem()
STRONG = PROBLEM is None  # CI runs as root: namespaces + a private uid
needs_strong = pytest.mark.skipif(not STRONG, reason=f"strong isolation unavailable here: {PROBLEM}")
MODES = [pytest.param(LIMITS, id="namespaces", marks=needs_strong), pytest.param(WEAK, id="weak")]
# Any successful containment must finish within the wall limit plus process start-up and cleanup.
MAX_S = LIMITS.wall_s + 3.0


def _run(code, args_list=([],), limits=LIMITS):
    t0 = time.monotonic()
    r = run_calls(code, "f", [list(a) for a in args_list], limits)
    return r, time.monotonic() - t0


@pytest.fixture
def run_uids(monkeypatch):
    """The uids this test's runs were given (other test files may run sandboxes at the same time)."""
    uids = set()
    pick = sandbox.pick_uid

    def recording():
        uid = pick()
        uids.add(uid)
        return uid

    monkeypatch.setattr(sandbox, "pick_uid", recording)
    return uids


def _survivors(uids):
    """pids of processes whose real uid is one of `uids`."""
    found = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) in uids:
                                found.append(int(e))
                            break
            except OSError:
                pass
    return found


def _can_unshare_ur():
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-Ur", "true"], capture_output=True).returncode == 0


# ------------------------------------------------------------------------------------------------
# Behaviour of ordinary and broken code (both modes)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("limits", MODES)
def test_values_round_trip_and_errors(limits):
    code = "def f(x):\n    if x == 3:\n        raise ValueError('three')\n    return (x, {x}, [x * 1.5], {'k': x})\n"
    r, _ = _run(code, [[1], [3]], limits)
    assert r.load_error is None
    assert r.outcomes[0].status == "ok" and r.outcomes[0].value == [1, [1], [1.5], {"k": 1}]
    assert r.outcomes[1].status == "error" and r.outcomes[1].error == "ValueError: three"
    assert r.isolation == ("namespaces" if limits.strong else "unsafe-rlimits-only")


def test_a_run_preloads_the_modules_its_program_names():
    """`sandbox.preloads`: the PRELOAD modules named in the program's text (whole words), nothing else."""
    code = "import math\nfrom collections import Counter\n# heapq would be nice\ndef f(x):\n    return x\n"
    assert sandbox.preloads(code) == ["collections", "heapq", "math"]
    assert sandbox.preloads("def f(x):\n    return x + 1\n") == []
    assert sandbox.preloads("import mathematics, recollections\n") == []


@pytest.mark.parametrize("limits", MODES)
def test_modules_the_program_does_not_name_still_import(limits):
    """A module the run did not preload (its name built at run time, so no word of the program names it) is
    imported inside the call, with the preloaded ones beside it."""
    code = ("import math\ndef f(x):\n    m = __import__('stat' + 'istics')\n    c = __import__('coll' + 'ections')\n"
            "    return [m.median([x, 3, 5]), c.Counter('aab')['a'], math.isqrt(x)]\n")
    assert sandbox.preloads(code) == ["math"]
    r, _ = _run(code, [[4], [9]], limits)
    assert r.load_error is None and [o.value for o in r.outcomes] == [[4, 2, 2], [5, 2, 3]]


@pytest.mark.parametrize("limits", MODES)
def test_load_errors_are_reported(limits):
    r, _ = _run("def f(:\n    pass\n", limits=limits)
    assert r.load_error.startswith("SyntaxError")
    assert r.outcomes[0].status == "not_run"
    r, _ = _run("def g():\n    return 1\n", limits=limits)
    assert "function 'f' is not defined" in r.load_error
    r, _ = _run("raise KeyError('at import')\ndef f():\n    return 1\n", [[], []], limits)
    assert r.load_error == "KeyError: 'at import'" and [o.status for o in r.outcomes] == ["not_run"] * 2


@needs_strong
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


@pytest.mark.parametrize("limits", MODES)
def test_a_busy_loop_is_stopped_at_the_runs_cpu_quota(limits):
    limits = dataclasses.replace(limits, wall_s=8.0, per_call_s=7.0, cpu_s=1)
    t0 = time.monotonic()
    r = run_calls("def f():\n    while True:\n        pass\n", "f", [[], []], limits)
    assert [o.status for o in r.outcomes] == ["not_run", "not_run"], r
    assert r.outcomes[0].error.startswith("CPUQuota"), r
    assert r.cpu_exceeded and not r.timed_out and 1.0 <= r.cpu_s <= limits.cpu_s + 0.5, r
    assert time.monotonic() - t0 < limits.per_call_s


@needs_strong
def test_fork_bomb_is_contained(run_uids):
    code = ("import os\ndef f():\n    while True:\n        try:\n            os.fork()\n"
            "        except BaseException:\n            pass\n")
    r, dt = _run(code)
    assert r.outcomes[0].status != "ok"
    assert dt < MAX_S
    time.sleep(0.2)
    assert not _survivors(run_uids), "sandbox processes survived the run"


@needs_strong
def test_background_process_dies_with_the_run(run_uids):
    code = "import os, time\ndef f():\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(60)\n    return 1\n"
    r, dt = _run(code, [[], []])
    assert dt < MAX_S
    assert [o.value for o in r.outcomes] == [1, 1]
    time.sleep(0.2)
    assert not _survivors(run_uids), "a detached child outlived the sandbox"


@needs_strong
@pytest.mark.parametrize("code", [
    "def f():\n    x = bytearray(10 ** 10)\n    return 1\n",
    "def f():\n    x = [0] * (10 ** 9)\n    return 1\n",
    "def f():\n    s = 'x'\n    while True:\n        s = s + s\n",
], ids=["bytearray", "list", "doubling-string"])
def test_huge_allocations_fail(code):
    r, dt = _run(code)
    assert r.outcomes[0].status != "ok"  # MemoryError, or killed, or out of time while copying
    assert dt < MAX_S


@needs_strong
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


@needs_strong
def test_other_processes_and_their_environment_are_invisible():
    holder = subprocess.Popen(["sleep", "30"], env={"JAXAGENT_SECRET": "s3cr3t-value"})
    code = textwrap.dedent("""\
        import os
        def f():
            found = []
            for e in os.listdir('/proc'):
                if e.isdigit():
                    try:
                        with open('/proc/%s/environ' % e, 'rb') as fh:
                            if b's3cr3t-value' in fh.read():
                                found.append(e)
                    except OSError:
                        pass
            return [found, os.getppid() > 0, max(int(e) for e in os.listdir('/proc') if e.isdigit())]
        """)
    try:
        deadline = time.monotonic() + 5.0
        while True:  # the secret is there to be found (once the holder has exec'd)
            with open(f"/proc/{holder.pid}/environ", "rb") as fh:
                if b"s3cr3t-value" in fh.read():
                    break
            assert time.monotonic() < deadline, "the holder's environment never showed the secret"
            time.sleep(0.01)
        r, _ = _run(code)
        found, _, max_pid = r.outcomes[0].value
        assert found == [] and max_pid < 100  # a fresh pid namespace: only the run's own processes
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("limits", MODES)
def test_work_dir_is_writable_but_file_size_is_limited(limits):
    code = ("def f(n):\n    with open('out.bin', 'wb') as fh:\n        fh.write(b'x' * n)\n"
            "    with open('out.bin', 'rb') as fh:\n        return len(fh.read())\n")
    r, _ = _run(code, [[1000], [64 * 2 ** 20]], limits)
    assert r.outcomes[0].value == 1000
    assert r.outcomes[1].status == "error"


@needs_strong
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


@pytest.mark.parametrize("limits", MODES)
def test_exit_and_signals_do_not_reach_the_caller(limits):
    # Each call runs in its own worker: a call that exits is that call's crash, not the others'.
    r, _ = _run("import os\ndef f(x):\n    if x:\n        os._exit(0)\n    return 2\n", [[1], [0]], limits)
    assert r.outcomes[0].status == "error" and r.outcomes[0].error.startswith("Crash")
    assert r.outcomes[1].value == 2
    r, _ = _run("import os, signal\ndef f():\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 1\n", limits=limits)
    assert r.outcomes[0].status != "ok"
    r, _ = _run("import os, signal\ndef f():\n    os.kill(-1, signal.SIGKILL)\n    return 1\n", limits=limits)
    assert os.getpid() > 0  # still alive


def test_expected_values_never_enter_the_sandbox():
    # The harness only sends arguments; a solution cannot find expected outputs to echo back.
    code = "import gc\ndef f():\n    return [type(o).__name__ for o in gc.get_objects() if isinstance(o, dict) and 'expected' in o][:1]\n"
    r, _ = _run(code, limits=LIMITS if STRONG else WEAK)
    assert r.outcomes[0].value == []


def test_weak_mode_blocks_sockets_outside_writes_and_special_files(tmp_path):
    target = str(tmp_path / "weak-escape.txt")
    code = textwrap.dedent("""\
        import os
        def f(kind, path):
            if kind == 'net':
                import socket
                socket.socket()
                return 'socket'
            if kind == 'fifo':
                os.mkfifo(path)
                return 'fifo'
            if kind == 'node':
                os.mknod(path)
                return 'node'
            if kind == 'spawn':
                import _posixsubprocess
                return 'imported'
            with open(path, 'w') as fh:
                fh.write('x')
            return 'wrote'
        """)
    args = [["net", ""], ["write", target], ["write", "inside.txt"], ["fifo", str(tmp_path / "fifo")],
            ["node", str(tmp_path / "node")], ["fifo", "inside.fifo"], ["spawn", ""]]
    r = run_calls(code, "f", args, SandboxLimits(wall_s=4.0, per_call_s=1.0, mode="unsafe-rlimits-only"))
    assert r.isolation == "unsafe-rlimits-only"
    assert [o.status for o in r.outcomes] == ["error", "error", "ok", "error", "error", "ok", "error"], r
    assert "mkfifo" in r.outcomes[3].error and "mknod" in r.outcomes[4].error
    assert os.listdir(tmp_path) == []


_PLAN = textwrap.dedent("""\
    import json, sys
    sys.path.append(sys.argv[1])
    from sandbox_child import rootfs
    sys.path.pop()
    import ctypes, json  # what the child has loaded when it builds the root
    plan, masks = rootfs.make_plan({"hide": json.loads(sys.argv[2])})
    print(json.dumps([plan.binds, plan.links, masks]))
    """)


def test_the_runs_root_shows_no_package_tests_or_site_packages():
    # What the strong sandbox would bind, computed as its child does (`python -I -S`), on any machine.
    import site

    out = subprocess.run([sys.executable, "-I", "-S", "-c", _PLAN, os.path.dirname(sandbox._CHILD),
                          json.dumps(sandbox._hidden_paths())], capture_output=True, text=True, timeout=60)
    binds, links, masks = json.loads(out.stdout)
    shows = lambda path: [b for b in binds if path == b or path.startswith(b.rstrip("/") + "/")]  # noqa: E731
    assert shows(os.path.realpath(sys.executable)) and shows(os.path.realpath(os.__file__))  # the interpreter, stdlib
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    secret = [repo, os.path.join(repo, "jaxagent", "envs", "host", "data"), os.path.join(repo, "tests"),
              *site.getsitepackages(), site.getusersitepackages()]
    for path in map(os.path.realpath, secret):
        shown_by = shows(path)
        masked = any(path == m or path.startswith(m + "/") for m in masks)
        assert not shown_by or masked, (path, shown_by)
    for b in binds:  # nothing bound lies inside the checkout or a site-packages directory either
        assert not any(b.startswith(os.path.realpath(p) + "/") for p in secret), b


def test_child_program_is_the_package_module():
    import jaxagent.envs.host.sandbox_child as child

    assert os.path.samefile(sandbox._CHILD, os.path.dirname(child.__file__)) and child.MARK.encode() == sandbox._MARK
    assert os.path.isfile(os.path.join(sandbox._CHILD, "__main__.py"))  # `python -I -S <directory>` runs it


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError):
        run_calls("def f(): pass", "not an identifier", [[]])
    with pytest.raises(ValueError):
        run_calls("def f(x): pass", "f", [[object()]])
    with pytest.raises(ValueError):
        SandboxLimits(mode="docker")
    with pytest.raises(ValueError, match="unsafe-rlimits-only"):
        SandboxLimits(mode="rlimits")  # the weak mode only under its loud name
    with pytest.raises(ValueError, match="nproc"):
        SandboxLimits(nproc=1)
    with pytest.raises(ValueError, match="process_mb"):
        SandboxLimits(memory_mb=64, process_mb=128)


# ------------------------------------------------------------------------------------------------
# The default never silently weakens
# ------------------------------------------------------------------------------------------------
def test_default_mode_refuses_without_strong_isolation(monkeypatch):
    assert SandboxLimits().mode == "namespaces" and SandboxLimits(mode="auto").strong
    monkeypatch.setattr(sandbox, "strong_isolation_problem", lambda: "root lacks the capabilities CAP_SYS_ADMIN")
    for limits in (SandboxLimits(), SandboxLimits(mode="auto")):
        with pytest.raises(SandboxUnavailable) as info:
            run_calls("def f():\n    return 1\n", "f", [[]], limits)
        msg = str(info.value)
        assert "CAP_SYS_ADMIN" in msg and "unprivileged_userns_clone" in msg and "unsafe-rlimits-only" in msg
        assert isinstance(info.value, RuntimeError) and info.value.infrastructure_error
    r = run_calls("def f():\n    return 1\n", "f", [[]], WEAK)  # the explicit opt-in still runs
    assert r.outcomes[0].value == 1 and r.isolation == "unsafe-rlimits-only"


def test_probe_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "not root" in strong_isolation_problem()


_UNDER_UNSHARE = textwrap.dedent("""\
    import sys
    import jaxagent.envs.host.sandbox as s
    if sys.argv[1] == "bypass-probe":
        s.strong_isolation_problem = lambda: None  # as if the probe had missed what is missing
    try:
        r = s.run_calls("def f():\\n    return 1\\n", "f", [[]])
        print("RESULT", r.outcomes[0])
    except s.SandboxError as e:
        print(type(e).__name__, e)
    """)


@pytest.mark.skipif(not _can_unshare_ur(), reason="`unshare -Ur` does not work here")
@pytest.mark.parametrize("how", ["probe", "bypass-probe"])
def test_under_unshare_ur_the_run_raises_instead_of_scoring(how):
    # Root in a user namespace that maps only uid 0. The probe refuses; and if a
    # probe missed it, the failing setup raises instead of reporting the reference solution as a crash.
    out = subprocess.run(["unshare", "-Ur", sys.executable, "-c", _UNDER_UNSHARE, how], capture_output=True,
                         text=True, timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = out.stdout + out.stderr
    assert "RESULT" not in text, text
    if how == "probe":
        assert text.startswith("SandboxUnavailable") and "maps no unprivileged uid" in text, text
    else:
        assert text.startswith("SandboxSetupError") and "/tmp/work" in text, text


# ------------------------------------------------------------------------------------------------
# Setup failures are infrastructure errors
# ------------------------------------------------------------------------------------------------
@needs_strong
def test_setup_failure_raises_with_the_cause(monkeypatch):
    monkeypatch.setattr(sandbox, "pick_uid", lambda: 2 ** 32 - 1)  # setgid/setuid to it fail (EINVAL)
    with pytest.raises(SandboxSetupError, match="dropping privileges: OSError"):
        run_calls("def f():\n    return 1\n", "f", [[]], LIMITS)


def test_a_sandbox_that_never_got_ready_is_an_infrastructure_error():
    with pytest.raises(SandboxSetupError, match="before the code started"):
        sandbox._parse_output(b"", 2, False, "child exit 1", 0.1)
    line = b'@@jaxagent-sbx {"setup_error": "mount tmpfs on /tmp failed: EPERM"}\n'
    with pytest.raises(SandboxSetupError, match="mount tmpfs on /tmp failed"):
        sandbox._parse_output(line, 1, False, "child exit 3", 0.1)


# ------------------------------------------------------------------------------------------------
# Memory is bounded per run
# ------------------------------------------------------------------------------------------------
_HOARD = textwrap.dedent("""\
    import os, time
    def f(n, mb):
        kids = []
        for _ in range(n):
            r, w = os.pipe()
            try:
                pid = os.fork()
            except OSError:
                os.close(r); os.close(w)
                continue
            if pid == 0:
                try:
                    b = bytearray(mb * 2 ** 20)
                    for k in range(0, len(b), 4096):
                        b[k] = 1
                    os.write(w, b'1')
                except BaseException:
                    os.write(w, b'0')
                time.sleep(60)
                os._exit(0)
            os.close(w)
            ok = os.read(r, 1) == b'1'
            os.close(r)
            kids.append((pid, ok))
        time.sleep(0.3)
        # children that got their memory and are still alive, holding it
        return sum(1 for pid, ok in kids if ok and os.waitpid(pid, os.WNOHANG) == (0, 0))
    """)


@needs_strong
@pytest.mark.parametrize("limits", [
    SandboxLimits(wall_s=6.0, per_call_s=3.0, memory_mb=256),
    SandboxLimits(wall_s=6.0, per_call_s=3.0, memory_mb=384, process_mb=96, cgroup=False),
], ids=["default", "no-cgroup"])
def test_forked_children_cannot_exceed_the_run_budget(limits, run_uids):
    mb = 60
    r = run_calls(_HOARD, "f", [[7, mb]], limits)
    o = r.outcomes[0]
    assert o.status != "ok" or o.value * mb <= limits.memory_mb, (r, o)
    assert r.memory_bound in ("cgroup-v1", "cgroup-v2", "rlimits")
    if not limits.cgroup:
        assert r.memory_bound == "rlimits" and o.status == "ok" and o.value <= 2
    if r.memory_bound.startswith("cgroup"):
        found = subprocess.run(["find", "/sys/fs/cgroup", "-maxdepth", "6", "-name", "jaxagent-sbx-*"],
                               capture_output=True, text=True).stdout.split()
        left = [d for d in found if int(d.rsplit("-", 1)[1]) in run_uids]  # named ...-<launcher pid>-<uid>
        assert not left, f"cgroups left behind: {left}"
    time.sleep(0.2)
    assert not _survivors(run_uids)


# ------------------------------------------------------------------------------------------------
# The result channel cannot be forged; nothing survives the caller
# ------------------------------------------------------------------------------------------------
_FORGER = textwrap.dedent("""\
    import os, json, stat
    MARK = '@@jaxagent-sbx '
    LINES = [{'isolation': 'fake'}, {'loaded': True}, {'ready': True}]
    LINES += [{'i': i, 'status': 'ok', 'value': 'forged'} for i in range(3)]
    DATA = ''.join(MARK + json.dumps(x) + '\\n' for x in LINES).encode()
    DEEP = (MARK + '[' * 200000 + ']' * 200000 + '\\n').encode()
    def spray():
        for fd in range(256):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    continue  # the call's own answer pipe (spraying it only garbles this call's answer)
            except OSError:
                continue
            for data in (DATA, DEEP):
                try:
                    os.write(fd, data)
                except OSError:
                    pass
        for base in ('/proc/1/fd', '/proc/%d/fd' % os.getppid()):
            try:
                names = os.listdir(base)
            except OSError:
                continue
            for name in names:
                try:
                    with open(os.path.join(base, name), 'wb') as fh:
                        fh.write(DATA)
                except OSError:
                    pass
    spray()
    def f(x):
        spray()
        if x == 1:
            os._exit(0)
        return x
    """)


@pytest.mark.parametrize("limits", MODES)
def test_forged_result_lines_are_rejected(limits):
    r = run_calls(_FORGER, "f", [[0], [1], [2]], limits)
    assert r.isolation == ("namespaces" if limits.strong else "unsafe-rlimits-only")
    assert [o.status for o in r.outcomes] == ["ok", "error", "ok"], r
    assert [o.value for o in r.outcomes] == [0, None, 2]
    # a module that forges results for every call and then dies: nothing ran, nothing passes
    r = run_calls(_FORGER + "os._exit(0)\n", "f", [[0], [1], [2]], limits)
    assert r.load_error is not None and all(o.status == "not_run" for o in r.outcomes), r


@pytest.mark.parametrize("limits", MODES)
def test_hostile_answers_of_a_call_are_errors(limits):
    # A call that writes its own answer pipe: too deep, malformed, or a flood.
    code = textwrap.dedent("""\
        import os
        def f(kind):
            data = {'deep': b'{"status": "ok", "value": ' + b'[' * 100000 + b']' * 100000 + b'}\\n',
                    'junk': b'{"status": "ok", "value": [1, 2\\n',
                    'flood': b'x' * 10 ** 6,
                    'claim': b'{"setup_error": "the sandbox broke, do not score me"}\\n'}[kind]
            for fd in range(3, 64):
                try:
                    os.write(fd, data)
                except OSError:
                    pass
            os._exit(0)
        """)
    r = run_calls(code, "f", [["deep"], ["junk"], ["flood"], ["claim"]], limits)
    assert [o.status for o in r.outcomes] == ["error"] * 4, r
    # nor can the model's code claim an infrastructure failure, at load time or later
    claim = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"setup_error\": \"x\"}\\n')\n" \
            "    except OSError:\n        pass\ndef f():\n    return 1\n"
    r = run_calls(claim, "f", [[]], limits)
    assert r.load_error is not None and r.outcomes[0].status == "not_run"
    # ...or by breaking the work directory for the calls after it
    r = run_calls("import os\ndef f(x):\n    os.chmod('.', 0)\n    return x\n", "f", [[1], [2]], limits)
    assert r.outcomes[0].value == 1 and r.outcomes[1].status in ("ok", "error"), r
    deep = "def f():\n    x = []\n    for _ in range(100000):\n        x = [x]\n    return x\n"
    r = run_calls(deep, "f", [[]], limits)
    assert r.outcomes[0].status == "error" and "nested too deeply" in r.outcomes[0].error


def test_deeply_nested_control_lines_do_not_raise():
    line = b"@@jaxagent-sbx " + b"[" * 200000 + b"]" * 200000 + b"\n"
    ok = b'@@jaxagent-sbx {"ready": true}\n@@jaxagent-sbx {"loaded": true}\n@@jaxagent-sbx {"i": 0, "status": "ok", "value": 3}\n'
    r = sandbox._parse_output(line + ok + line, 1, False, "", 0.1)
    assert r.outcomes[0].value == 3


_PARENT = textwrap.dedent("""\
    import sys
    from jaxagent.envs.host.sandbox import SandboxLimits, run_calls
    mode = sys.argv[1]
    code = "import time\\ndef f():\\n    time.sleep(60)\\n"
    run_calls(code, "f", [[]], SandboxLimits(wall_s=30.0, per_call_s=25.0, cpu_s=30, mode=mode))
    """)


def _processes():
    """{pid: parent pid} of every process."""
    out = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(e)] = int(fields[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.mark.parametrize("mode", [pytest.param("namespaces", marks=needs_strong), "unsafe-rlimits-only"])
def test_nothing_survives_a_kill_9_of_the_caller(tmp_path, mode):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, mode], env=env, cwd=root)
    try:
        deadline = time.monotonic() + 20
        members = set()
        while time.monotonic() < deadline:
            procs = _processes()
            members, grew = set(), True
            while grew:  # the parent's descendants
                new = {p for p, pp in procs.items() if (pp == parent.pid or pp in members) and p not in members}
                members |= new
                grew = bool(new)
            if len(members) >= (4 if mode == "namespaces" else 3):  # launcher, (init,) harness, worker
                break
            time.sleep(0.05)
        assert members, "the sandbox did not start"
        if mode != "namespaces":
            assert any(n.startswith("jaxagent-sbx-") for n in os.listdir(tmp_path))
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (os.listdir(tmp_path) or members & set(_processes())):
            time.sleep(0.05)
        assert os.listdir(tmp_path) == [], "the sandbox's temporary directory survived"
        assert not members & set(_processes()), "sandbox processes survived"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
