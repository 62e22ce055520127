"""Test-wide setup: 8 fake CPU devices so sharding tests can build meshes in any test process."""
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
# Tests run tiny programs: compile time dominates, and LLVM -O0 compiles XLA:CPU programs ~1.5-3x faster.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# libtpu is installed for the compile-only TPU topologies; the tests run on the CPU backend (without this,
# every process would first try to bring up a TPU runtime). Topologies are still available.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """Files holding a slow test run first: with the suite split over workers by file (pytest-xdist,
    `--dist loadfile`), a long file started last would leave the other workers idle at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order within a file is kept


def pytest_configure(config):
    """One XLA compilation cache for the whole test run, shared by the xdist workers and every subprocess the
    tests start (they inherit the environment): many files build the same tiny models and presets, and the
    multi-process tests compile the same programs in each process. An entry is keyed by the program's HLO, the
    compile options, the devices and the jax/XLA versions, so a hit returns the executable the same compile would
    produce. The directory is new for each run and removed at its end (nothing carries over between runs); a set
    JAX_COMPILATION_CACHE_DIR is kept as is. Every compile is cached (the tests' programs compile in well under
    jax's default 1 s threshold), and a size limit turns on jax's file lock, so that two processes never read an
    entry while another writes it. Programs compiled for TPU topologies are written too but cannot be loaded back
    by a compile-only client: jax then compiles them again (pyproject.toml silences that warning).
    JAX_ENABLE_COMPILATION_CACHE=false turns the cache off."""
    if hasattr(config, "workerinput") or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return  # an xdist worker: the controller set it up before starting the workers
    path = tempfile.mkdtemp(prefix="jaxagent-xla-cache-")
    config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))


# Compiling for TPU topologies on this host (tests/test_platform_dispatch.py) may share libtpu with
# other processes; these must be set before libtpu loads.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import contextlib  # noqa: E402

import pytest  # noqa: E402

# The model's seam (jaxagent.models.ops) run three ways, for parity tests:
#   "kernels":     the program this CPU host lowers (the compiled CPU kernels where they are built),
#   "cpu_xla":     the same without the kernels (JAXAGENT_CPU_KERNELS=0: XLA:CPU's branches),
#   "accelerator": the branches every other platform lowers (lax.switch windows, dot_general attention),
#                  executed here on CPU.
SEAM_MODES = ("kernels", "cpu_xla", "accelerator")


@contextlib.contextmanager
def seam_mode(mode: str):
    """Runs the block with the model's seam in `mode` (see SEAM_MODES). The choice is made while
    tracing, so jit caches are cleared on the way in and out of a non-default mode."""
    import jax
    from jaxagent.models import ops, ops_cpu
    if mode not in SEAM_MODES:
        raise ValueError(f"unknown seam mode {mode!r}")
    if mode == "kernels":
        yield
        return
    mp = pytest.MonkeyPatch()
    mp.setattr(ops_cpu, "kernels_built", lambda: False)
    if mode == "accelerator":
        mp.setattr(ops, "platform_select", lambda *args, cpu, default: default(*args))
    jax.clear_caches()
    try:
        yield
    finally:
        mp.undo()
        jax.clear_caches()


@pytest.fixture(scope="session")
def tok():
    """The real Qwen3 tokenizer (the host-env tests' chat layout); skips where its files are unavailable."""
    from jaxagent.models.tokenizer import Tokenizer, qwen3_tokenizer_dir
    try:
        return Tokenizer.from_dir(qwen3_tokenizer_dir())
    except (ModuleNotFoundError, FileNotFoundError) as err:
        pytest.skip(f"real Qwen3 tokenizer unavailable: {err}")


@pytest.fixture(scope="session")
def host_model():
    """(cfg, params) of the host-env tests' random Qwen3: the CI miniatures' 1-layer model with the real
    tokenizer's vocabulary (`jaxagent.study.host.presets.tiny_model`)."""
    import jax
    from jaxagent.study.host.presets import tiny_model
    from jaxagent.models import qwen3
    cfg = tiny_model()
    return cfg, qwen3.init(cfg, jax.random.key(0))


@pytest.fixture
def seam(request):
    """Parametrized indirectly (`@pytest.mark.parametrize("seam", [...], indirect=True)`): the seam mode
    for this test only (other tests always see the default)."""
    with seam_mode(request.param):
        yield request.param
