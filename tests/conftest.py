"""Test-wide setup: 8 fake CPU devices so sharding tests can build meshes in any test process."""
import os

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
        mp.setattr(ops, "platform_select", lambda *args, cpu, default, **_: default(*args))
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
