"""XLA compiler options for jaxagent's jitted programs, and `jit`, which applies them when a program is compiled.

A program made with `jit` is one plain `jax.jit` (`.jit`). Under a transformation (a user's `jax.jit`, `eval_shape`,
`make_jaxpr`, `vmap`, `grad`) it is that jit, nested, and the outermost program decides the options (jax accepts
`compiler_options` on a top-level jit only). Called outside every transformation it runs that jit lowered for its
arguments and compiled with `options` for the devices they are placed on, so no process-wide flag is needed.
`.lower` is the program's text and `.compile` the executable such a call runs.
The options: decoding-shaped programs turn XLA:CPU's YNNPACK dot fusion off; programs over whole sequences
(`jit(..., sequence=True)`) keep XLA's defaults on one CPU device and turn it off when partitioned over several;
GPU and TPU compiles get none (they are XLA:CPU options). Why, with the measurements and their commands:
docs/performance.md, "Optimisations" (YNNPACK dot fusion).
Host memory: before a top-level call on CPU devices runs, what the compiled program allocates beyond its arguments
(`memory_analysis`) is compared with the memory the kernel reports available, and `HostMemoryError` (one line: the
program, both figures) is raised instead of a silent kill mid-run. `release_freed_host_memory` hands freed host
memory back to the kernel between stages.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import inspect
import operator
import sys
from typing import Any, Callable, Iterable, Optional

import jax
import numpy as np
from jax.extend.core import get_opaque_trace_state

DECODING_CPU_OPTIONS: dict[str, str] = {"xla_cpu_experimental_ynn_fusion_type": ""}
SEQUENCE_CPU_OPTIONS: dict[str, str] = {}  # one CPU device: XLA's defaults

_TOP_LEVEL = get_opaque_trace_state()  # jax's eval trace: no transformation is tracing
GIB = 2**30


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # no glibc (e.g. musl): nothing to trim
        return None


def release_freed_host_memory() -> bool:
    """Hands the heap memory this process has freed back to the kernel (glibc's `malloc_trim(0)`; a no-op without
    glibc). glibc keeps freed blocks below its adaptive mmap threshold (which rises to 32 MB once such a block is
    freed) in its heap, so a CPU stage's freed buffers stayed resident into the next stage: a full-depth Qwen3-0.6B
    rehearsal grew by about 1 GB per RL arm until the kernel killed it at the fifth (docs/first_run.md). The study
    calls this after each arm x seed, when nothing of the arm is live. Returns whether glibc was asked."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    return trim is not None


class HostMemoryError(MemoryError):
    """A program compiled for CPU devices needs more memory than this host has available (module docstring);
    `program`: the jitted function's name."""

    def __init__(self, message: str, program: str = ""):
        super().__init__(message)
        self.program = program


