"""Run directories of the studies: one writer at a time, settings records, DONE markers, JSON files.

The part of a run directory (`<root>/<name>/`) both studies share (FrozenLake, `jaxagent.study.frozenlake.run`; the
host domains, `jaxagent.study.host.run`):
- `RunDir(path)` creates the directory and takes its lock, an exclusive `fcntl.flock` on `<path>/.lock`, held until
  `release()` or the end of the process; a second writer gets `RunDirInUse` naming the holder's pid and start time,
  before it has read or written anything there. In a multi-process job process 0 takes it for the job (`lock_for_job`).
- config.json, each DONE marker and each RL checkpoint record the settings that determine their result;
  `settings_diff` names the fields that differ. A DONE marker is a JSON object (`mark_done`); one that is not (a torn
  or foreign file) is `InvalidMarker`, never mistaken for a finished stage.
- JSON files are written atomically (`write_json`), JSON-lines logs appended by process 0 (`append_jsonl`) and cut
  back on resume (`cut_jsonl`); nothing is written through a link (O_NOFOLLOW; else `InvalidRunDir`, naming it).
Errors a user can fix are `RunError`s with a one-line message saying what to do; scripts print them without a
traceback. This is one of the library's explicit I/O modules (it writes files; it never prints). The lock's scope
and what counts as a link: docs/study.md, "The run directory".
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import socket
import stat
import sys
import tempfile
import time

import jax
import numpy as np

from jaxagent.models import weights
from jaxagent.models.config import CheckpointError, Qwen3Config
from jaxagent.models.tokenizer import Tokenizer
from jaxagent.rl.checkpoint import settings_diff

LOCK_NAME = ".lock"
MARKER_NAME = "DONE"


class RunError(Exception):
    """A run cannot start or go on as asked (a user error); the message says which file or setting and what to do."""


class SettingsMismatch(RunError, ValueError):
    """A run directory, stage or checkpoint was made with other settings than the current run's."""


class InvalidSettings(RunError, ValueError):
    """A setting of the run (a preset field or a command-line override) makes no sense, e.g. a mesh that does
    not cover the devices."""


class InvalidRunDir(RunError, ValueError):
    """The run directory cannot be made or written (its root is a file, or it is not writable)."""


def _with_defaults(record: dict, defaults: dict) -> dict:
    """`record` with the fields of `defaults` it lacks, nested records merged field by field."""
    out = dict(record)
    for k, v in defaults.items():
        if k not in out:
            out[k] = v
        elif isinstance(v, dict) and isinstance(out[k], dict):
            out[k] = _with_defaults(out[k], v)
    return out


class RunDirInUse(RunError):
    """Another process (or job) holds the run directory's lock."""


class InvalidMarker(RunError, ValueError):
    """A DONE marker that is not a JSON object."""


# ------------------------------------------------------------------ files that are files
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def _not_regular(path, mode: int) -> str | None:
    """'<path> is a directory, not a regular file: ...' for a mode that is not a regular file's, else None."""
    if stat.S_ISREG(mode):
        return None
    what = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"{path} is {what}, not a regular file: the run directory writes only regular files; remove or rename it"


def check_regular(path) -> None:
    """InvalidRunDir when `path` exists and is not a regular file (a symbolic link is not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    problem = _not_regular(path, mode)
    if problem is not None:
        raise InvalidRunDir(problem)


def open_regular(path, flags: int, mode: int = 0o644, single_link: bool = False) -> int:
    """A descriptor of regular file `path` opened with `flags` | O_NOFOLLOW (a FIFO is not waited for); InvalidRunDir
    naming the path when it is a symbolic link or not a regular file (with `single_link`, also when another hard
    link to it exists)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            check_regular(path)
        raise
    st = os.fstat(fd)
    problem = _not_regular(path, st.st_mode)
    if problem is None and single_link and st.st_nlink != 1:
        problem = (f"{path} has {st.st_nlink} hard links: it may be another file's name, which writing it would "
                   "overwrite; remove it")
    if problem is not None:
        os.close(fd)
        raise InvalidRunDir(problem)
    os.set_blocking(fd, True)
    return fd


# ------------------------------------------------------------------ processes
def is_main_process() -> bool:
    return jax.process_index() == 0


def sync_processes(tag: str) -> None:
    """A barrier across processes (multi-process runs only): files process 0 wrote are there after it."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(tag)


def _process0_flag(flag: bool) -> bool:
    """Process 0's `flag`, on every process of the job."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils
    return bool(multihost_utils.broadcast_one_to_all(np.int32(flag)))


