"""Module hygiene: modules use each other only through public names, never `jax._src`, and the modules import
each other without a cycle (function-level imports included).

The checker reads source with `ast` only (nothing is imported), so it sees imports inside functions too.
Each rule is also run on small synthetic sources that break it, so a checker that reports nothing fails.

Rules, for every module under jaxagent/ and experiments/:
  (a) `from <ours> import _x` (or `import <ours>._x`): a private name or module imported from one of ours;
  (b) `m._x` where `m` names one of our modules through an import (`import jaxagent.a as m`,
      `from jaxagent import a`, `import jaxagent` then `jaxagent.a._x`, `m = importlib.import_module("jaxagent.a")`),
      or `getattr` / `setattr` (`monkeypatch.setattr`) / `hasattr` / `delattr` of `m` with a private name;
  (c) `jax._src` reached in any way: `import jax._src...`, `from jax._src... import`, `from jax import _src`,
      `jax._src` as an attribute, `importlib.import_module("jax._src...")`;
  (d) a cycle in the import graph: an edge from a module to each of our modules it imports, wherever the
      import statement stands (module level or inside a function).
Tests (tests/test_<name>.py) follow (a)-(c), except that they may use the private names of the module <name>.
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
OURS = ("jaxagent", "experiments")


def is_private(name):
    """A single-underscore name (`_x`; a dunder such as `__version__` is public)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_ours(module):
    """Whether a dotted module name lies in one of the checked top-level packages."""
    return module.split(".")[0] in OURS


def is_jax_src(dotted):
    """Whether a dotted name is `jax._src` or lies under it."""
    return dotted == "jax._src" or dotted.startswith("jax._src.")


def module_sources(roots=OURS):
    """{dotted module name: (source text, is_package)} for every .py file under the given top-level folders."""
    out = {}
    for top in roots:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path.read_text(), is_pkg)
    return out


def resolve_from(node, module, is_pkg):
    """The absolute module an `ImportFrom` node reads from (relative levels resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def dotted_name(node):
    """(root Name id, [attributes...]) for a pure `a.b.c` expression, else (None, None)."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None, None
    return node.id, attrs[::-1]


def find_cycles(graph):
    """Cycles of a directed graph {node: set of successors}, one per back edge of a depth-first search.

    Each cycle is a list of nodes whose first and last entries are equal; nodes and successors are visited
    in sorted order so the report is deterministic."""
    state = {}                      # node -> 1 on the current DFS path, 2 finished
    path, cycles = [], []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def check_sources(sources, own=None):
    """Violations of rules (a)-(d) in `sources` ({module name: (source, is_package)}).

    own(module, target) -> bool: private names of `target` that `module` may use (a test of its own module);
    default none. Returns a sorted list of strings: "module:line: rule: detail", and "cycle: a -> b -> a" for
    rule (d)."""
    return scan_sources(sources, own)[0]


