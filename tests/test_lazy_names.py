"""jaxagent.lazy: a package's lazy names, and the clash that would hide one (a name equal to a submodule's name is
replaced by the module as soon as that submodule is imported anywhere)."""
import importlib
import sys

import pytest

from jaxagent.lazy import lazy_names


def test_a_name_equal_to_its_submodule_is_refused():
    with pytest.raises(ValueError, match=r"exported names \['verdict'\] are also submodule names"):
        lazy_names("jaxagent.aot", {"verdict": ("verdict", "HBM_FRACTION")})


def test_aot_names_survive_their_submodules_being_imported_first():
    importlib.import_module("jaxagent.aot.verdict")  # what a script or another test does before the name is read
    aot = sys.modules.get("jaxagent.aot") or importlib.import_module("jaxagent.aot")
    assert callable(aot.program_verdict) and aot.program_verdict.__module__ == "jaxagent.aot.verdict"
    rec = {"hbm_fraction": 0.5, "foreign_custom_calls": [], "collectives": {}, "flops_ratio": 1.0}
    assert aot.program_verdict(rec, fraction=0.85, flops_checked=True) == "ok"
