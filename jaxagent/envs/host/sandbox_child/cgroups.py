"""A fresh cgroup (v2, or v1 memory + pids, with cpuacct where mounted) bounding one sandbox run, the CPU time
it has used, and its removal.

The CPU time comes from the cgroup (v2 `cpu.stat` usage_usec, v1 `cpuacct.usage`): the kernel charges it as it
is spent, by every process of the run, including children reaped by the kernel itself (a parent that ignores
SIGCHLD), whose time never reaches any process's cutime.

No dimension legend: host-side Python, no arrays.
"""

import os
import time


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _mounts():
    with open("/proc/self/mounts") as f:
        return [line.split() for line in f if len(line.split()) >= 4]


def _own_cgroup_v1(controller):
    """The path of this process's cgroup in the v1 hierarchy of `controller` ("" if none)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            if controller in names.split(","):
                return path
    return ""


def cgroup_sweep(parent):
    """Remove the empty cgroups of earlier runs whose launcher is gone (killed before cleaning up)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if name.startswith("jaxagent-sbx-") and len(parts) == 4 and parts[2].isdigit():
            if not os.path.exists("/proc/%s" % parts[2]):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass


def cgroup_cpu_s(cpu_file):
    """CPU seconds charged to the cgroup whose `cpu.stat` (v2) or `cpuacct.usage` (v1) is `cpu_file`; None when it
    cannot be read."""
    try:
        with open(cpu_file) as f:
            text = f.read()
        if cpu_file.endswith("cpuacct.usage"):
            return int(text) / 1e9
        for line in text.splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except (OSError, ValueError):
        pass
    return None


def _v1_cpuacct(tag, made):
    """The `cpuacct.usage` of a fresh v1 cpuacct cgroup joined by this process (added to `made`), or None when
    there is no cpuacct hierarchy or it refuses a new group."""
    root = next((mnt for _, mnt, fstype, opts in (m[:4] for m in _mounts())
                 if fstype == "cgroup" and "cpuacct" in opts.split(",")), None)
    if root is None:
        return None
    own = _own_cgroup_v1("cpuacct").lstrip("/")
    parent = os.path.join(root, own)
    if not os.path.isdir(parent):
        parent, own = root, ""
    cgroup_sweep(parent)
    d = os.path.join(parent, tag)
    try:
        os.mkdir(d)
    except OSError:
        return None
    made.append((d, os.path.join(root, own, "cgroup.procs")))
    try:
        _write(os.path.join(d, "cgroup.procs"), str(os.getpid()))
    except OSError:
        return None
    return os.path.join(d, "cpuacct.usage")


def cgroup_create(limits, tag):
    """A fresh cgroup bounding memory (no swap) and processes of the whole run; None when this machine
    offers none. Returns (kind, [(directory, the cgroup.procs to move back to)], the file of its CPU time
    (`cgroup_cpu_s`), None where v1 has no cpuacct hierarchy)."""
    mem = int(limits["memory_mb"]) * 1024 * 1024
    pids = int(limits["nproc"]) + 4  # the harness, init and the launcher are inside too
    for _, mnt, fstype, _opts in (m[:4] for m in _mounts()):
        if fstype != "cgroup2":
            continue
        try:
            with open(os.path.join(mnt, "cgroup.controllers")) as f:
                available = f.read().split()
            if "memory" not in available or "pids" not in available:
                continue
            with open(os.path.join(mnt, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            missing = [c for c in ("memory", "pids") if c not in enabled]
            if missing:
                _write(os.path.join(mnt, "cgroup.subtree_control"), " ".join("+" + c for c in missing))
            own = ""
            with open("/proc/self/cgroup") as f:
                for line in f:
                    if line.startswith("0::"):
                        own = line[3:].strip()
            back = os.path.join(mnt, own.lstrip("/"), "cgroup.procs")
            cgroup_sweep(mnt)
            d = os.path.join(mnt, tag)
            os.mkdir(d)
            try:
                _write(os.path.join(d, "memory.max"), str(mem))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), "0")
                _write(os.path.join(d, "pids.max"), str(pids))
                _write(os.path.join(d, "cgroup.procs"), str(os.getpid()))
            except OSError:
                os.rmdir(d)
                raise
            cpu_file = os.path.join(d, "cpu.stat")
            return "cgroup-v2", [(d, back)], cpu_file if cgroup_cpu_s(cpu_file) is not None else None
        except OSError:
            continue
    # cgroup v1: the memory and pids controllers in their own hierarchies.
    roots = {}
    for _, mnt, fstype, opts in (m[:4] for m in _mounts()):
        if fstype == "cgroup":
            for c in ("memory", "pids"):
                if c in opts.split(","):
                    roots[c] = mnt
    if "memory" not in roots:
        return None
    made = []
    try:
        for c in ("memory", "pids"):
            if c not in roots:
                continue
            own = _own_cgroup_v1(c).lstrip("/")
            parent = os.path.join(roots[c], own)
            if not os.path.isdir(parent):
                parent, own = roots[c], ""
            cgroup_sweep(parent)
            d = os.path.join(parent, tag)
            os.mkdir(d)
            made.append((d, os.path.join(roots[c], own, "cgroup.procs")))
            if c == "memory":
                _write(os.path.join(d, "memory.limit_in_bytes"), str(mem))
                if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(mem))
            else:
                _write(os.path.join(d, "pids.max"), str(pids))
        for d, _ in made:
            _write(os.path.join(d, "cgroup.procs"), str(os.getpid()))
    except OSError:
        cgroup_remove(made)
        return None
    return "cgroup-v1", made, _v1_cpuacct(tag, made)


def cgroup_remove(made):
    """Move this process back and remove the run's cgroups (waits briefly for the killed processes)."""
    for d, back in made:
        try:
            _write(back, str(os.getpid()))
        except OSError:
            pass
    for d, _ in made:
        for _ in range(2000):  # up to 2 s; the run's last processes are usually gone within a few ms
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.001)
