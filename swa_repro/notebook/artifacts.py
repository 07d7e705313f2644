"""Artifact sets: one run of a notebook writes one consistent set of files, which records the
parameters that produced it.

A set is one notebook's files in one folder:

* ``NN.params.json``, written first: the run's id, how it ran (``headless``: ``swa-repro run``;
  ``interactive``: anything else, e.g. a kernel in the lab), every parameter of the notebook's
  ``parameters`` cell with the value the run had, and the sha256 of each figure as it is saved;
* ``NN.mode.json`` and ``NN.checks.json``, each with the run's id;
* ``NN_*.png``, each listed in ``NN.params.json``;
* from ``swa-repro run`` also ``NN.ipynb`` and ``NN.html`` (papermill injected the run's id with the
  other parameters, so both show it) and the notebook's entry in ``summary.json``.

Where a set goes (:func:`artifact_set`, the first thing every notebook calls, imported from ``runner``): ``swa-repro run``
injects ``run_id`` and the set is its ``--output`` folder; a run without one (the lab) writes to
``<output_dir>/interactive/<notebook>-<hash of its parameters>/``, so it never touches a file of the
runner's set, and two cases never share a folder. :func:`problems` says what in a set does not belong
to its run; the runner fails a notebook whose set has any.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import secrets
import sys
import time
from pathlib import Path

from swa_repro.core.outputs import write_atomic
from swa_repro.notebook import places
from swa_repro.notebook.places import NOTEBOOKS_DIR, RESERVED, output_path

PARAMS_SUFFIX = ".params.json"
INTERACTIVE_DIR = "interactive"
RUN_ID = "run_id"  # the name `swa-repro run` injects the run's id as (papermill); no parameters cell has it
NOT_HASHED = ("output_dir",)  # where a set goes, not what it shows: not in an interactive folder's name
HEADLESS, INTERACTIVE = "headless", "interactive"

# This process's sets (a kernel runs one notebook): folder -> (notebook, run id). announce_mode,
# Checks and save_figure stamp what they write into a registered folder with its run's id.
_current: dict[str, tuple[str, str]] = {}


def new_run_id() -> str:
    """A run's id: when it started (UTC) and 6 random hex digits, e.g. ``20261205T061502Z-3f9a1c``."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def _key(folder) -> str:
    return str(Path(folder).resolve())


def params_path(folder, notebook: str) -> Path:
    return Path(folder) / f"{notebook}{PARAMS_SUFFIX}"


def _canonical(params: dict) -> str:
    return json.dumps(params, sort_keys=True, default=repr, separators=(",", ":"))


def digest(params: dict) -> str:
    """sha256 of the parameters but those in :data:`NOT_HASHED`, as canonical JSON."""
    return hashlib.sha256(_canonical({k: v for k, v in params.items() if k not in NOT_HASHED}).encode()).hexdigest()


def interactive_folder(base, notebook: str, params: dict) -> Path:
    """``<base>/interactive/<notebook>-<12 hex of digest(params)>``: one folder per case."""
    return Path(base) / INTERACTIVE_DIR / f"{notebook}-{digest(params)[:12]}"


def kernel_files(folder, notebook: str) -> list[Path]:
    """What a notebook's kernel writes into its set (the runner adds the .ipynb and .html)."""
    folder = Path(folder)
    return [params_path(folder, notebook), folder / f"{notebook}.mode.json", folder / f"{notebook}.checks.json",
            *sorted(folder.glob(f"{notebook}_*.png"))]


def _write(path: Path, rec: dict) -> None:
    write_atomic(path, (json.dumps(rec, indent=1, default=repr) + "\n").encode())


def start(folder, notebook: str, run_id: str, how: str, params: dict) -> dict:
    """Write ``NN.params.json`` of a new run and make ``folder`` this process's set of ``notebook``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rec = {"notebook": notebook, "run_id": run_id, "run": how,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "parameters": json.loads(json.dumps(params, default=repr)),
           "parameters_sha256": digest(params), "figures": {}}
    _write(params_path(folder, notebook), rec)
    _current[_key(folder)] = (notebook, run_id)
    return rec


def run_id_for(folder) -> str | None:
    """The id of this process's run writing into ``folder``, or None (no set started there)."""
    hit = _current.get(_key(folder))
    return hit[1] if hit else None


