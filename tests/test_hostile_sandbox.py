"""Hostile model code against the strong code sandbox: it cannot find the answers (the package, its task
data, the tests, site-packages, the run directory), cannot reach a host socket of any family, cannot
make namespaces of its own, and cannot use more CPU time than the run's quota. Each attack is what a
policy could learn to do; each test fails if the attack works.

These need strong isolation (root with CAP_SYS_ADMIN, as in CI); without it they are skipped with the
reason, and the refusal itself is tested in test_sandbox.py."""

import json
import os
import shutil
import site
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import jaxagent
from jaxagent.envs.host import sandbox
from jaxagent.envs.host.code_env import CodeEnv
from jaxagent.envs.host.data import code_tasks
from jaxagent.envs.host.sandbox import SandboxLimits, run_calls

PROBLEM = sandbox.strong_isolation_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"strong isolation unavailable here: {PROBLEM}")
LIMITS = SandboxLimits(wall_s=6.0, per_call_s=4.0, cpu_s=5)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(jaxagent.__file__)))
TASK_FILE = os.path.realpath(code_tasks.__file__)


def _dir_outside_tmp(prefix):
    """A world-readable directory on the host outside /tmp (which the sandbox always covered)."""
    for parent in ("/run", "/var/run", REPO):
        if os.path.isdir(parent) and os.access(parent, os.W_OK):
            d = tempfile.mkdtemp(prefix=prefix, dir=parent)
            os.chmod(d, 0o755)
            return d
    pytest.skip("no writable directory outside /tmp for the host-side bait")


# ------------------------------------------------------------------------------------------------
# Item 1: the answers are out of sight
# ------------------------------------------------------------------------------------------------
_CHEAT = textwrap.dedent("""\
    import os, sys
    KNOWN = %r
    def _candidates():
        yield from KNOWN
        for p in sys.path:
            yield os.path.join(p, 'jaxagent', 'envs', 'host', 'data', 'code_tasks.py')
        for root, dirs, files in os.walk('/'):
            dirs[:] = [d for d in dirs if root != '/' or d not in ('proc', 'sys')]
            if 'code_tasks.py' in files:
                yield os.path.join(root, 'code_tasks.py')
    def _answers():
        for path in _candidates():
            try:
                with open(path) as fh:
                    src = fh.read()
            except OSError:
                continue
            ns = {}
            exec(src, ns)
            return ns['CODE_TASKS']
        return ()
    def pair_sum(nums, target):
        for task in _answers():
            for args, expected in task['tests']:
                if args == [nums, target]:
                    return expected
        return None
    """)


def test_reading_the_task_file_earns_nothing():
    # The attack of the report: model code reads the package's task file and returns the expected
    # outputs (it scored 1.0, "All 8 tests passed").
    env = CodeEnv(limits=LIMITS)
    task = next(t for t in env.tasks("all") if t.id == "pair-sum")
    state, _ = env.reset(0, task)
    code = _CHEAT % ([TASK_FILE, os.path.join(REPO, "jaxagent/envs/host/data/code_tasks.py")],)
    _, obs, reward, done, info = env.step(state, f"```python\n{code}\n```")
    assert info["isolation"] == "namespaces"
    assert reward == 0.0 and not done and info["n_passed"] == 0, obs


