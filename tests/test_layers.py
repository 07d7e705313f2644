"""The package's layers point one way: core <- kernel <- evidence <- engine <- {sglang, vllm} <- notebook <- cli.

Every module's imports (top-level and function-local, ``import x`` and ``from x import y``,
relative ones resolved) are read with ``ast``; a module may import its own layer and the layers
below it, never one above. sglang and vllm are siblings on the engine-neutral layer: neither
imports the other. Also: no module of ``swa_repro/`` is over 400 lines.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "swa_repro"
# layer -> what it may import of the package (itself included)
ALLOWED = {
    "core": {"core"},
    "kernel": {"core", "kernel"},
    "evidence": {"core", "kernel", "evidence"},
    "engine": {"core", "kernel", "evidence", "engine"},
    "sglang": {"core", "kernel", "evidence", "engine", "sglang"},  # never vllm
    "vllm": {"core", "kernel", "evidence", "engine", "vllm"},  # never sglang
    "notebook": {"core", "kernel", "evidence", "engine", "sglang", "vllm", "notebook"},
    "cli": {"core", "kernel", "evidence", "engine", "sglang", "vllm", "notebook", "cli"},
}
MAX_LINES = 400


def module_name(path: Path) -> str:
    """``swa_repro/kernel/model.py`` -> ``swa_repro.kernel.model`` (a package's ``__init__`` -> the package)."""
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str | None:
    """``swa_repro.<layer>...`` -> layer; ``swa_repro.cli`` -> cli; the bare package -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "swa_repro" else None


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``source``, however deeply nested."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                head = base[: len(base) - (node.level - 1)]
                target = ".".join(head + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from swa_repro import kernel` imports the layer, not just the package
            out += [(node.lineno, f"{target}.{a.name}" if target == "swa_repro" else target) for a in node.names]
    return out


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Imports of ``module`` that reach a layer above its own, as ``module:line imports target``."""
    own = layer_of(module)
    if own is None:
        return []
    bad = []
    for line, target in imported_modules(source, module, is_package):
        dep = layer_of(target)
        if dep in ALLOWED and dep not in ALLOWED[own]:  # not a layer: e.g. swa_repro.__version__
            bad.append(f"{module}:{line} imports {target} (layer {own} may import only {sorted(ALLOWED[own])})")
    return bad


def package_modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def test_every_module_is_in_a_known_layer():
    unknown = [module_name(p) for p in package_modules()
               if layer_of(module_name(p)) not in (None, *ALLOWED)]
    assert not unknown, f"modules outside the layers {sorted(ALLOWED)}: {unknown}"


def test_no_module_imports_a_higher_layer():
    bad = [v for p in package_modules()
           for v in violations(p.read_text(), module_name(p), p.name == "__init__.py")]
    assert not bad, "layer violations:\n" + "\n".join(bad)


@pytest.mark.parametrize("module, source, expect", [
    ("swa_repro.core.case", "from swa_repro.kernel.model import simulate\n", "swa_repro.kernel.model"),
    ("swa_repro.kernel.model", "def f():\n    import swa_repro.notebook.plots\n", "swa_repro.notebook.plots"),
    ("swa_repro.evidence.cases", "def f():\n    from ..sglang import audit\n", "swa_repro.sglang"),
    ("swa_repro.sglang.check", "from swa_repro import notebook\n", "swa_repro.notebook"),
    ("swa_repro.notebook.story", "from swa_repro.cli import main\n", "swa_repro.cli"),
    ("swa_repro.engine.child", "from swa_repro.sglang import provision\n", "swa_repro.sglang"),
    ("swa_repro.vllm.audit.drive", "from swa_repro.sglang.audit.env import CpuTorch\n", "swa_repro.sglang.audit.env"),
    ("swa_repro.sglang.audit.cli", "def f():\n    from swa_repro.vllm import cli\n", "swa_repro.vllm"),
])
def test_checker_catches_a_synthetic_violation(module, source, expect):
    """The checker is not vacuous: a planted upward import (top-level, function-local, relative,
    ``from swa_repro import <layer>``) is reported with the module, line and import."""
    (v,) = violations(source, module)
    assert v.startswith(f"{module}:") and f"imports {expect}" in v


def test_checker_allows_imports_downward_and_outside():
    src = ("import numpy\nfrom swa_repro.core.case import Case\nfrom swa_repro.kernel import model\n"
           "def f():\n    from swa_repro.evidence.recordings import load_recordings\n")
    assert violations(src, "swa_repro.sglang.check") == []


def test_the_engines_are_siblings():
    """Neither engine's package imports the other's (issue #39: vLLM sat on top of sglang through 23
    imports); what both need is the engine layer's. Read off every import, function-local ones too."""
    crossing = [f"{module_name(p)}:{line} imports {target}" for p in package_modules()
                if layer_of(module_name(p)) in ("sglang", "vllm")
                for line, target in imported_modules(p.read_text(), module_name(p), p.name == "__init__.py")
                if {layer_of(module_name(p)), layer_of(target)} == {"sglang", "vllm"}]
    assert not crossing, "sglang and vllm import each other:\n" + "\n".join(crossing)


def test_no_module_over_400_lines():
    long = {module_name(p): n for p in package_modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def _import_graph(top_level_only: bool) -> dict[str, set[str]]:
    """module -> the package modules it imports (``from pkg import mod`` resolved to ``pkg.mod``)."""
    paths = {module_name(p): p for p in package_modules()}
    graph = {}
    for mod, path in paths.items():
        tree = ast.parse(path.read_text())
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        deps = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                head = base[: len(base) - (node.level - 1)] if node.level else []
                target = ".".join(head + ([node.module] if node.module else []))
                deps |= {f"{target}.{a.name}" if f"{target}.{a.name}" in paths else target for a in node.names}
        graph[mod] = {d for d in deps if d in paths and d != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, once each (depth-first search, the cycle from its smallest module)."""
    found, state = set(), {}

    def visit(mod, stack):
        state[mod] = 1
        stack.append(mod)
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                cyc = stack[stack.index(dep):]
                i = cyc.index(min(cyc))
                found.add(tuple(cyc[i:] + cyc[:i]))
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])
    return [list(c) for c in sorted(found)]


def test_no_import_cycle_at_import_time():
    """Module-level imports form no cycle: a cycle there makes import order decide what exists."""
    assert _cycles(_import_graph(top_level_only=True)) == []


@pytest.mark.parametrize("layer", ["core", "kernel", "evidence"])
def test_no_import_cycle_even_through_function_level_imports(layer):
    """In the lower layers not even a deferred import closes a cycle (issue 17 found
    evidence.bundle <-> evidence.sglang_bundle)."""
    graph = _import_graph(top_level_only=False)
    sub = {m: {d for d in deps if layer_of(d) == layer} for m, deps in graph.items() if layer_of(m) == layer}
    assert _cycles(sub) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# ----------------------------------------------------------------------------- the suite's own collection
# (matplotlib is not among them: swa_repro.notebook.plots imports it, and test_plots needs that at collection)
HEAVY_AT_COLLECTION = {"sglang", "jupytext", "jupyterlab", "nbformat", "PIL", "transformers"}


def collection_imports(source: str) -> set[str]:
    """Top-level packages of ``HEAVY_AT_COLLECTION`` a test module imports at module level: by an
    import statement, or by ``pytest.importorskip`` (which imports). Each xdist worker collects
    every file, so these cost every worker their import time (issue #24: 12.7 s -> 3.3 s of
    collection); ``conftest.skip_module_unless`` skips without importing."""
    got = set()
    for node in ast.parse(source).body:
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):  # run at collection
            for call in ast.walk(node):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "importorskip" and call.args and isinstance(call.args[0], ast.Constant)):
                    names.append(call.args[0].value)
        got |= {n.split(".")[0] for n in names} & HEAVY_AT_COLLECTION
    return got


def test_no_test_module_imports_a_heavy_package_at_collection():
    tests = Path(__file__).resolve().parent
    bad = {p.name: sorted(got) for p in sorted(tests.glob("test_*.py")) if (got := collection_imports(p.read_text()))}
    assert not bad, bad


@pytest.mark.parametrize("source, expect", [
    ("import pytest\nsglang = pytest.importorskip('sglang')\n", {"sglang"}),
    ("from PIL import Image\n", {"PIL"}),
    ("def f():\n    import jupytext\n", set()),
    ("def f():\n    pytest.importorskip('sglang')\n", set()),
    ("skip_module_unless('sglang')\nimport numpy\n", set())])
def test_collection_import_checker(source, expect):
    assert collection_imports(source) == expect


# ----------------------------------------------------------------------------- issue #39: no cycle, no private name across packages
def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, each sorted, smallest first:
    every module of a component reaches every other, so each is one knot to untie, however many
    of its cycles a depth-first walk would list."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycle():
    """No import cycle in swa_repro, function-local imports counted as module-level ones: a deferred
    import only hides a knot (issue #39 found five); each knot is named by its modules."""
    knots = _strongly_connected(_import_graph(top_level_only=False))
    assert not knots, "import cycles (break each by idea: what both need, below both):\n" + "\n".join(
        " <-> ".join(m.removeprefix("swa_repro.") for m in k) for k in knots)


def test_the_knot_finder_names_each_knot_once():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert _strongly_connected(graph) == [["a", "b", "c"], ["d", "e"]]
    assert _strongly_connected({"a": {"b"}, "b": set()}) == []


def package_of(module: str, is_package: bool = False) -> str:
    """The directory a module is in (a package's ``__init__``: the package itself)."""
    return module if is_package else module.rsplit(".", 1)[0]


def private_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str, str]]:
    """``(line, absolute module, name)`` of every ``from swa_repro.X import _name`` in ``source``
    (relative ones resolved as :func:`imported_modules` does), however deeply nested."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            target = imported_modules(ast.unparse(node), module, is_package)[0][1]
            if target.startswith("swa_repro"):
                out += [(node.lineno, target, a.name) for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def private_across_packages(source: str, module: str, is_package: bool = False) -> list[tuple[str, str]]:
    """``(module:line imports target._name, (module, name))`` of each private name ``module`` takes
    from a module of another package (directory); its own package's modules may share one."""
    paths = {module_name(p): p for p in package_modules()}
    own, bad = package_of(module, is_package), []
    for line, target, name in private_imports(source, module, is_package):
        if f"{target}.{name}" in paths:  # `from pkg import _module`: the module is the package's own
            continue
        theirs = package_of(target, target in paths and paths[target].name == "__init__.py")
        if theirs != own:
            bad.append((f"{module}:{line} imports {target}.{name}", (module, name)))
    return bad


def test_no_private_name_across_packages():
    """A ``_name`` is its package's own: a module of another directory that needs it needs a public
    name for a shared thing (or the idea moved to where both read it), named file:line here."""
    bad = [text for p in package_modules()
           for text, _pair in private_across_packages(p.read_text(), module_name(p), p.name == "__init__.py")]
    assert not bad, "private names imported across packages (make them public or move them):\n" + "\n".join(bad)


@pytest.mark.parametrize("module, source, expect", [
    ("swa_repro.vllm.audit.drive", "from swa_repro.sglang.audit.env import _CpuTorch\n",
     ["swa_repro.sglang.audit.env._CpuTorch"]),
    ("swa_repro.sglang.audit.live", "def f():\n    from ..trace import _first_tensor\n",
     ["swa_repro.sglang.trace._first_tensor"]),
    ("swa_repro.sglang.audit.live", "from swa_repro.sglang.audit.keys import _x\n", []),  # its own package
    ("swa_repro.sglang.audit.live", "from .keys import _x, y\n", []),
    ("swa_repro.sglang.audit.live", "from swa_repro.sglang.trace import first_tensor\n", []),
    ("swa_repro.notebook.runner", "from swa_repro.notebook.params import __doc__\n", [])])
def test_private_checker_catches_a_planted_import(module, source, expect):
    got = [text.split(" imports ")[1] for text, _ in private_across_packages(source, module)]
    assert got == expect


# ----------------------------------------------------------------------------- each name from where it lives
ROOT = PKG.parent
READERS = ("swa_repro", "tests", "notebooks", "benchmarks", "scripts")  # every file that imports the package


def module_path(module: str) -> Path | None:
    """The file of a module of the package (a package: its ``__init__``), None for anything else."""
    base = ROOT.joinpath(*module.split("."))
    for p in (base / "__init__.py", base.with_suffix(".py")):
        if p.is_file():
            return p
    return None


def own_names(source: str) -> set[str]:
    """The names a module binds itself (``def``, ``class``, an assignment, under ``if``/``try`` too),
    not the ones it only imports: what others may import from it."""
    names, todo = set(), list(ast.parse(source).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.ExceptHandler)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *getattr(node, "handlers", [])]
    return names


def imported_names(source: str, module: str) -> set[str]:
    """The names a module's top level binds by importing them (its own submodules aside)."""
    tree = ast.parse(source)
    return {a.asname or a.name.split(".")[0] for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            for a in node.names if getattr(node, "module", None) != module}


@functools.cache
def lives_in(module: str, name: str) -> bool:
    """``name`` is defined in ``module`` or is its submodule (``__dunder__``s are every module's); a
    package that imports a name over its submodule's (``patch.classify``, the function) re-exports it."""
    path = module_path(module)
    if name.startswith("__") or path is None or name in own_names(path.read_text()):
        return True
    if name in imported_names(path.read_text(), module):
        return False
    return module_path(f"{module}.{name}") is not None


def scope_nodes(scope: ast.AST):
    """The nodes of one scope (a module or a function), not those of the functions defined in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += ast.iter_child_nodes(node)


def borrowed_names(source: str, where: str = "<source>") -> list[str]:
    """``where:line module.name`` of each name ``source`` takes from a module of the package that only
    imports it (a re-export): ``from swa_repro.X import name``, and ``alias.name`` of a module
    imported as ``alias`` (``from swa_repro.X import module [as alias]``, ``import swa_repro.X as
    alias``) where that alias is in scope (a function's own import, argument or variable hides it)."""
    bad = []

    def visit(scope: ast.AST, outer: dict[str, str]) -> None:
        aliases, local = dict(outer), set()
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local |= {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}
        nested = []
        for node in scope_nodes(scope):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("swa_repro"):
                for a in node.names:
                    if module_path(f"{node.module}.{a.name}"):
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                    elif not lives_in(node.module, a.name):
                        bad.append(f"{where}:{node.lineno} {node.module}.{a.name}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    name = a.asname or a.name.split(".")[0]
                    if isinstance(node, ast.Import) and a.asname and module_path(a.name):
                        aliases[name] = a.name
                    else:
                        local.add(name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                local.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                nested.append(node)
        aliases = {k: v for k, v in aliases.items() if k not in local or k not in outer or v != outer[k]}
        for node in scope_nodes(scope):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and not lives_in(aliases[node.value.id], node.attr)):
                bad.append(f"{where}:{node.lineno} {aliases[node.value.id]}.{node.attr}")
        for fn in nested:
            visit(fn, aliases)

    visit(ast.parse(source), {})
    return bad


def test_every_name_is_imported_from_where_it_lives():
    """No compatibility re-exports: a caller names the module that defines what it uses, so a reader
    (or ``grep``) finds it in one step and a move breaks the callers here, not at run time."""
    files = sorted(p for d in READERS for p in (ROOT / d).rglob("*.py"))
    bad = [b for p in files for b in borrowed_names(p.read_text(), str(p.relative_to(ROOT)))]
    assert not bad, "names imported from a module that only re-exports them (import from where they live):\n" + \
        "\n".join(bad)


@pytest.mark.parametrize("source, expect", [
    ("from swa_repro.notebook.runner import run_one\n", []),
    ("from swa_repro.notebook.runner import Path\n", ["swa_repro.notebook.runner.Path"]),  # runner imports it
    ("from swa_repro.notebook import runner\nrunner.Path\nrunner.run_one\n", ["swa_repro.notebook.runner.Path"]),
    ("import swa_repro.notebook.runner as r\nr.json\nr.run_one\n", ["swa_repro.notebook.runner.json"]),
    ("def f():\n    import swa_repro.notebook.runner as r\n    return r.Path\n", ["swa_repro.notebook.runner.Path"]),
    ("def f():\n    from swa_repro.core import errors\n", []),  # a submodule
    ("from swa_repro.notebook import runner\ndef f(runner):\n    return runner.Path\n", []),  # an argument hides it
    ("from swa_repro.notebook import runner\ndef f():\n    from x import y as runner\n    return runner.Path\n", []),
    ("from swa_repro.core.errors import __doc__\n", [])])
def test_borrowed_names_finds_a_planted_re_export(source, expect):
    assert [b.split(" ")[1] for b in borrowed_names(source)] == expect