def read(folder, notebook: str) -> dict | None:
    """``NN.params.json`` of the set in ``folder``, or None (missing or not a JSON object)."""
    try:
        rec = json.loads(params_path(folder, notebook).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def add_files(folder, notebook: str, paths) -> None:
    """List ``paths`` (files in ``folder``) as this run's, each with its sha256."""
    rec = read(folder, notebook)
    if rec is None:
        return
    rec.setdefault("figures", {}).update({Path(p).name: _sha(Path(p)) for p in paths})
    _write(params_path(folder, notebook), rec)


def add_figure(path) -> None:
    """A figure just saved into a registered folder: listed in its set's ``NN.params.json``."""
    path = Path(path)
    hit = _current.get(_key(path.parent))
    if hit and path.name.startswith(f"{hit[0]}_"):
        add_files(path.parent, hit[0], [path])


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def problems(folder, notebook: str, run_id: str | None = None) -> list[str]:
    """What in ``notebook``'s set in ``folder`` is not from the run its ``NN.params.json`` records
    (and, with ``run_id``, from that run): [] for a consistent set."""
    folder = Path(folder)
    rec = read(folder, notebook)
    if rec is None:
        return [f"{notebook}{PARAMS_SUFFIX} is missing: the notebook did not call artifact_set"]
    rid, out = rec.get("run_id"), []
    if run_id is not None and rid != run_id:
        out.append(f"{notebook}{PARAMS_SUFFIX} is from run {rid}, not this run ({run_id})")
    for suffix, required in ((".mode.json", True), (".checks.json", False)):
        p = folder / f"{notebook}{suffix}"
        if not p.exists():
            if required:
                out.append(f"{p.name} is missing")
            continue
        got = (_load(p) or {}).get("run_id")
        if got != rid:
            out.append(f"{p.name} is from run {got}, not {rid}")
    listed = rec.get("figures") or {}
    on_disk = {p.name: p for p in folder.glob(f"{notebook}_*.png")}
    for name in sorted(set(on_disk) - set(listed)):
        out.append(f"{name} is not from run {rid}")
    for name in sorted(set(listed) - set(on_disk)):
        out.append(f"{name} of run {rid} is missing")
    for name in sorted(set(listed) & set(on_disk)):
        if _sha(on_disk[name]) != listed[name]:
            out.append(f"{name} changed since run {rid} saved it")
    ipynb = folder / f"{notebook}.ipynb"
    if ipynb.exists():
        injected = ((_load(ipynb) or {}).get("metadata", {}).get("papermill") or {}).get("parameters") or {}
        if injected.get(RUN_ID) != rid:
            out.append(f"{ipynb.name} is from run {injected.get(RUN_ID)}, not {rid}")
        params = rec.get("parameters") or {}
        for k, v in injected.items():
            if k != RUN_ID and params.get(k) != v:
                out.append(f"{ipynb.name} ran with {k}={v!r}, {notebook}{PARAMS_SUFFIX} says {params.get(k)!r}")
    html = folder / f"{notebook}.html"
    if html.exists() and (not rid or rid not in html.read_text(encoding="utf-8", errors="replace")):
        out.append(f"{html.name} is not from run {rid}")
    return out


# ----------------------------------------------------------------------------- reuse (make repro, nothing changed)
# What a notebook reads besides its code: the committed evidence and tables (one folder each).
DATA_DIRS = ("recordings", "docs/audit", "benchmarks")
PACKAGES = ("torch", "sglang", "flashinfer-python", "vllm")  # installed versions a notebook's answer follows


@functools.cache
def _tree_hash(root: Path, subdirs: tuple) -> str:
    """sha256 over the path and bytes of every file under ``root``'s ``subdirs`` (memoized per process:
    the tree does not change under one ``swa-repro run``)."""
    h = hashlib.sha256()
    for f in sorted(f for d in subdirs for f in (root / d).rglob("*") if f.is_file() and "__pycache__" not in f.parts):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _versions() -> dict:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def inputs_key(path, mode: str, params: dict) -> str:
    """What decides a headless run's set: the notebook's bytes, its parameters, the mode (asked and
    resolved), the package's code (``core.cache.code_hash`` over every layer), the committed data
    it reads (:data:`DATA_DIRS`) and the installed versions. Equal keys: the earlier set can be reused,
    as the audits reuse a cached cell (``runner.reusable``)."""
    from swa_repro.core.cache import PACKAGE, code_hash, key_of
    from swa_repro.core.mode import resolve_mode

    info = resolve_mode(mode)
    layers = tuple(sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
    return key_of({"notebook": hashlib.sha256(Path(path).read_bytes()).hexdigest(), "parameters": _canonical(params),
                   "mode": [mode, info.mode, info.reason], "code": code_hash(layers),
                   "data": _tree_hash(PACKAGE.parent.parent, DATA_DIRS), "versions": _versions()})


def reusable(path, out: Path, key: str) -> dict | None:
    """The last run's entry of this notebook in ``out/summary.json`` (marked ``reused``) when it
    passed with the same :func:`inputs_key` and its set is still whole
    and its own (``artifacts.problems``, the .ipynb and .html there); else None: run it. ``make
    repro`` with nothing changed then runs no notebook, as an audit reuses its cached cells."""
    try:
        last = json.loads((out / "summary.json").read_text())
        # a run in progress (``running``) keeps the run before it under ``earlier`` (notebook.run_summary)
        entry = next(r for r in last["notebooks"] + last.get("earlier", []) if r.get("notebook") == Path(path).stem)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):
        return None
    if entry.get("status") != "ok" or entry.get("inputs_key") != key:
        return None
    if not all(entry.get(k) and (out / entry[k]).is_file() for k in ("ipynb", "html")):
        return None
    return None if problems(out, Path(path).stem, entry.get("run_id")) else {**entry, "reused": True}


# ----------------------------------------------------------------------------- kernel side
def parameter_names(notebook: str) -> list[str]:
    """The names of ``notebook``'s ``parameters`` cell: of the copy the kernel runs (its cwd: the
    lab's scratch/ copy, or the folder ``swa-repro run`` ran it from), else of the repo's notebook."""
    from swa_repro.notebook.params import notebook_parameters, percent_parameters

    for path in (Path.cwd() / f"{notebook}.py", NOTEBOOKS_DIR / f"{notebook}.py"):
        if path.is_file():
            with contextlib.suppress(Exception):  # a cell that does not parse: its names are unknown
                names = percent_parameters(path)  # jupytext's reading, without its 2 s import
                names = notebook_parameters(path) if names is None else names
                if names is not None:
                    return list(names)
    return list(RESERVED)


def artifact_set(notebook: str, ns: dict) -> Path:
    """Where this run of ``notebook`` writes, after its ``NN.params.json`` (every parameter with the
    value in ``ns``, the notebook's ``globals()`` right after its parameters cell). Under ``swa-repro
    run`` (papermill injected ``run_id``): ``output_dir`` itself. Else (the lab):
    ``<output_dir>/interactive/<notebook>-<hash of the parameters>/``, its earlier files of this
    notebook removed first, so a set never mixes runs and the runner's set is never written. A bad
    parameter is a ``param_cell.ParameterError`` before anything is written."""
    from swa_repro.notebook import param_cell

    param_cell.check(notebook, ns)  # the check cell's, again: bad parameters never get a folder
    params = {k: ns[k] for k in parameter_names(notebook) if k in ns}
    base = output_path(ns.get("output_dir", "artifacts"))
    run_id, how = ns.get(RUN_ID), HEADLESS
    if run_id and (read(base, notebook) or {}).get("run_id") == run_id:
        run_id = None  # an executed .ipynb run again: its set is done, this run is another one
    if not run_id:
        run_id, how = new_run_id(), INTERACTIVE
        folder = interactive_folder(base, notebook, params)
        folder.mkdir(parents=True, exist_ok=True)
        for p in kernel_files(folder, notebook):
            p.unlink(missing_ok=True)
        print(f"Interactive run: files in {_shown(folder)} ({notebook}.params.json has the parameters); "
              f"{_shown(base)} itself is make repro's")
    else:
        folder = base
    start(folder, notebook, run_id, how, params)
    return folder


def _shown(p: Path) -> str:
    """``p`` relative to the repo root when under it (what a reader of the notebook can find)."""
    with contextlib.suppress(ValueError):
        return str(Path(p).resolve().relative_to(places.REPO_DIR.resolve()))
    return str(p)


class KnownRunId(logging.Filter):
    """papermill warns of a parameter the notebook's cell lacks: ``run_id`` never is in one (it is the
    runner's, injected on purpose); every other name was checked before any notebook started."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != f"Passed unknown parameter: {RUN_ID}"