def host_memory_available(meminfo: str = "/proc/meminfo") -> Optional[int]:
    """Bytes the kernel reports available for new allocations (MemAvailable); None where it cannot be read."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_memory_need(executable, devices: Iterable) -> tuple[int, int, int]:
    """(temporaries, new outputs, CPU devices) of `executable` compiled for `devices`: bytes it allocates beyond its
    arguments on this host (temporaries + outputs - outputs aliased to donated inputs, per device as `memory_analysis`
    gives them, times the devices this process holds); zeros for other platforms or where the analysis is unknown."""
    devices = list(devices)
    if not devices or not all(d.platform == "cpu" for d in devices):
        return 0, 0, 0
    mem = executable.memory_analysis()
    if mem is None:
        return 0, 0, 0
    local = max(sum(d.process_index == jax.process_index() for d in devices), 1)
    return (mem.temp_size_in_bytes * local, max(mem.output_size_in_bytes - mem.alias_size_in_bytes, 0) * local,
            local)


def require_host_memory(need: tuple[int, int, int], name: str, available: Optional[int] = None) -> None:
    """`HostMemoryError` when `need` (`host_memory_need`) exceeds `available` bytes (default: this host's MemAvailable,
    read again after `release_freed_host_memory` when short: the process's own freed heap is reusable); nothing
    where it cannot be read."""
    temp, new_out, local = need
    if temp + new_out == 0:
        return
    if available is None:
        available = host_memory_available()
        if available is not None and temp + new_out > available and release_freed_host_memory():
            available = host_memory_available()
    if available is None or temp + new_out <= available:
        return
    raise HostMemoryError(
        f"program {name!r} needs {(temp + new_out) / GIB:.1f} GiB of this host's memory beyond its arguments"
        f"{f' over its {local} CPU devices' if local > 1 else ''} "
        f"({temp / GIB:.1f} GiB of temporaries, {new_out / GIB:.1f} GiB of new outputs) and "
        f"{available / GIB:.1f} GiB are available: run it on a host with more memory, or with a smaller model "
        "or fewer rows per call", program=name)


def check_host_memory(executable, name: str, devices: Iterable, available: Optional[int] = None) -> None:
    """`require_host_memory` for `executable` compiled for `devices` (`host_memory_need`)."""
    require_host_memory(host_memory_need(executable, devices), name, available)


def options(devices: Iterable, *, sequence: bool = False, extra: Optional[dict] = None) -> dict:
    """The compiler options of a program that runs on `devices` (the module docstring says why): none off XLA:CPU;
    `SEQUENCE_CPU_OPTIONS` for a program over whole sequences (`sequence`) on one CPU device; `DECODING_CPU_OPTIONS`
    for any other program on CPU. `extra` (e.g. {'xla_backend_optimization_level': 0}) goes on top everywhere."""
    devices = set(devices)
    if not devices:
        raise ValueError("options: no devices (the program must run somewhere)")
    if any(d.platform != "cpu" for d in devices):
        base = {}
    elif sequence and len(devices) == 1:
        base = SEQUENCE_CPU_OPTIONS
    else:
        base = DECODING_CPU_OPTIONS
    return {**base, **(extra or {})}


def _static_positions(fun: Callable, jit_kwargs: dict) -> tuple[frozenset, frozenset]:
    """(positions, names) of `fun`'s static arguments as `jax.jit` resolves them: given one of the two, the other
    follows from `fun`'s positional-or-keyword parameters; given both, both as given."""
    nums, names = jit_kwargs.get("static_argnums"), jit_kwargs.get("static_argnames")
    nums = () if nums is None else (nums,) if isinstance(nums, int) else tuple(nums)
    names = () if names is None else (names,) if isinstance(names, str) else tuple(names)
    if any(i < 0 for i in nums):
        raise ValueError(f"xla_options.jit: static_argnums must be non-negative, got {nums}")
    if (nums and names) or not (nums or names):
        return frozenset(nums), frozenset(names)
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):  # none to read (a builtin): as given
        return frozenset(nums), frozenset(names)
    params = [(i, p.name) for i, p in enumerate(signature.parameters.values()) if p.kind == p.POSITIONAL_OR_KEYWORD]
    if names:
        return frozenset(i for i, n in params if n in names), frozenset(names)
    return frozenset(nums), frozenset(n for i, n in params if i in nums)


_AVAL, _SHARDING = operator.attrgetter("aval"), operator.attrgetter("sharding")


def _leaf_signature(x):
    if isinstance(x, jax.Array):
        return x.aval, x.sharding
    if isinstance(x, (np.ndarray, np.generic)):
        return x.shape, x.dtype
    return type(x)  # a Python scalar: weakly typed, whatever its value


def _signature(leaves: list) -> tuple[tuple, tuple]:
    """(types, placements) of the arguments, what a compiled program is specialised to: jax's types (interned:
    hashed by identity) and shardings for `jax.Array`s, kept apart because hashing shardings costs ~1 us each while
    comparing the same objects (the usual case: a program's outputs fed back) costs nothing."""
    try:
        return tuple(map(_AVAL, leaves)), tuple(map(_SHARDING, leaves))
    except AttributeError:  # a NumPy array or Python scalar among them
        return tuple(map(_leaf_signature, leaves)), ()


def _placements(tree) -> list:
    return [s for s in jax.tree.leaves(tree) if isinstance(s, jax.sharding.Sharding)]


