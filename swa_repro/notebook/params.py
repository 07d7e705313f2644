"""What ``swa-repro run --parameters`` may set: the names of each notebook's ``parameters`` cell,
each typed by its default, with a value the notebook can use.

Papermill only warns about a name the notebook lacks and injects any value as given, so a typo ran
every notebook (exit 0) and a wrong type failed one (exit 1). Here both are one line, exit 2, for
every selected notebook before any starts. Types come from the default literals (``ast``): int,
float, bool, str, dict, list of ... (a tuple default too); ``None`` or an expression takes anything.
A type is not enough where a notebook hands the value to code that takes only some values (a fix
name, a release, a case name): :data:`VALUES` checks those with the same code the notebook calls,
so ``fixes=bogus`` fails here, not half a minute into notebook 03.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.notebook.param_types import declared as declared_type

ANY = None
INT64 = (-2**63, 2**63 - 1)  # what numpy, and so every notebook, holds an int in
WORDS = {"True": True, "False": False, "None": None}  # Python's spellings, as the notebooks write them


def parse_value(name: str, text: str):
    """JSON when it parses (4, 1.5, true, [1,2], "s"), Python's True/False/None, else the text.
    Text that opens a list or an object but does not parse is refused: it was meant as one."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError, an int past Python's digit limit, deep nesting
        pass
    if text in WORDS:
        return WORDS[text]
    if text.lstrip()[:1] in ("[", "{"):
        raise UsageError(f"--parameters {name}={_short(text)} does not parse as JSON (a list is [1, 2]; "
                         "a string holding brackets goes in quotes: '\"[x]\"')")
    return text


def infer(default):
    """The type a default literal stands for: ANY, a type, or ``("list", element type)``."""
    if default is None:
        return ANY
    if isinstance(default, (list, tuple)):
        return ("list", _common([infer(x) for x in default]))
    return type(default)


def _common(types: list):
    kinds = set(types)
    if len(kinds) == 1:
        return kinds.pop()
    return float if kinds == {int, float} else ANY


def fits(value, kind) -> bool:
    """An int fits a float; a bool fits only a bool (JSON ``true`` is not the int 1)."""
    if kind is ANY:
        return True
    if isinstance(kind, tuple):
        return isinstance(value, list) and all(fits(x, kind[1]) for x in value)
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if kind is float else kind)


def describe(kind) -> str:
    if kind is ANY:
        return "any value"
    if isinstance(kind, tuple):
        return "a list" + ("" if kind[1] is ANY else f" of {describe(kind[1])}")
    return kind.__name__


def declared(source: str, where: str) -> dict:
    """``name -> kind`` of every top-level assignment of a parameters cell's ``source``."""
    try:
        body = ast.parse(source).body
    except SyntaxError as e:
        raise UsageError(f"--parameters: the parameters cell of {where} does not parse ({e.msg}, line {e.lineno})")
    out = {}
    for node in body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for t in getattr(node, "targets", [getattr(node, "target", None)]):
                if isinstance(t, ast.Name):
                    out[t.id] = _kind_of(node.value)
    return out


def _kind_of(node):
    try:
        return infer(ast.literal_eval(node))
    except ValueError:  # an expression: whatever it evaluates to
        return ANY


def notebook_parameters(path: Path) -> dict | None:
    """``name -> kind`` of the notebook's cell tagged ``parameters`` (None: it has none), read the way
    :func:`~swa_repro.notebook.runner.run_one` reads the notebook (jupytext); a percent-format ``.py``
    without jupytext's 2 s import (:func:`percent_parameters`: a notebook's own check cell calls this)."""
    found = percent_parameters(path) if Path(path).suffix == ".py" else None
    return found if found is not None else jupytext_parameters(path)


def jupytext_parameters(path: Path) -> dict | None:
    """:func:`notebook_parameters` as jupytext reads the notebook."""
    import jupytext

    for cell in jupytext.read(path).cells:
        if "parameters" in cell.metadata.get("tags", []):
            return declared(cell.source, path.stem)
    return None


_CELL = re.compile(r"^# %%(?P<rest>.*)$", re.MULTILINE)
_TAGS = re.compile(r"\btags=(\[[^\]]*\])")


def percent_parameters(path: Path) -> dict | None:
    """:func:`notebook_parameters` of a jupytext percent-format ``.py`` (``# %% tags=["parameters"]``
    opens the cell, the next ``# %%`` closes it) without importing jupytext: what a notebook's kernel
    calls (``artifacts.artifact_set``), where jupytext's import (nbformat, jsonschema's format
    checkers) took 2 s of CPU per run. None where no such cell is found: ask jupytext."""
    text = Path(path).read_text(encoding="utf-8")
    heads = list(_CELL.finditer(text))
    for head, nxt in zip(heads, heads[1:] + [None]):
        tags = _TAGS.search(head["rest"])
        if tags and not head["rest"].lstrip().startswith("[") and "parameters" in json.loads(tags[1]):
            return declared(text[head.end():nxt.start() if nxt else len(text)], Path(path).stem)
    return None