def scan_sources(sources, own=None):
    """(`check_sources`' violations, the import graph {module: set of our modules it imports})."""
    modules = set(sources)
    problems = []
    graph = {m: set() for m in sources}

    def known_prefix(name):
        """`name` if it is one of the given modules, else its longest prefix that is (None if none is)."""
        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in modules:
                return ".".join(parts[:n])
        return None

    def mine(module, target):
        return own is not None and target is not None and own(module, target)

    def add_edge(module, target):
        if target and target != module:
            graph[module].add(target)

    for module, (source, is_pkg) in sources.items():
        tree = ast.parse(source)
        bound = {}      # local name -> the dotted module it names (ours, or jax and its submodules)
        where = f"{module}:%d"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name
                    if is_jax_src(name):
                        problems.append(f"{where % node.lineno}: jax._src: import {name}")
                    if not (is_ours(name) or name == "jax" or name.startswith("jax.")):
                        continue
                    bound[alias.asname or name.split(".")[0]] = name if alias.asname else name.split(".")[0]
                    if is_ours(name):
                        if any(is_private(p) for p in name.split(".")) and not mine(module, known_prefix(name)):
                            problems.append(f"{where % node.lineno}: private import: import {name}")
                        add_edge(module, known_prefix(name))
            elif isinstance(node, ast.ImportFrom):
                src = resolve_from(node, module, is_pkg)
                if is_jax_src(src) or (src == "jax" and any(a.name == "_src" for a in node.names)):
                    problems.append(f"{where % node.lineno}: jax._src: from {src} import "
                                    f"{', '.join(a.name for a in node.names)}")
                if src == "jax" or src.startswith("jax."):
                    for alias in node.names:
                        bound[alias.asname or alias.name] = f"{src}.{alias.name}"
                    continue
                if not is_ours(src):
                    continue
                if any(is_private(p) for p in src.split(".")) and not mine(module, known_prefix(src)):
                    problems.append(f"{where % node.lineno}: private import: from {src} import ...")
                for alias in node.names:
                    if is_private(alias.name) and not mine(module, known_prefix(src)):
                        problems.append(f"{where % node.lineno}: private import: from {src} import {alias.name}")
                    full = f"{src}.{alias.name}"
                    if full in modules:
                        bound[alias.asname or alias.name] = full
                        add_edge(module, full)
                    else:
                        add_edge(module, known_prefix(src))
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                name = node.args[0].value
                if fn in ("import_module", "__import__") and is_jax_src(name):
                    problems.append(f"{where % node.lineno}: jax._src: {fn}({name!r})")
                if fn == "import_module" and is_ours(name):
                    if any(is_private(p) for p in name.split(".")) and not mine(module, known_prefix(name)):
                        problems.append(f"{where % node.lineno}: private import: import_module({name!r})")
                    add_edge(module, known_prefix(name))
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, ast.Call) and node.value.args \
                    and isinstance(node.value.args[0], ast.Constant) and isinstance(node.value.args[0].value, str):
                fn = node.value.func
                fn = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if fn == "import_module" and node.value.args[0].value in modules:
                    bound[node.targets[0].id] = node.value.args[0].value   # m = importlib.import_module("ours")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in bound and bound[node.args[0].id] in modules \
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                    and is_private(node.args[1].value):
                fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                # monkeypatch.setattr(m, "_x", ...) too
                if fn in ("getattr", "setattr", "hasattr", "delattr") and not mine(module, bound[node.args[0].id]):
                    problems.append(f"{where % node.lineno}: private attribute: {fn}({node.args[0].id}, "
                                    f"{node.args[1].value!r})")
            if not isinstance(node, ast.Attribute):
                continue
            root, attrs = dotted_name(node.value)
            if root not in bound:
                continue
            base = ".".join([bound[root]] + attrs)   # what the expression left of `.attr` names
            if is_jax_src(f"{base}.{node.attr}") and not is_jax_src(base):
                problems.append(f"{where % node.lineno}: jax._src: {root}.{'.'.join(attrs + [node.attr])}")
            elif base in modules and is_private(node.attr) and not mine(module, base):
                problems.append(f"{where % node.lineno}: private attribute: "
                                f"{'.'.join([root] + attrs + [node.attr])}")
    problems.extend(f"cycle: {' -> '.join(c)}" for c in find_cycles(graph))
    return sorted(set(problems)), graph


def synthetic(**modules):
    """Sources for the checker from keyword arguments: `pkg__mod="..."` is module `pkg.mod`."""
    return {name.replace("__", "."): (src, False) for name, src in modules.items()}


def test_checker_reports_private_import():
    got = check_sources(synthetic(jaxagent__a="def _f(): pass\n", jaxagent__b="from jaxagent.a import _f\n"))
    assert got == ["jaxagent.b:1: private import: from jaxagent.a import _f"]
    got = check_sources(synthetic(jaxagent__a="", experiments__x="def run():\n    from jaxagent.a import _g\n"))
    assert got == ["experiments.x:2: private import: from jaxagent.a import _g"]
    got = check_sources(synthetic(jaxagent___p="", jaxagent__b="import jaxagent._p\n"))
    assert got == ["jaxagent.b:1: private import: import jaxagent._p"]
    # public names, and private names of modules that are not ours, pass
    assert check_sources(synthetic(jaxagent__a="X = 1\n", jaxagent__b="from jaxagent.a import X\n"
                                   "from os import _exit\n")) == []


def test_checker_reports_private_attribute():
    src = {"jaxagent.a": ("", False), "jaxagent": ("", True),
           "jaxagent.b": ("from jaxagent import a\nimport jaxagent.a as aa\nimport jaxagent.a\n"
                          "def f(t):\n    a._x(1)\n    aa._y\n    jaxagent.a._z\n    t._replace(a=1)\n"
                          "    a.T._replace(b=2)\n", False)}
    assert check_sources(src) == ["jaxagent.b:5: private attribute: a._x", "jaxagent.b:6: private attribute: aa._y",
                                  "jaxagent.b:7: private attribute: jaxagent.a._z"]
    src["jaxagent.c"] = ("import importlib\nm = importlib.import_module('jaxagent.a')\nm._w()\n"
                         "def t(monkeypatch):\n    monkeypatch.setattr(m, '_v', 1)\n    getattr(m, 'ok')\n", False)
    assert check_sources(src)[-2:] == ["jaxagent.c:3: private attribute: m._w",
                                       "jaxagent.c:5: private attribute: setattr(m, '_v')"]