# ------------------------------------------------------------------ JSON files
def jsonable(x):
    """`x` with dataclasses as dicts and numpy scalars/arrays as Python numbers/lists (json.dump-able)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(x).items()}
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x


def plain(x):
    """JSON types only (tuples -> lists, dataclasses -> dicts): what a recorded setting reads back as."""
    return json.loads(json.dumps(jsonable(x)))


def write_json(path, obj) -> None:
    """Atomic write (a unique temporary file renamed over `path`), safe when several processes write. InvalidRunDir
    when `path` is there and not a regular file (a directory, a symbolic link)."""
    check_regular(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=os.path.basename(path),
                               suffix=".tmp")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(jsonable(obj), f, indent=1)
    os.replace(tmp, path)


def append_jsonl(path, rec) -> None:
    """Appends one JSON line (process 0 only: one copy of each record in a multi-process run)."""
    if not is_main_process():
        return
    with os.fdopen(open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a") as f:
        f.write(json.dumps(jsonable(rec)) + "\n")


def cut_jsonl(path, keep) -> int:
    """Rewrites a JSON-lines file atomically with only the records for which keep(record) is true (a
    line cut short by a kill is dropped too); returns how many lines were dropped. Process 0 only."""
    if not is_main_process() or not os.path.lexists(path):
        return 0
    kept, dropped = [], 0
    with os.fdopen(open_regular(path, os.O_RDONLY)) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            if isinstance(rec, dict) and keep(rec):
                kept.append(line if line.endswith("\n") else line + "\n")
            elif line.strip():
                dropped += 1
    if dropped:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=os.path.basename(path),
                                   suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.writelines(kept)
        os.replace(tmp, path)
    return dropped


def short(diff: list[str], n: int = 30) -> str:
    """The differences, top-level settings (e.g. name, iterations) before nested ones, at most `n`."""
    diff = sorted(diff, key=lambda d: "." in d.split(":")[0])
    return "; ".join(diff[:n]) + (f" (and {len(diff) - n} more)" if len(diff) > n else "")


# ------------------------------------------------------------------ DONE markers
def read_done(path) -> dict | None:
    """The JSON object in <path>/DONE, or None when there is no marker; InvalidMarker when the file is not a
    JSON object (torn, emptied or written by something else) or the path is not a regular file (a directory, a
    symbolic link)."""
    marker = os.path.join(path, MARKER_NAME)
    if not os.path.lexists(marker):
        return None
    try:
        check_regular(marker)
    except InvalidRunDir as e:
        raise InvalidMarker(f"DONE marker {e}") from None
    try:
        with open(marker, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else f"not JSON: {str(e).splitlines()[0]}"
        raise InvalidMarker(f"DONE marker {marker} is unreadable ({why}); it cannot say whether the stage finished "
                            "or with which settings: delete it to redo the stage") from None
    if not isinstance(info, dict):
        raise InvalidMarker(f"DONE marker {marker} holds a JSON {type(info).__name__}, not the object a finished "
                            "stage writes: delete it to redo the stage")
    return info


def done(path) -> bool:
    """Whether <path> holds a DONE marker (InvalidMarker when it holds one that is not a JSON object)."""
    return read_done(path) is not None


def done_settings(path):
    """The settings recorded in <path>/DONE; None when there is no marker or it records none (a marker of an
    older version); InvalidMarker when the marker is not a JSON object."""
    info = read_done(path)
    return None if info is None else info.get("settings")


def mark_done(path, info=None) -> None:
    write_json(os.path.join(path, MARKER_NAME), info or {"finished": time.strftime("%Y-%m-%d %H:%M:%S")})


# ------------------------------------------------------------------ the base checkpoint
def open_checkpoint(path) -> tuple[Qwen3Config, Tokenizer]:
    """(config, tokenizer) of the Hugging Face Qwen3 directory a run starts from, checked before the run writes
    anything: config.json and every safetensors header (`weights.check_checkpoint`, no tensor read), the tokenizer,
    and that the tokenizer's ids fit the model's vocabulary. CheckpointError naming the file and field, also for
    a missing directory or file."""
    path = os.fspath(path)
    try:
        cfg = weights.check_checkpoint(path)
        tok = Tokenizer.from_dir(path)
    except OSError as e:  # a missing directory or file: our messages name it, the OS's carry strerror and filename
        raise CheckpointError(f"checkpoint {path}: {e.strerror} ({e.filename})" if e.strerror else str(e)) from None
    tok.check_fits(cfg.vocab_size, f"the model in {path}")
    return cfg, tok


# ------------------------------------------------------------------ the lock
_HELD: dict[str, list] = {}  # real path of a directory this process has locked -> [its open lock file, holders]


def _holder(lock_path: str, wait_s: float = 2.0) -> str:
    """'pid P (started ...)' from a lock file's record, or what is known when it has none yet. The holder writes
    its record just after taking the lock, so a record still missing (or half written) is read again for up to
    `wait_s` seconds: two runs started at once name each other instead of racing to the message."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with os.fdopen(open_regular(lock_path, os.O_RDONLY), encoding="utf-8") as f:
                rec = json.load(f)
            where = "" if rec.get("host") == socket.gethostname() else f" on host {rec.get('host')}"
            return f"pid {rec['pid']}{where} (started {rec['started']}: {rec['command']})"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            if time.monotonic() >= deadline:
                return "another process (it has not recorded its pid yet)"
            time.sleep(0.05)


