"""One process of the two-process job in tests/test_run_dirs.py: both construct a RunDir of the same directory
(process 0 takes the lock for the job, process 1 sees it held), then of a directory the test process holds (both
get RunDirInUse). Writes what it saw as JSON to its --out path."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.multiprocess import init_worker  # noqa: E402


def main(argv=None):
    out = init_worker(argv)
    import jax
    from jaxagent.study import run_dir

    base = os.path.dirname(out)
    free, busy = os.path.join(base, "free"), os.path.join(base, "busy")
    rd = run_dir.RunDir(free)
    run_dir.sync_processes("after-lock")
    seen = {"process": jax.process_index(), "holds": rd.holds_lock, "locked": run_dir.is_locked(free)}
    run_dir.sync_processes("after-probe")
    try:
        run_dir.RunDir(busy)
        seen["busy"] = "no error"
    except run_dir.RunDirInUse as e:
        seen["busy"] = str(e)
    with open(out, "w") as f:
        json.dump(seen, f)
    run_dir.sync_processes("done")


if __name__ == "__main__":
    main()