def test_checker_reports_jax_src():
    got = check_sources(synthetic(
        jaxagent__a="import jax\nimport jax._src.core\nfrom jax._src import core\nfrom jax import _src\n"
                    "def f():\n    return jax._src.config\n",
        jaxagent__b="import importlib\nimportlib.import_module('jax._src.mesh')\n"))
    assert got == ["jaxagent.a:2: jax._src: import jax._src.core", "jaxagent.a:3: jax._src: from jax._src import core",
                   "jaxagent.a:4: jax._src: from jax import _src", "jaxagent.a:6: jax._src: jax._src",
                   "jaxagent.b:2: jax._src: import_module('jax._src.mesh')"]
    clean = "import jax\nimport jax.numpy as jnp\njnp.ones(1)\njax.lax.scan\n"
    assert check_sources(synthetic(jaxagent__a=clean)) == []


def test_checker_reports_cycles():
    # a -> b at module level, b -> a inside a function: still a cycle
    got = check_sources(synthetic(jaxagent__a="from jaxagent import b\n",
                                  jaxagent__b="def f():\n    import jaxagent.a\n    return jaxagent.a\n"))
    assert got == ["cycle: jaxagent.a -> jaxagent.b -> jaxagent.a"]
    got = check_sources(synthetic(jaxagent__a="from jaxagent.b import x\n", jaxagent__b="from jaxagent.c import y\n",
                                  jaxagent__c="def g():\n    from jaxagent.a import z\n"))
    assert got == ["cycle: jaxagent.a -> jaxagent.b -> jaxagent.c -> jaxagent.a"]
    # relative imports resolve against the importing module's package
    src = {"jaxagent.p": ("from . import q\n", True), "jaxagent.p.q": ("from .r import f\n", False),
           "jaxagent.p.r": ("def f():\n    from .q import g\n", False)}
    assert check_sources(src) == ["cycle: jaxagent.p.q -> jaxagent.p.r -> jaxagent.p.q"]
    assert check_sources(synthetic(jaxagent__a="from jaxagent.b import x\n", jaxagent__b="import jax\n")) == []


def test_repository_is_clean():
    """Every module under jaxagent/ and experiments/ passes rules (a)-(d)."""
    sources = module_sources()
    assert len(sources) > 100                   # the walk found the package
    problems = check_sources(sources)
    assert problems == [], "\n".join(problems)


def own_module(module, target):
    """tests/test_<name>.py may use the private names of the module it tests (the one named <name>)."""
    return module.startswith("tests.test_") and target.rsplit(".", 1)[-1] == module[len("tests.test_"):]


def test_tests_use_public_names_of_other_modules():
    """Tests use private names only of the module they test, and never `jax._src` (this file's synthetic
    sources aside)."""
    sources = module_sources(OURS + ("tests",))
    del sources["tests.test_module_hygiene"]
    problems = [p for p in check_sources(sources, own=own_module) if p.startswith("tests.")]
    assert problems == [], "\n".join(problems)
    got = check_sources(synthetic(jaxagent__a="", tests__test_a="from jaxagent.a import _f\n",
                                  tests__test_b="from jaxagent.a import _f\n"), own=own_module)
    assert got == ["tests.test_b:1: private import: from jaxagent.a import _f"]


def reachable(graph, start):
    """Every module `start` imports, directly or through the modules it imports."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def imports_across(graph, importer, imported):
    """{module under `importer`: sorted modules under `imported` it reaches}, for the modules that reach one."""
    def under(module, package):
        return module == package or module.startswith(package + ".")
    out = {m: sorted(t for t in reachable(graph, m) if under(t, imported)) for m in graph if under(m, importer)}
    return {m: ts for m, ts in out.items() if ts}


def test_host_study_does_not_import_the_frozenlake_study():
    """The host-domain study stands on the shared core (`jaxagent.study.common`): no module of jaxagent.study.host
    reaches one of jaxagent.study.frozenlake, directly or through the modules it imports."""
    graph = scan_sources(module_sources())[1]
    assert sum(m.startswith("jaxagent.study.host.") for m in graph) > 10   # the walk found the host study
    assert imports_across(graph, "jaxagent.study.host", "jaxagent.study.frozenlake") == {}
    assert imports_across(graph, "jaxagent.study.host", "jaxagent.study.stages") == {}  # FrozenLake's stages
    # the check sees an import through a module in between
    src = synthetic(jaxagent__study__host__a="from jaxagent.study import b\n",
                    jaxagent__study__b="from jaxagent.study.frozenlake import c\n", jaxagent__study__frozenlake__c="")
    graph = scan_sources({**src, "jaxagent.study": ("", True), "jaxagent.study.frozenlake": ("", True)})[1]
    assert imports_across(graph, "jaxagent.study.host", "jaxagent.study.frozenlake") == {
        "jaxagent.study.host.a": ["jaxagent.study.frozenlake.c"]}