def _fixes(value) -> None:
    from swa_repro.sglang.fix import parse_names  # what notebooks 03/04 call (fix_view.load_release)

    try:
        parse_names(value)
    except UsageError as e:
        raise UsageError(str(e).removeprefix("--fix").lstrip(": ")) from None


def _release(value) -> None:
    from swa_repro.core.versions import SGLANG_MIN_RELEASE as MIN_RELEASE
    from swa_repro.core.versions import check_sglang_release as check_release
    from swa_repro.core.versions import sglang_release_key as parse

    try:
        version = parse(value)
    except UsageError:
        raise UsageError("not a release number (e.g. 0.5.23)") from None
    if version < MIN_RELEASE:
        raise UsageError(f"sglang {value} is older than {'.'.join(map(str, MIN_RELEASE))}, the oldest release "
                         "the notebooks drive")
    check_release(value, "sglang")  # in range but no release (0.5.15.post2): the install fails mid-notebook


def _matrix_names(value) -> None:
    from swa_repro.sglang.check import MATRIX  # imports torch: only when cases / failing_case are given

    names = {c.name for c in MATRIX}
    bad = [v for v in ([value] if isinstance(value, str) else value) if v not in names]
    if bad:
        raise UsageError(f"unknown case {', '.join(map(str, bad))}; choose from {', '.join(sorted(names))}")


def _backend(value) -> None:
    from swa_repro.core.case import BACKENDS

    if value not in BACKENDS:
        raise UsageError(f"unknown backend {value!r}; choose from {', '.join(BACKENDS)}")


# name -> check of its value (after its type), for every notebook that declares the name; each raises
# UsageError saying what to give. A name means the same in every notebook that has it.
VALUES = {"fixes": _fixes, "sglang_release": _release, "cases": _matrix_names, "failing_case": _matrix_names,
          "backend": _backend}


def _family_release(value) -> None:
    """Notebook 07: ``installed`` or a release the family audit covers (``families.RELEASES``)."""
    if value != "installed":
        _release(value)
        from swa_repro.sglang.families import check_release

        check_release(value)


def _model(value) -> None:
    """Notebook 07: a family (``families.FAMILIES``), or a checkpoint's ``config.json`` or the folder
    holding one, read now (``core.checkpoint_config``: it parses and names its architecture)."""
    from swa_repro.core import checkpoint_config as cc
    from swa_repro.engine.families import FAMILIES

    if value in FAMILIES:
        return
    if not cc.looks_like_path(value):
        raise UsageError(f"choose one of {', '.join(FAMILIES)}, or give a checkpoint's config.json or the folder "
                         "holding it")
    try:
        cc.read(value, "sglang", FAMILIES)
    except UsageError as e:
        raise UsageError(str(e).removeprefix("--model ")) from None


# (notebook, name) -> its own check, where one notebook takes other values under a shared name
NOTEBOOK_VALUES = {("07_my_model_my_gpu", "sglang_release"): _family_release, ("07_my_model_my_gpu", "model"): _model}


def check_parameters(params: dict, notebooks: list[Path], reserved=()) -> None:
    """Every ``--parameters`` name is in each notebook's parameters cell with a value of its type
    that the notebook can use (:data:`VALUES`)."""
    for name, value in params.items():
        _check_range(name, value)
    for path in notebooks if params else []:
        decl = notebook_parameters(path)
        if decl is None:
            raise UsageError(f"--parameters: notebook {path.stem} has no cell tagged parameters, so it takes none: "
                             "drop --parameters or name other notebooks")
        names = ", ".join(n for n in decl if n not in reserved)
        for name, value in params.items():
            if name not in decl:
                raise UsageError(f"--parameters {name}: notebook {path.stem} has no such parameter; its parameters: "
                                 f"{names}")
            spec = declared_type(path.stem, name)  # the declared type and range (param_types), else the default's
            if spec is not None and spec.problem(value):
                raise UsageError(f"--parameters {name}: notebook {path.stem} expects {spec.describe()}; got "
                                 f"{_short(json.dumps(value))} ({spec.problem(value)})")
            if spec is None and not fits(value, decl[name]):
                raise UsageError(f"--parameters {name}: notebook {path.stem} expects {describe(decl[name])}; got "
                                 f"{_short(json.dumps(value))} ({type(value).__name__}); its parameters: {names}")
    for name, value in params.items():
        checks = {NOTEBOOK_VALUES.get((p.stem, name), VALUES.get(name)) for p in notebooks} - {None}
        for check in sorted(checks, key=lambda c: c.__name__) if value is not None else ():
            try:
                check(value)
            except UsageError as e:
                raise UsageError(f"--parameters {name}={_short(json.dumps(value))}: {e}") from None


def _check_range(name: str, value) -> None:
    """Ints, also inside lists and objects, fit int64: past it numpy raises OverflowError mid-notebook."""
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for x in items:
        _check_range(name, x)
    if isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
        raise UsageError(f"--parameters {name}: {_short(str(value))} is outside int64 (-2**63..2**63-1)")


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."
