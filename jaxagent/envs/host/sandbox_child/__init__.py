"""The child program of jaxagent.envs.host.sandbox: runs untrusted code (run as a program; importing defines only).

The parent runs `python -I -S <this directory>` (`__main__`), writes one JSON config to its stdin and reads result lines
(`MARK` + JSON) from its stdout, the control channel. Processes (strong mode, "namespaces"):
  launcher  root, the process the parent started: joins a fresh cgroup (when available), unshares the
            network, pid, IPC and UTS namespaces, keeps the host's view of the file system, and
            enforces the wall-clock limit and the run's CPU quota (the CPU time of init's process
            tree, read from /proc every 20 ms) by killing init.
  init      root, pid 1 of the new pid namespace: unshares the mount namespace, builds the run's root
            file system and pivots into it (`rootfs`), mounts a fresh /proc, reaps; its death kills
            the namespace.
  harness   the run's unprivileged uid (rlimits, no new privileges, not dumpable, the seccomp filter
            of `seccomp`): forks one worker per call, checks what the worker sends back and writes
            the result lines.
  worker    the same uid, one per call: closes every descriptor except its own result pipe, loads the
            code, makes the call, sends back one value.
Only launcher, init and harness hold the control channel, so model code cannot write result lines: a
worker can only answer its own call, through its own pipe, and the harness accepts one answer per call.
Weak mode ("unsafe-rlimits-only"): launcher (same uid as the parent) + harness + workers with rlimits and
an audit hook in a throwaway directory; no security boundary (see docs/sandbox.md).
Every failure before the harness says "ready", and a worker's failure to set itself up (reported on
a pipe it closes before the model's code runs), is a setup failure ("setup_error" line), never a
result of the model's code; nothing the model's code writes can produce one. The launcher dies with
the parent (PR_SET_PDEATHSIG), and init with the launcher.

Modules (standard library only; all imported before any setup): `common` (the control channel, libc,
limits), `cgroups` (a fresh cgroup per run), `rootfs` (the run's root file system), `seccomp` (the
syscall filter), `worker` (one call of the model's code), `harness` (one worker per call, answers
checked), `modes` (strong and weak mode, the CPU quota, `main`).

No dimension legend: host-side Python, no arrays.
"""

from .common import MARK  # noqa: F401  (the parent matches result lines on it)
