"""A package's names loaded from their modules on first use (module `__getattr__`, PEP 562), so that importing the
package imports none of what they need: `jaxagent.study`'s (the whole study) and `jaxagent.aot`'s (JAX), whose plain
submodules the scripts' --help reads."""
from __future__ import annotations

import importlib
import sys


def lazy_names(package: str, exports: dict):
    """(`__getattr__`, `__dir__`, `__all__`) for `package`, whose `exports` maps a submodule (relative name) to the
    names it provides."""
    where = {name: module for module, names in exports.items() for name in names}
    clash = sorted(set(where) & set(exports))
    if clash:  # importing the submodule sets the package attribute to the module, hiding the name for good
        raise ValueError(f"{package}: exported names {clash} are also submodule names")

    def getattr_(name):
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_():
        return sorted(set(vars(sys.modules[package])) | set(where))

    return getattr_, dir_, sorted(where)
