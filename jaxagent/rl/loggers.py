"""Where `rl.make_train` sends each iteration's metrics and warning lines: a logger is any object with
`log(step, metrics)`, `warning(step, message)` and `close()` (`Logger`).

`JsonlLogger` (the default, standard library only) appends one JSON line per iteration to a file; TensorBoard and
Weights & Biases loggers import their package when they are built and never otherwise, so neither is a dependency
(`make_logger("tensorboard", dir)` needs `tensorboardX`, or `torch` with `tensorboard`; "wandb" needs `wandb`).
An explicit I/O module: it writes files. The library itself prints nothing: pass `echo=print` to see warnings.
"""
from __future__ import annotations

import importlib
import json
import math
import os
from typing import Callable, Iterable, Mapping, Optional, Protocol, Union

KINDS = ("jsonl", "tensorboard", "wandb")


class Logger(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record iteration `step`'s metrics (numbers)."""

    def warning(self, step: int, message: str) -> None:
        """Record a one-line warning about iteration `step`."""

    def close(self) -> None:
        """Flush and release what the logger holds."""


def _scalars(metrics: Mapping) -> dict:
    """The number-valued metrics (ints stay ints, bools become 0/1); lists and strings left out."""
    return {k: (int(v) if isinstance(v, int) else float(v)) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, str)}


class JsonlLogger:
    """One JSON object per line in `path`: {"step": s, **metrics}, and {"step": s, "warning": text} per warning
    (NaN and Inf written as null). `echo(line)` (e.g. print) also gets every warning as text. `resume(step)` drops
    the lines of iterations >= step (written after the checkpoint a run resumes from)."""

    def __init__(self, path: Union[str, os.PathLike], echo: Optional[Callable[[str], None]] = None):
        self.path, self.echo = os.fspath(path), echo
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def _append(self, record: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._append({"step": int(step), **_scalars(metrics)})

    def warning(self, step: int, message: str) -> None:
        self._append({"step": int(step), "warning": message})
        if self.echo is not None:
            self.echo(f"warning: iteration {step}: {message}")

    def resume(self, step: int) -> None:
        if not os.path.isfile(self.path):
            return
        with open(self.path) as f:
            keep = [line for line in f if line.strip() and json.loads(line).get("step", -1) < step]
        with open(self.path, "w") as f:
            f.writelines(keep)

    def read(self) -> list[dict]:
        """The records written so far."""
        if not os.path.isfile(self.path):
            return []
        with open(self.path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def close(self) -> None:
        """Nothing is held open between lines."""


def _import_first(names: Iterable[str], kind: str, install: str):
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ValueError(f"logger {kind!r} needs {install}, which is not installed (the jsonl logger needs nothing)")


class TensorBoardLogger:
    """Scalars to TensorBoard event files in `logdir` (`tensorboardX`, else `torch.utils.tensorboard`); warnings as
    text summaries under the tag "warnings"."""

    def __init__(self, logdir: Union[str, os.PathLike]):
        module = _import_first(("tensorboardX", "torch.utils.tensorboard"), "tensorboard",
                               "tensorboardX (pip install tensorboardX) or torch with tensorboard")
        self.writer = module.SummaryWriter(os.fspath(logdir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for k, v in _scalars(metrics).items():
            self.writer.add_scalar(k, v, int(step))

    def warning(self, step: int, message: str) -> None:
        self.writer.add_text("warnings", message, int(step))

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Metrics to a Weights & Biases run (`wandb.init(**init_kwargs)`); each warning logged under the key
    "warning" at its step, beside the metrics."""

    def __init__(self, **init_kwargs):
        self.wandb = _import_first(("wandb",), "wandb", "wandb (pip install wandb)")
        self.run = self.wandb.init(**init_kwargs)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(_scalars(metrics), step=int(step))

    def warning(self, step: int, message: str) -> None:
        self.run.log({"warning": message}, step=int(step))

    def close(self) -> None:
        self.run.finish()


class Loggers:
    """Several loggers as one: each call goes to every logger in order."""

    def __init__(self, *loggers: Logger):
        self.loggers = loggers

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for lg in self.loggers:
            lg.log(step, metrics)

    def warning(self, step: int, message: str) -> None:
        for lg in self.loggers:
            lg.warning(step, message)

    def resume(self, step: int) -> None:
        for lg in self.loggers:
            if hasattr(lg, "resume"):
                lg.resume(step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


def make_logger(kinds: Union[str, Iterable[str]], directory: Union[str, os.PathLike], *,
                echo: Optional[Callable[[str], None]] = None, **wandb_kwargs) -> Logger:
    """Loggers by name ("jsonl", "tensorboard", "wandb", or several: "jsonl,tensorboard") writing under
    `directory`: <directory>/metrics.jsonl, <directory>/tensorboard/, a wandb run with dir=<directory>."""
    names = [k.strip() for k in (kinds.split(",") if isinstance(kinds, str) else kinds) if k.strip()]
    bad = [k for k in names if k not in KINDS]
    if bad or not names:
        raise ValueError(f"logger must name some of {', '.join(KINDS)}; got {kinds!r}")
    directory = os.fspath(directory)
    made = []
    for k in names:
        if k == "jsonl":
            made.append(JsonlLogger(os.path.join(directory, "metrics.jsonl"), echo=echo))
        elif k == "tensorboard":
            made.append(TensorBoardLogger(os.path.join(directory, "tensorboard")))
        else:
            made.append(WandbLogger(dir=directory, **wandb_kwargs))
    return made[0] if len(made) == 1 else Loggers(*made)
