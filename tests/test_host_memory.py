"""A program compiled for this machine's CPU that needs more memory than the machine has available stops before it
runs, with one line naming the program and both figures (`xla_options.check_host_memory`), instead of being killed by
the kernel mid-run; the scripts print that line and exit 2."""
import types

import jax
import jax.numpy as jnp
import pytest

from experiments import cli
from jaxagent import xla_options
from jaxagent.xla_options import HostMemoryError, check_host_memory


def _mem(temp, out, alias):
    return types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(
        temp_size_in_bytes=temp, output_size_in_bytes=out, alias_size_in_bytes=alias))


def test_the_check_counts_temporaries_and_outputs_not_aliased_to_donated_inputs():
    cpu = jax.devices("cpu")[:1]
    gib = xla_options.GIB
    check_host_memory(_mem(3 * gib, 2 * gib, 2 * gib), "step", cpu, available=3 * gib)  # 3 GiB: fits exactly
    with pytest.raises(HostMemoryError) as e:
        check_host_memory(_mem(3 * gib, 2 * gib, 1 * gib), "step", cpu, available=3 * gib)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("program 'step' needs 4.0 GiB of this host's memory beyond its")
    assert "(3.0 GiB of temporaries, 1.0 GiB of new outputs) and 3.0 GiB are available" in msg
    two = [types.SimpleNamespace(platform="cpu", process_index=0)] * 2  # a 2-device CPU mesh in this process
    with pytest.raises(HostMemoryError, match="needs 4.0 GiB of this host's memory beyond its arguments over its 2 CPU"):
        check_host_memory(_mem(1 * gib, 2 * gib, 1 * gib), "step", two, available=3 * gib)
    gpu = [types.SimpleNamespace(platform="gpu", process_index=0)]
    check_host_memory(_mem(100 * gib, 0, 0), "step", gpu, available=1)  # another platform's memory: not this host's


def test_available_memory_is_read_from_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\n")
    assert xla_options.host_memory_available(str(f)) == 2048 * 1024
    f.write_text("MemTotal: 1 kB\n")
    assert xla_options.host_memory_available(str(f)) is None
    assert xla_options.host_memory_available(str(tmp_path / "absent")) is None


def test_a_jitted_program_too_large_for_the_host_stops_before_it_runs(monkeypatch):
    @xla_options.jit
    def grow(x):
        return jnp.outer(x, x) + 1.0

    x = jnp.ones((512,), jnp.float32)  # a 1 MiB output
    monkeypatch.setattr(xla_options, "host_memory_available", lambda: 1024)
    with pytest.raises(HostMemoryError, match="program 'grow' needs"):
        grow(x)
    monkeypatch.setattr(xla_options, "host_memory_available", lambda: 1 << 40)
    assert float(grow(x)[0, 0]) == 2.0


def test_every_call_of_a_cached_program_is_checked_after_freed_memory_is_handed_back(monkeypatch):
    """The check runs before each call, not only the first: what the process holds beside a cached program grows
    between its calls. When short, the process's freed heap is handed back first and MemAvailable read again."""
    @xla_options.jit
    def grow(x):
        return jnp.outer(x, x) + 1.0

    x = jnp.ones((512,), jnp.float32)  # a 1 MiB output
    monkeypatch.setattr(xla_options, "host_memory_available", lambda: 1 << 40)
    assert float(grow(x)[0, 0]) == 2.0  # compiled and run with room
    avail = {"now": 1024}
    trims = []
    monkeypatch.setattr(xla_options, "host_memory_available", lambda: avail["now"])
    monkeypatch.setattr(xla_options, "release_freed_host_memory", lambda: trims.append(1) or True)
    with pytest.raises(HostMemoryError, match=r"program 'grow' needs .* and 0\.0 GiB are available"):
        grow(x)  # the cached executable: no compile, still checked
    assert trims == [1] and grow._cache_size() == 1

    def trim_frees_memory():
        avail["now"] = 1 << 40
        return True

    avail["now"] = 1024
    monkeypatch.setattr(xla_options, "release_freed_host_memory", trim_frees_memory)
    assert float(grow(x)[0, 0]) == 2.0  # short until the freed heap went back: then it runs


def test_the_scripts_print_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        with cli.clear_errors():
            raise HostMemoryError("program 'grow' needs 21.0 GiB of this host's memory beyond its arguments", "grow")
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == ("error: program 'grow' needs 21.0 GiB of this host's memory beyond its "
                                              "arguments")
    # a train step's line names the knob that holds one layer's work at a time
    with pytest.raises(SystemExit) as e:
        with cli.clear_errors():
            raise HostMemoryError("program 'step' needs 21.0 GiB of this host's memory beyond its arguments", "step")
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and err.endswith("(a train step: --scan-layers holds one layer's "
                                                                    "work at a time)")


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def test_freed_heap_memory_goes_back_to_the_kernel():
    """glibc keeps freed blocks below its adaptive mmap threshold in the heap (resident); the study's call between
    arms hands them back. What would fail it: a no-op release (the retained 300 MB stay resident)."""
    if not xla_options.release_freed_host_memory():
        pytest.skip("glibc's malloc_trim: Linux with glibc only")
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    libc.free(libc.malloc(16 << 20))  # freeing an mmapped 16 MB block raises the threshold above 4 MB
    blocks = [libc.malloc(4 << 20) for _ in range(80)]  # 320 MB from the heap now, touched so they are resident
    for b in blocks:
        libc.memset(b, 1, 4 << 20)
    for b in blocks[:-1]:  # the last one stays: the heap's top cannot simply shrink below it
        libc.free(b)
    retained = _rss_bytes()
    xla_options.release_freed_host_memory()
    released = retained - _rss_bytes()
    libc.free(blocks[-1])
    assert released > 200 << 20, f"{released / 2**20:.0f} MB handed back"


def test_the_decoding_copy_of_the_params_is_checked_before_it_is_made(monkeypatch):
    """`rollout_params`' cast to the compute dtype is a weight-sized new buffer: on a CPU host it is checked like any
    program (a full-size 8B rehearsal was killed by the kernel there, after the train state had passed its check)."""
    from jaxagent.models import qwen3
    from jaxagent.models.config import Qwen3Config
    from jaxagent.sampling.generate import rollout_params
    cfg = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8)
    params = qwen3.init(cfg, jax.random.key(0))
    monkeypatch.setattr(xla_options, "host_memory_available", lambda: 1)
    monkeypatch.setattr(xla_options, "release_freed_host_memory", lambda: False)
    with pytest.raises(HostMemoryError, match=r"program 'cast_params' needs .* of new outputs"):
        rollout_params(params, cfg, compute_dtype="bfloat16")
    monkeypatch.setattr(xla_options, "host_memory_available", lambda: 1 << 40)
    assert jax.tree.leaves(rollout_params(params, cfg, compute_dtype="bfloat16"))[0].dtype == jnp.bfloat16