def _acquire(directory: str) -> str:
    """Takes (or shares, within this process) the flock of `directory`; returns the key to release."""
    key = os.path.realpath(directory)
    if key in _HELD:
        _HELD[key][1] += 1
        return key
    lock_path = os.path.join(directory, LOCK_NAME)
    try:
        f = os.fdopen(open_regular(lock_path, os.O_RDWR | os.O_CREAT, single_link=True), "r+", encoding="utf-8")
    except OSError as e:
        raise InvalidRunDir(f"run directory {directory} is not writable: cannot open its lock file {lock_path} "
                            f"({e.strerror})") from None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        f.close()
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise InvalidRunDir(f"run directory {directory}: cannot lock {lock_path} ({e.strerror}); the "
                                "filesystem may not support flock") from None
        raise RunDirInUse(f"run directory {directory} is in use by {_holder(lock_path)}; wait for it to end, or "
                          "choose another --name/--root") from None
    f.seek(0)
    f.truncate()
    json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
               "command": " ".join(sys.argv).replace("\n", " ")[:300]}, f)
    f.flush()
    _HELD[key] = [f, 1]
    return key


def _release(key: str) -> None:
    held = _HELD.get(key)
    if held is None:
        return
    held[1] -= 1
    if held[1] == 0:
        del _HELD[key]
        held[0].close()  # closing the last descriptor of the open file drops the flock


def is_locked(directory: str) -> bool:
    """Whether a writer holds `directory`'s lock (this process included: the probe opens a file of its own, and
    flock locks conflict between open files)."""
    try:
        f = os.fdopen(open_regular(os.path.join(directory, LOCK_NAME), os.O_RDONLY), encoding="utf-8")
    except FileNotFoundError:
        return False
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def make_dir(path: str) -> str:
    """Creates directory `path` (and its parents); InvalidRunDir naming the part that is a file or not writable."""
    path = os.path.abspath(path)
    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        part = path
        while part != os.path.dirname(part) and not os.path.exists(part):
            part = os.path.dirname(part)
        raise InvalidRunDir(f"cannot make run directory {path}: {part} is a file, not a directory") from None
    except OSError as e:
        raise InvalidRunDir(f"cannot make run directory {path}: {e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InvalidRunDir(f"run directory {path} is not writable by this user")
    return path


class RunDir:
    """A run directory this process group writes: created and locked by the constructor (module doc).

    In a multi-process job every process constructs it; process 0 takes the lock and the others learn the
    outcome (all raise `RunDirInUse` when process 0 could not lock). `release()` (or the end of the process)
    drops the lock."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self._key = None
        ok, err = True, None
        if is_main_process():
            try:
                make_dir(self.path)
                self._key = _acquire(self.path)
            except RunError as e:
                ok, err = False, e
        if not _process0_flag(ok):
            if err is not None:
                raise err
            raise RunDirInUse(f"run directory {self.path}: process 0 of this job could not make or lock it "
                              "(its error says why)")

    @property
    def holds_lock(self) -> bool:
        """Whether this process holds the directory's lock (process 0 of a job, or a single process)."""
        return self._key is not None

    def release(self) -> None:
        if self._key is not None:
            _release(self._key)
            self._key = None

    def __del__(self):
        self.release()

    def read_config(self) -> dict | None:
        """The recorded config.json as a dict, None when there is none; an unreadable one reads as
        {'config.json': '<unreadable>'} (it differs from every record, so it is named, not trusted)."""
        path = os.path.join(self.path, "config.json")
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError):
            return {"config.json": "<unreadable>"}
        return old if isinstance(old, dict) else {"config.json": "<unreadable>"}

    def config_diff(self, record: dict, neutral=(), defaults: dict | None = None) -> tuple[dict | None, list[str]]:
        """(recorded config or None, the differences 'field: recorded vs now' between it and `record`, leaving
        out the fields in `neutral`, which may change between runs: where and which, not what). `defaults`: the
        values of fields a config.json of an older version lacks (a dict value: fields of a nested record)."""
        old = self.read_config()
        sync_processes(f"config-read:{self.path}")  # every process read config.json before it is rewritten
        if old is None:
            return None, []
        old = _with_defaults(old, defaults or {})

        def strip(d):
            return {k: v for k, v in d.items() if k not in neutral}

        return old, settings_diff(strip(old), strip(plain(record)))

    def write_config(self, record: dict) -> None:
        if is_main_process():
            write_json(os.path.join(self.path, "config.json"), record)
        sync_processes(f"config-write:{self.path}")

    def empty(self) -> None:
        """Removes everything in the directory but its lock (process 0), e.g. to redo a run with other settings."""
        import shutil

        if is_main_process():
            for name in os.listdir(self.path):
                if name == LOCK_NAME:
                    continue
                full = os.path.join(self.path, name)
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)
                else:
                    os.remove(full)
        sync_processes(f"empty:{self.path}")