_FINDER = textwrap.dedent("""\
    import os, sys
    BAD_PARTS = ('jaxagent', 'site-packages', 'dist-packages')
    BAD_NAMES = ('code_tasks.py', 'sql_tasks.py', 'conftest.py', 'test_hostile_sandbox.py')
    def bad(path, marker):
        parts = path.split(os.sep)
        return any(p in BAD_PARTS for p in parts) or os.path.basename(path) in BAD_NAMES + (marker,)
    def f(targets, marker):
        found = {'paths': [], 'walk': [], 'sys_path': [], 'proc': [], 'import': None, 'env': []}
        for t in targets:  # a file that exists, or a directory with anything in it
            try:
                if os.path.isfile(t) or os.listdir(t):
                    found['paths'].append(t)
            except OSError:
                pass
        t0 = __import__('time').monotonic()
        complete, n = True, 0
        for root, dirs, files in os.walk('/'):
            if root == '/':
                dirs[:] = [d for d in dirs if d not in ('proc', 'sys')]
            for name in files:
                n += 1
                if bad(os.path.join(root, name), marker):
                    found['walk'].append(os.path.join(root, name))
            if __import__('time').monotonic() - t0 > 2.5:
                complete = False
                break
        for p in sys.path:
            try:
                names = os.listdir(p)
            except OSError:
                continue
            found['sys_path'] += [os.path.join(p, x) for x in names if x == 'jaxagent' or x.endswith('.pth')]
        for pid in os.listdir('/proc'):
            if not pid.isdigit():
                continue
            for what in ('cwd', 'root', 'exe'):
                try:
                    link = os.readlink('/proc/%s/%s' % (pid, what))
                except OSError:
                    continue
                if bad(link, marker):
                    found['proc'].append(link)
            try:
                fds = os.listdir('/proc/%s/fd' % pid)
            except OSError:
                fds = []
            for fd in fds:
                try:
                    link = os.readlink('/proc/%s/fd/%s' % (pid, fd))
                except OSError:
                    continue
                if bad(link, marker) or any(link.startswith(t) for t in targets):
                    found['proc'].append(link)
        try:
            import jaxagent
            found['import'] = jaxagent.__file__
        except ImportError:
            pass
        found['env'] = [k for k, v in os.environ.items() if 'jaxagent' in v or 'site-packages' in v]
        return [found, complete, n]
    """)


def test_model_code_finds_no_package_tests_site_packages_or_run_dir():
    run_dir = _dir_outside_tmp("jaxagent-run-")
    marker = f"RUN-MARKER-{os.getpid()}.json"
    try:
        with open(os.path.join(run_dir, marker), "w") as fh:
            fh.write("{}")
        os.chmod(os.path.join(run_dir, marker), 0o644)
        targets = [TASK_FILE, os.path.dirname(os.path.abspath(jaxagent.__file__)), REPO,
                   os.path.join(REPO, "tests"), run_dir, os.path.join(run_dir, marker), os.getcwd(),
                   *site.getsitepackages(), site.getusersitepackages()]
        targets = [t for t in dict.fromkeys(targets) if os.path.exists(t)]
        r = run_calls(_FINDER, "f", [[targets, marker]], LIMITS)
        assert r.outcomes[0].status == "ok", r
        found, complete, n_files = r.outcomes[0].value
        assert complete and n_files > 100, (complete, n_files)  # the walk saw the whole (stdlib) tree
        assert found == {"paths": [], "walk": [], "sys_path": [], "proc": [], "import": None, "env": []}, found
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


# What model code may use: the standard library (C extensions included), threads, processes and the interpreter
# itself; and what it sees of /tmp (its private tmpfs: only the work directory).
_STDLIB_CHECK = textwrap.dedent("""\
    import os, sys, json, sqlite3, decimal, hashlib, threading, subprocess, collections, re
    def f():
        out = []
        t = threading.Thread(target=lambda: out.append(sum(range(10))))
        t.start(); t.join()
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        _, st = os.waitpid(pid, 0)
        db = sqlite3.connect(':memory:')
        p = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True)
        with open('scratch.txt', 'w') as fh:
            fh.write('ok')
        return [out[0], os.waitstatus_to_exitcode(st), db.execute('select 2 + 3').fetchone()[0],
                p.stdout.strip(), str(decimal.Decimal('1.1') * 2), hashlib.sha256(b'').hexdigest()[:8],
                os.getcwd(), sorted(os.listdir('/tmp'))]
    """)
STDLIB_OK = [45, 7, 5, "42", "2.2", "e3b0c442", "/tmp/work", ["work"]]


def test_the_interpreter_and_its_standard_library_still_work():
    r = run_calls(_STDLIB_CHECK, "f", [[]], LIMITS)
    assert r.outcomes[0].status == "ok", r
    assert r.outcomes[0].value == STDLIB_OK


