"""The package keeps to JAX's public API, so it runs on every JAX from 0.10.2 through the 0.11 series that GPU
images ship: no module under jaxagent/ or experiments/ imports `jax._src` (or reaches it as an attribute), none
touches a name that JAX 0.10 lists as deprecated (removed in 0.11), and `xla_options.jit` still tells a top-level
call from a nested one with public APIs only (`jax.extend.core`)."""
import ast
import importlib
import os
import pkgutil
import warnings

import jax
import jax.numpy as jnp
import pytest

from jaxagent import xla_options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources():
    for top in ("jaxagent", "experiments"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if f.endswith(".py"):
                    yield os.path.join(dirpath, f)


def private_jax_uses(source: str) -> list[str]:
    """`import jax._src...`, `from jax._src... import`, `from jax import _src` and `jax._src` attribute chains."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("jax._src")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("jax._src") or (node.module == "jax" and any(a.name == "_src" for a in node.names)):
                out.append(node.module)
        elif isinstance(node, ast.Attribute) and node.attr == "_src":
            base = node.value
            if isinstance(base, ast.Name) and base.id == "jax":
                out.append("jax._src")
    return out


def test_the_scanner_finds_private_imports():
    bad = ("import jax._src.core\nfrom jax._src.core import trace_state_clean\nfrom jax import _src\n"
           "x = jax._src.core\n")
    assert len(private_jax_uses(bad)) == 4
    assert private_jax_uses("import jax\nfrom jax import core\nx = jax.core.Tracer\n") == []


def test_no_module_uses_jax_src():
    found = {os.path.relpath(p, ROOT): u for p in _sources() if (u := private_jax_uses(open(p).read()))}
    assert found == {}


def _deprecated_names() -> dict[str, list[str]]:
    """{public jax module: names it lists in `_deprecations`} for the installed JAX (0.10.x: the names
    deprecated or already removed, all gone in 0.11)."""
    out = {}
    for info in pkgutil.walk_packages(jax.__path__, "jax."):
        if "._src" in info.name or "jax2tf" in info.name or "tests" in info.name:
            continue
        try:
            mod = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 -- optional backends (TPU, CUDA) missing here
            continue
        names = getattr(mod, "_deprecations", None)
        if isinstance(names, dict) and names:
            out[info.name] = sorted(names)
    return out


def test_no_deprecated_jax_names():
    deprecated = _deprecated_names()
    assert "jax.core" in deprecated  # the installed JAX lists them (else this test would check nothing)
    hits = []
    for path in _sources():
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in deprecated:
                hits += [(path, node.module, a.name) for a in node.names if a.name in deprecated[node.module]]
            elif isinstance(node, ast.Attribute):
                chain, base = [node.attr], node.value
                while isinstance(base, ast.Attribute):
                    chain.append(base.attr)
                    base = base.value
                if isinstance(base, ast.Name):
                    dotted = ".".join([base.id] + chain[::-1])
                    mod, _, name = dotted.rpartition(".")
                    if name in deprecated.get(mod, ()):
                        hits.append((path, mod, name))
    assert hits == []


def test_importing_the_package_raises_no_jax_deprecation_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for info in pkgutil.walk_packages([os.path.join(ROOT, "jaxagent")], "jaxagent."):
            if not info.name.endswith("__main__"):  # a program (the sandbox child), not a module
                importlib.import_module(info.name)
    ours = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
            and os.path.abspath(w.filename).startswith(os.path.join(ROOT, "jaxagent"))]
    assert ours == []


# ----------------------------------------------------------------------------- xla_options, public only
def test_only_top_level_calls_compile_their_own_program():
    """Under a caller's jit, eval_shape, make_jaxpr, vmap or grad (of arguments or of constants) an entry point is
    part of the caller's program: it compiles nothing of its own and donates nothing; called at top level it does."""
    f = xla_options.jit(lambda x: x * 2, donate_argnums=(0,))
    const = jnp.ones(2)
    jax.jit(lambda: f(const))()
    jax.eval_shape(lambda: f(const))
    jax.make_jaxpr(lambda: f(const))()
    jax.jit(f)(jnp.ones(2))
    jax.vmap(f)(jnp.ones((3, 2)))
    jax.vmap(lambda y: f(jnp.ones(2)) + y)(jnp.zeros((3, 2)))  # jax runs this nested jit eagerly, donating
    jax.grad(lambda x: f(x).sum())(jnp.ones(2))
    assert f._cache_size() == 0 and not const.is_deleted()
    f(const)
    assert f._cache_size() == 1 and const.is_deleted()


def test_entry_point_called_on_constants_inside_a_users_jit():
    """A closure over constants under a caller's jit: the nested jit (no options), which jax would reject with
    them."""
    f = xla_options.jit(lambda x: x * 2, compiler_options={"xla_backend_optimization_level": 0})
    assert float(jax.jit(lambda: f(jnp.float32(3)) + 1)()) == 7.0
    assert float(jax.vmap(lambda y: f(jnp.float32(3)) + y)(jnp.zeros(2))[1]) == 6.0
    with pytest.raises(ValueError, match="compiler_options"):
        g = jax.jit(lambda x: x * 2, compiler_options=xla_options.DECODING_CPU_OPTIONS)
        jax.jit(lambda: g(jnp.float32(3)))()
