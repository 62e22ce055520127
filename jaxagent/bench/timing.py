"""Wall-clock timing of a jitted call: warm-up calls first (the first compiles), then `repeats` timed calls,
each timed alone around exactly the measured call and `jax.block_until_ready` on its whole output, with
`time.perf_counter` (monotonic, so no figure can be negative); median, min, max and the spread
(max - min) / median are reported. Inputs a call consumes (donated buffers) are made by `setup` before the
clock starts."""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Optional

import jax


@dataclasses.dataclass(frozen=True)
class Timing:
    times_s: tuple                # every timed call, in order
    warmup_s: tuple               # the warm-up calls (the first one includes compilation)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def spread(self) -> float:
        """(max - min) / median of the timed calls."""
        return (max(self.times_s) - min(self.times_s)) / self.median_s

    def fields(self, prefix: str = "time") -> dict:
        return {f"{prefix}_s": self.median_s, f"{prefix}_min_s": min(self.times_s),
                f"{prefix}_max_s": max(self.times_s), f"{prefix}_spread": self.spread,
                "repeats": len(self.times_s), "warmup": len(self.warmup_s),
                "first_call_s": self.warmup_s[0] if self.warmup_s else None}


def timed(fn: Callable[[Any], Any], *, repeats: int, warmup: int = 1,
          setup: Optional[Callable[[], Any]] = None) -> tuple[Timing, Any]:
    """Times `fn(setup())` (or `fn(None)`): `warmup` untimed calls, then `repeats` timed ones. Returns the
    Timing and the last call's output (blocked)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    out, warm, times = None, [], []
    for i in range(warmup + repeats):
        arg = jax.block_until_ready(setup()) if setup is not None else None
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(arg))
        (warm if i < warmup else times).append(time.perf_counter() - t0)
    return Timing(tuple(times), tuple(warm)), out