class Program:
    """One `jax.jit` of a function (`.jit`), compiled for top-level calls with `options` (module docstring). A top-level
    call reuses the executable compiled for the same static values, `jax.set_mesh` context, argument types and
    placements (as `jax.jit` caches its own); other jax settings that change tracing (x64, default matmul precision)
    are not part of that key: set them for the whole process."""

    def __init__(self, fun: Callable, sequence: bool, extra: Optional[dict], jit_kwargs: dict):
        self.jit = jax.jit(fun, **jit_kwargs)
        self.sequence, self.extra = sequence, dict(extra or {})
        self._static = _static_positions(fun, jit_kwargs)
        self._static_order = tuple(sorted(self._static[0]))
        self._placed = _placements((jit_kwargs.get("in_shardings"), jit_kwargs.get("out_shardings")))
        self._executables: dict = {}
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        if get_opaque_trace_state() != _TOP_LEVEL or jax.config.jax_disable_jit:
            return self.jit(*args, **kwargs)  # nested: part of the caller's program (or run op by op)
        nums, names = self._static
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums) if nums else args
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in names} if names else kwargs
        leaves, tree = jax.tree.flatten((dyn_args, dyn_kwargs))
        types, placements = _signature(leaves)
        # as jax.jit's own cache: static values, the context mesh (the model reads it), argument types and placements
        key = (tuple(args[i] for i in self._static_order if i < len(args)),
               tuple(sorted((k, v) for k, v in kwargs.items() if k in names)),
               jax.sharding.get_abstract_mesh(), tree, types)
        compiled = self._executables.get(key)
        if compiled is None:
            compiled = self._executables[key] = []
        for placed, executable, need in compiled:
            if placed == placements:
                break
        else:
            executable = self.compile(*args, **kwargs)
            need = host_memory_need(executable, self.devices(*args, **kwargs))
            compiled.append((placements, executable, need))
        # every call, not only the first: what the process holds beside a cached program grows between its calls
        require_host_memory(need, getattr(self, "__name__", "jit"))
        return executable(*dyn_args, **dyn_kwargs)

    def devices(self, *args, **kwargs) -> set:
        """The devices a call with these arguments runs on: those of the jit's in/out shardings and of the arguments'
        placements (`jax.Array`s, or `jax.ShapeDtypeStruct`s with a sharding); unplaced arguments run on the
        default device."""
        placed = self._placed + _placements(jax.tree.map(lambda x: getattr(x, "sharding", None), (args, kwargs)))
        return {d for s in placed for d in s.device_set} or {jax.devices()[0]}

    def compile(self, *args, **kwargs) -> jax.stages.Compiled:
        """The executable a top-level call with these arguments (arrays or `jax.ShapeDtypeStruct`s) runs: `.lower`
        compiled with `options` for `devices`."""
        opts = options(self.devices(*args, **kwargs), sequence=self.sequence, extra=self.extra)
        return self.lower(*args, **kwargs).compile(opts or None)

    def lower(self, *args, **kwargs) -> jax.stages.Lowered:
        return self.jit.lower(*args, **kwargs)

    def trace(self, *args, **kwargs) -> jax.stages.Traced:
        return self.jit.trace(*args, **kwargs)

    def eval_shape(self, *args, **kwargs) -> Any:
        return self.jit.eval_shape(*args, **kwargs)

    def _cache_size(self) -> int:
        """Executables compiled for top-level calls (as `jax.jit`'s `_cache_size` counts its own)."""
        return sum(map(len, self._executables.values()))

    def __get__(self, obj, objtype=None):  # usable as a method decorator too
        return self if obj is None else functools.partial(self, obj)


def jit(fun: Optional[Callable] = None, *, compiler_options: Optional[dict] = None, sequence: bool = False,
        **jit_kwargs):
    """A `Program`: `jax.jit(fun, **jit_kwargs)`, compiled for top-level calls with `options(devices, sequence=sequence,
    extra=compiler_options)`; `sequence`: a program over whole sequences (module docstring).
    Usable as `jit(f, ...)` or as a decorator `@functools.partial(jit, static_argnames=...)`."""
    if fun is None:
        return lambda f: Program(f, sequence, compiler_options, jit_kwargs)
    return Program(fun, sequence, compiler_options, jit_kwargs)