# ------------------------------------------------------------------------------------------------
# Item 2: no way out
# ------------------------------------------------------------------------------------------------
_SOCKETS = textwrap.dedent("""\
    import errno, socket
    def f(path, abstract):
        out = {}
        for name, addr in (('path', path), ('abstract', '\\0' + abstract)):
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(1.0)
                s.connect(addr)
                s.sendall(b'escaped')
                out[name] = 'connected'
            except OSError as e:
                out[name] = errno.errorcode.get(e.errno, str(e.errno))
        for name, fam, kind in (('vsock', 40, socket.SOCK_STREAM), ('netlink', 16, socket.SOCK_RAW),
                                ('packet', 17, socket.SOCK_RAW), ('bluetooth', 31, socket.SOCK_STREAM)):
            try:
                socket.socket(fam, kind).close()
                out[name] = 'created'
            except OSError as e:
                out[name] = errno.errorcode.get(e.errno, str(e.errno))
        return out
    """)


def test_no_host_socket_of_any_family_is_reachable():
    bait = _dir_outside_tmp("jaxagent-sock-")
    path = os.path.join(bait, "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"jaxagent-test-{os.getpid()}"
    try:
        listener.bind(path)
        os.chmod(path, 0o777)
        listener.listen(4)
        abstract.bind("\0" + name)
        abstract.listen(4)
        r = run_calls(_SOCKETS, "f", [[path, name]], LIMITS)
        assert r.outcomes[0].status == "ok", r
        out = r.outcomes[0].value
        assert out["path"] in ("ENOENT", "ECONNREFUSED", "EACCES", "EPERM"), out
        assert out["abstract"] in ("ECONNREFUSED", "ENOENT", "EPERM"), out
        for family in ("vsock", "netlink", "packet", "bluetooth"):
            assert out[family] != "created", out
        for s in (listener, abstract):
            s.settimeout(0.2)
            with pytest.raises(socket.timeout):
                s.accept()
    finally:
        listener.close()
        abstract.close()
        shutil.rmtree(bait, ignore_errors=True)


_NAMESPACES = textwrap.dedent("""\
    import ctypes, errno, os, platform, shutil, subprocess
    NEWNS, NEWUSER, NEWNET, NEWPID = 0x20000, 0x10000000, 0x40000000, 0x20000000
    SYS_CLONE = {'x86_64': 56, 'aarch64': 220}.get(platform.machine())
    def f():
        libc = ctypes.CDLL(None, use_errno=True)
        out = {}
        for name, flags in (('user', NEWUSER), ('user+mount', NEWUSER | NEWNS), ('mount', NEWNS),
                            ('net', NEWNET), ('pid', NEWPID)):
            rc = libc.unshare(flags)
            out['unshare ' + name] = 'ok' if rc == 0 else errno.errorcode[ctypes.get_errno()]
        libc.syscall.restype = ctypes.c_long
        rc = libc.syscall(ctypes.c_long(SYS_CLONE), ctypes.c_ulong(NEWUSER | 17), None, None, None, None)
        if rc == 0:
            os._exit(0)
        if rc > 0:
            os.waitpid(rc, 0)
        out['clone user'] = 'ok' if rc > 0 else errno.errorcode[ctypes.get_errno()]
        fd = os.open('/proc/self/ns/user', os.O_RDONLY)
        rc = libc.setns(fd, 0)
        out['setns'] = 'ok' if rc == 0 else errno.errorcode[ctypes.get_errno()]
        if shutil.which('unshare'):
            out['unshare -Urm'] = subprocess.run(['unshare', '-Urm', 'true']).returncode
        return out
    """)


def test_model_code_cannot_make_namespaces():
    r = run_calls(_NAMESPACES, "f", [[]], LIMITS)
    assert r.outcomes[0].status == "ok", r
    out = r.outcomes[0].value
    assert set(out) >= {"unshare user", "unshare user+mount", "unshare mount", "clone user", "setns"}, out
    assert "ok" not in out.values(), out
    assert out.get("unshare -Urm", 1) != 0, out


_BURN = textwrap.dedent("""\
    import os, time
    def f(n):
        kids = set()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            while len(kids) < n:
                pid = os.fork()
                if pid == 0:
                    while True:
                        pass
                kids.add(pid)
            pid, _ = os.waitpid(-1, 0)  # a child killed at its own CPU limit: start another
            kids.discard(pid)
        return 'survived'
    """)


def test_a_run_stops_at_its_cpu_quota():
    # Busy children that are replaced as each one dies: every process stays under its own
    # RLIMIT_CPU, so only a quota of the whole run stops them before the wall clock does.
    limits = SandboxLimits(wall_s=8.0, per_call_s=7.0, cpu_s=1, nproc=8)
    t0 = time.monotonic()
    r = run_calls(_BURN, "f", [[3]], limits)
    dt = time.monotonic() - t0
    assert r.outcomes[0].status != "ok" and "CPU" in (r.outcomes[0].error or ""), r
    assert r.cpu_exceeded and not r.timed_out, r
    # One core-second, stopped within a few of the launcher's 20 ms polls (more on a loaded machine).
    assert 1.0 <= r.cpu_s <= limits.cpu_s + 0.5, r.cpu_s
    assert dt < limits.per_call_s, dt  # the per-call (7 s) and wall (8 s) limits were not what stopped it



_FROM_A_VENV = """\
import json, sys
from jaxagent.envs.host.sandbox import SandboxLimits, interpreter, run_calls
finder, stdlib_check, targets, marker = json.loads(sys.stdin.read())
limits = SandboxLimits(wall_s=6.0, per_call_s=4.0, cpu_s=5)
found = run_calls(finder, "f", [[targets, marker]], limits).outcomes[0]
stdlib = run_calls(stdlib_check, "f", [[]], limits).outcomes[0]
print(json.dumps({"prefix": sys.prefix, "base": sys.base_prefix, "child": interpreter(),
                  "found": [found.status, found.value, found.error], "stdlib": [stdlib.status, stdlib.value]}))
"""


def test_run_from_a_venv_under_tmp_the_sandbox_shows_no_site_packages(tmp_path):
    """The leak check and the standard-library check, run by a caller in a virtual environment under /tmp.

    Layout reproduced: `python -m venv --without-pip <tmp_path>/venv`, as a user makes one (bin/python a symlink
    to this interpreter, pyvenv.cfg naming its home), with its own lib/python3.X/site-packages holding the
    installed packages: here a symlink to each package of this interpreter's site-packages, leaving out .pth
    files and editable-install finders, so that, as after `pip install` into the venv, the venv's site-packages
    is the caller's only import path beyond the standard library, and the base interpreter's site-packages
    (which the sandbox's root binds as part of the interpreter's library directory) is none of the caller's
    import paths. jaxagent comes from the checkout (the working directory), as with `pip install -e`.
    Expected: nothing of the package, the tests or any site-packages is found, and /tmp holds only the work
    directory (the root used to show the base interpreter's site-packages, 42,991 files of it, and the venv's
    path under /tmp)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    mine = [p for p in site.getsitepackages() if os.path.isdir(p)]
    (venv_site,) = venv.glob("lib/python3*/site-packages")
    for d in mine:
        for name in os.listdir(d):
            if not (name.endswith(".pth") or name.startswith("__editable__") or os.path.lexists(venv_site / name)):
                os.symlink(os.path.join(d, name), venv_site / name)
    base_sites = site.getsitepackages([sys.base_prefix])
    targets = [t for t in dict.fromkeys([str(venv_site), *mine, *base_sites, REPO, TASK_FILE]) if os.path.exists(t)]
    payload = json.dumps([_FINDER, _STDLIB_CHECK, targets, f"RUN-MARKER-{os.getpid()}.json"])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", _FROM_A_VENV], input=payload, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["prefix"] == str(venv) and out["base"] != out["prefix"], out
    status, value, error = out["found"]
    assert status == "ok", error
    found, complete, n_files = value
    assert complete and n_files > 100, (complete, n_files)
    assert found == {"paths": [], "walk": [], "sys_path": [], "proc": [], "import": None, "env": []}, found
    assert out["stdlib"] == ["ok", STDLIB_OK], out["stdlib"]
    assert not out["child"].startswith(str(tmp_path)), out["child"]  # the child runs the base interpreter
