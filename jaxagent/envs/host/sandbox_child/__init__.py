"""The child program of jaxagent.envs.host.sandbox: runs untrusted code (run as a program; importing defines only).

The parent runs `python -I -S <this directory>` (`__main__`), writes one JSON config to its stdin and reads result
lines (`MARK` + JSON) from its stdout, the control channel. Processes in the strong mode: launcher (root: cgroup,
network / pid / IPC / UTS namespaces, the wall-clock limit and CPU quota), init (root, pid 1: mount namespace, the
run's root file system, /proc), harness (the run's unprivileged uid under seccomp: one worker per call, answers
checked, result lines written) and one worker per call (its own result pipe only). Only launcher, init and harness
hold the control channel, so model code cannot forge result lines; a failure before the harness is ready, or a
worker's failure to set itself up, is a "setup_error" line, never a result of the model's code. The weak mode
("unsafe-rlimits-only") runs launcher, harness and workers with rlimits and an audit hook, no security boundary.
Modules (standard library only; all imported before any setup): `common`, `cgroups`, `rootfs`, `seccomp`,
`worker`, `harness`, `modes` (`main`). docs/sandbox.md, "The processes of a run", has each one's part.

No dimension legend: host-side Python, no arrays.
"""

from .common import MARK  # noqa: F401  (the parent matches result lines on it)
