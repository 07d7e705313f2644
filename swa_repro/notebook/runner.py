"""``swa-repro run``: execute the investigation notebooks headless and collect what they show.

For each ``notebooks/NN_*.py`` (jupytext percent format): convert to ``.ipynb`` in a temp dir, run
it with papermill (parameters ``mode``, ``output_dir`` and any ``--parameters``) on this
interpreter's own kernel, and write ``DIR/<name>.ipynb`` (also when it fails: papermill saves after
every cell), ``DIR/<name>.html``, and ``DIR/summary.json``. Notebooks save their own figures
(``plots.publish(fig, name, figure_saver(output_dir))``) and say their mode (``announce_mode``);
the runner reads both back. Each run of a notebook is one artifact set (``notebook.artifacts``): the
runner injects a ``run_id``, the notebook records its parameters with it (``artifact_set``), and a
set with a file of another run fails the notebook; a run without ``run_id`` (the lab) writes its own
set under ``<output_dir>/interactive/``, never into the runner's; unchanged inputs reuse a set (``artifacts.reusable``).

Imports of papermill/jupytext/nbconvert stay inside functions: the kernel side of a notebook
imports ``announce_mode``/``save_figure`` from here and needs none of them.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from swa_repro.core.cache import cache_root
from swa_repro.core.errors import UsageError, check_bounds
from swa_repro.core.mode import MODES, ModeInfo, resolve_mode
from swa_repro.core.outputs import atomic_path, nonempty, untracked_dir, write_atomic
from swa_repro.notebook import artifacts, run_summary, show
from swa_repro.notebook.checks import read_checks
from swa_repro.notebook.params import check_parameters, parse_value
from swa_repro.notebook.places import NOTEBOOKS_DIR, RESERVED

NOTEBOOK_RE = re.compile(r"^\d\d_[A-Za-z0-9_]+\.py$")
KERNEL_NAME = "swa-repro"
MAX_CELL_TIMEOUT = 86400
MAX_JOBS = 64


# ---------------------------------------------------------------- kernel side (used in notebooks)
def one_line_usage_errors() -> bool:
    """In an IPython kernel: a ``UsageError`` (a bad parameter, an unknown fix name) ends the cell
    with its one line, as the CLI prints it, not a traceback; the cell still fails (Run All and
    papermill stop there). False outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None:
        return False

    def one_line(shell, etype, value, tb, tb_offset=None):
        msg = f"{etype.__name__}: {value}".splitlines()[0]
        print(msg, file=sys.stderr)
        return [msg]

    ip.set_custom_exc((UsageError,), one_line)
    return True


# Third-party warnings a reader of a notebook cannot act on (measured in 03/04's outputs): tqdm's
# "IProgress not found" (no ipywidgets in a headless kernel), and sglang's import-time platform
# notes on a machine without CUDA ("Triton is not supported on current platform", "Only CUDA, HIP
# and XPU support AWQ currently", the same for GGUF). Every one is a warnings.warn.
QUIET = ((r"IProgress not found", r""), (r"", r"sglang(\.|$)"))


def quiet_third_party() -> None:
    """Ignore the :data:`QUIET` warnings in this process (a notebook kernel) from now on."""
    import warnings

    for message, module in QUIET:
        warnings.filterwarnings("ignore", message=message, module=module)


def announce_mode(requested: str, output_dir, notebook: str) -> ModeInfo:
    """Resolve and print the mode (first output of every notebook) and record it for the runner.
    From here on a ``UsageError`` is one line (:func:`one_line_usage_errors`) and third-party
    warnings no reader can act on are not shown (:func:`quiet_third_party`)."""
    one_line_usage_errors()
    quiet_third_party()
    show.notebook_display()  # pandas: every row and whole cells; long cells wrap
    info = resolve_mode(requested)
    print(f"Mode: {info.mode} ({info.reason})")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rec = {"notebook": notebook, "requested": requested, "python": sys.executable, **info.to_dict(),
           "run_id": artifacts.run_id_for(out)}
    write_atomic(out / f"{notebook}.mode.json", (json.dumps(rec, indent=1, default=str) + "\n").encode())
    return info


def save_figure(fig, name: str, output_dir) -> Path:
    """Save ``fig`` as ``DIR/<name>.png``; ``name`` is ``<notebook>_<what>`` so the runner finds it.
    The figure stays open, so the inline backend still shows it in the notebook and its HTML."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"figure name must be a plain file stem like '02_masks_and_cta_skips_tiles'; got {name!r}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    from swa_repro.notebook.plots import FIGURE_DPI  # the dpi plot_case's cells are sized for

    # A constrained-layout figure already fits its labels and legends: "tight" would only cost a
    # second full draw (~30% of a plot_case save).
    tight = {} if fig.get_layout_engine() is not None else {"bbox_inches": "tight"}
    with atomic_path(path) as tmp:  # never through a link (core.outputs)
        fig.savefig(tmp, dpi=FIGURE_DPI, format="png", **tight)
    artifacts.add_figure(path)  # listed, with its sha256, in this run's NN.params.json
    return path


def figure_saver(output_dir):
    """``save(fig, name) -> path`` into ``output_dir``: what ``plots.publish`` takes."""
    return functools.partial(save_figure, output_dir=output_dir)


# ---------------------------------------------------------------- runner side
def available_notebooks(nb_dir: Path) -> list[Path]:
    return sorted(p for p in Path(nb_dir).glob("*.py") if NOTEBOOK_RE.match(p.name))


def select_notebooks(names: list[str], nb_dir: Path) -> list[Path]:
    """Names may be the stem, the file name, or the NN prefix; unknown names are a UsageError."""

    avail = available_notebooks(nb_dir)
    if not avail:
        raise UsageError(f"no notebooks (NN_name.py) found in {nb_dir}")
    if not names:
        return avail
    picked = []
    for n in names:
        stem = Path(n).name.removesuffix(".py").removesuffix(".ipynb")
        hits = [p for p in avail if p.stem == stem] or [p for p in avail if p.stem.split("_", 1)[0] == stem]
        if len(hits) != 1:
            raise UsageError(f"unknown notebook {n!r}: choose from {', '.join(p.stem for p in avail)}")
        if hits[0] not in picked:
            picked.append(hits[0])
    return picked


def parse_parameters(items: list[str]) -> dict:
    """``k=v`` -> {k: v}; v as :func:`~swa_repro.notebook.params.parse_value` reads it (JSON, True/False/None,
    else the string)."""

    params = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k.isidentifier():
            raise UsageError(f"--parameters takes name=value pairs; got {it!r} "
                             "(put NOTEBOOK names before --parameters)")
        if k in RESERVED:
            raise UsageError(f"set {k} with --{k.replace('_dir', '')}, not --parameters")
        if k in params:  # the last one silently won
            raise UsageError(f"--parameters {k} is given twice; give it once")
        params[k] = parse_value(k, v)
    return params


def ensure_kernel() -> str:
    """Install a kernelspec that runs *this* interpreter into ``sys.prefix`` (the venv), never into
    the user's home, so papermill cannot pick up some other ``python3`` kernel. Falls back to a
    temp dir put first on ``JUPYTER_PATH`` when the prefix is read-only."""
    # log_level=ERROR: ipykernel 7 warns on every start that localhost TCP is unencrypted (noise here).
    spec = {"argv": [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}",
                     "--IPKernelApp.log_level=ERROR"],
            "display_name": f"swa-repro ({Path(sys.prefix).name} python {sys.version.split()[0]})",
            "language": "python", "metadata": {"debugger": True}}
    text = json.dumps(spec, indent=1) + "\n"
    for base in (Path(sys.prefix) / "share" / "jupyter", None):
        if base is None:
            base = Path(tempfile.mkdtemp(prefix="swa-repro-jupyter-"))
            os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(base), os.environ.get("JUPYTER_PATH")]))
        kfile = base / "kernels" / KERNEL_NAME / "kernel.json"
        try:
            if not kfile.exists() or kfile.read_text() != text:
                kfile.parent.mkdir(parents=True, exist_ok=True)
                kfile.write_text(text)
            return KERNEL_NAME
        except OSError:
            continue
    raise RuntimeError("could not write a kernelspec")  # unreachable: the temp dir is writable


def _clear_outputs(out: Path, name: str) -> None:
    """Results of an earlier run of this notebook must not be read back as this run's."""
    for p in [out / f"{name}{s}" for s in (".ipynb", ".html", ".mode.json", ".checks.json", artifacts.PARAMS_SUFFIX)] + \
            list(out.glob(f"{name}_*.png")):
        p.unlink(missing_ok=True)


def _error_text(e: Exception) -> str:
    ename, evalue = getattr(e, "ename", None), getattr(e, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(e).__name__}: {e}"
    return re.sub(r"\x1b\[[0-9;]*m", "", text).strip()[:2000]


def _nbconvert_data_path() -> None:
    """With ``pip install --target DIR`` (the offline notebook bundle) nbconvert's templates land in
    ``DIR/share/jupyter``, which jupyter_core does not search: add it to JUPYTER_PATH."""
    import nbconvert

    share = Path(nbconvert.__file__).resolve().parents[1] / "share" / "jupyter"
    paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    if (share / "nbconvert" / "templates").is_dir() and str(share) not in paths:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([*paths, str(share)])


def run_one(path: Path, out: Path, mode: str, params: dict, kernel: str, cell_timeout: int | None) -> dict:
    key = artifacts.inputs_key(path, mode, params)
    if (last := artifacts.reusable(path, out, key)) is not None:
        return last
    import jupytext
    import papermill as pm
    from nbconvert import HTMLExporter

    from swa_repro.notebook.lean import link_notebook_images

    pm_log = logging.getLogger("papermill")
    if not any(isinstance(f, artifacts.KnownRunId) for f in pm_log.filters):
        pm_log.addFilter(artifacts.KnownRunId())

    _nbconvert_data_path()
    name = path.stem
    _clear_outputs(out, name)
    ipynb, html = out / f"{name}.ipynb", out / f"{name}.html"
    t0, error, run_id = time.perf_counter(), None, artifacts.new_run_id()
    with tempfile.TemporaryDirectory(prefix="swa-repro-nb-") as tmp:
        src = Path(tmp) / f"{name}.ipynb"
        nb = jupytext.read(path)
        nb.metadata["kernelspec"] = {"name": kernel, "language": "python", "display_name": kernel}
        jupytext.write(nb, src)
        try:
            injected = {"mode": mode, "output_dir": str(out), **params, artifacts.RUN_ID: run_id}
            pm.execute_notebook(str(src), str(ipynb), parameters=injected,
                                kernel_name=kernel, language="python", cwd=str(path.parent), progress_bar=False,
                                log_output=False, start_timeout=120, execution_timeout=cell_timeout)
        except Exception as e:  # PapermillExecutionError, kernel death, timeout: the notebook failed
            error = _error_text(e)
    if ipynb.exists():
        try:  # each figure once, as the PNG beside the notebook, linked from the .ipynb and the .html
            link_notebook_images(ipynb)
            # images the notebook showed but did not save (linked as NN_outCC_K.png): this run's too,
            # as every NN_*.png here is (_clear_outputs removed the earlier ones)
            listed = (artifacts.read(out, name) or {}).get("figures") or {}
            artifacts.add_files(out, name, [p for p in out.glob(f"{name}_*.png") if p.name not in listed])
        except Exception as e:
            error = error or f"linking the figures failed: {_error_text(e)}"
        try:
            write_atomic(html, HTMLExporter().from_filename(str(ipynb))[0].encode("utf-8"))
        except Exception as e:
            error = error or f"HTML export failed: {_error_text(e)}"
    seconds = time.perf_counter() - t0
    rec_path = out / f"{name}.mode.json"
    rec = json.loads(rec_path.read_text()) if rec_path.exists() else None
    checks = read_checks(out, name)
    record = artifacts.read(out, name)
    if error is None and record is None:
        error = ("the notebook did not record its parameters: call "
                 "output_dir = swa_repro.notebook.runner.artifact_set(name, globals()) after its parameters cell")
    if error is None and rec is None:
        error = "the notebook did not record its mode: call swa_repro.notebook.runner.announce_mode(mode, output_dir, name)"
    if error is None and (bad := artifacts.problems(out, name, run_id)):
        error = f"its artifact set mixes runs: {'; '.join(bad[:5])}"
    if error is None and checks and checks["failed"]:
        error = f"{checks['failed']} checks failed"
    return {
        "notebook": name,
        "status": "failed" if error else "ok",
        "mode": rec and rec["mode"], "mode_reason": rec and rec["reason"],
        "checks_passed": checks and checks["passed"], "checks_failed": checks and checks["failed"],
        "seconds": round(seconds, 2), "error": error,
        "kernel_python": rec and rec.get("python"),
        "run_id": run_id, "parameters": record and record.get("parameters"),
        "params": artifacts.params_path(out, name).name if record else None,
        "ipynb": ipynb.name if ipynb.exists() else None, "html": html.name if html.exists() else None,
        "figures": sorted(p.name for p in out.glob(f"{name}_*.png")), "inputs_key": key,
    }


def default_jobs() -> int:
    """Notebooks run at once: each kernel is one busy process, so at most the cores, and 2 at most
    (more kernels on a small machine only fight over memory bandwidth and imports)."""
    return max(1, min(2, os.cpu_count() or 1))


def run_all(paths: list[Path], out: Path, mode: str, params: dict, kernel: str, cell_timeout, jobs: int,
            order: list[int], done: dict) -> list[dict]:
    """:func:`run_one` for each notebook, ``jobs`` at a time (each in its own kernel process; the
    notebooks share nothing but ``out``, where each writes only ``<its name>*``), started in ``order``.
    Results in the order of ``paths`` whatever the finishing order, each also put in ``done`` as it
    ends (what a Ctrl-C keeps); one progress line per notebook as it ends."""
    n = len(paths)
    if jobs <= 1:
        for i, path in enumerate(paths, 1):
            print(f"[{i}/{n}] {path.stem:<44}", end=" ", flush=True)
            r = done[path.stem] = run_one(path, out, mode, params, kernel, cell_timeout)
            print(run_summary.progress(r), flush=True)
        return [done[p.stem] for p in paths]
    import concurrent.futures as cf

    import jupytext  # noqa: F401  (imported once here, not raced by the worker threads)
    import nbconvert  # noqa: F401
    import papermill  # noqa: F401

    _nbconvert_data_path()
    pool = cf.ThreadPoolExecutor(jobs)  # threads: the work is in the kernels, papermill only waits
    try:
        futs = {pool.submit(run_one, paths[i], out, mode, params, kernel, cell_timeout): i for i in order}
        for k, fut in enumerate(cf.as_completed(futs), 1):
            r = fut.result()
            done[r["notebook"]] = r
            print(f"[{k}/{n}] {r['notebook']:<44} {run_summary.progress(r)}", flush=True)
    except KeyboardInterrupt:  # no notebook starts after Ctrl-C, and the running ones' kernels end
        pool.shutdown(wait=False, cancel_futures=True)
        run_summary.stop_kernels()
        raise
    pool.shutdown()
    return [done[p.stem] for p in paths]


def register(sub) -> None:
    p = sub.add_parser("run", help="run the notebooks headless (papermill) -> .ipynb, .html, PNGs, summary.json")
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                   help="names, stems or NN prefixes (default: all, in order)")
    p.add_argument("--mode", choices=MODES, default="auto",
                   help="live = real kernels on CUDA; model = CPU model + recordings; auto = live iff usable")
    p.add_argument("--output", type=nonempty, default="artifacts", help="output directory (default: artifacts)")
    p.add_argument("--parameters", "-p", nargs="+", action="extend", default=[], metavar="K=V",
                   help="names from each notebook's parameters cell, values of its defaults' types; JSON or "
                        "True/False/None when they parse, else a string")
    p.add_argument("--notebooks-dir", default=str(NOTEBOOKS_DIR),
                   help="where the NN_*.py notebooks are (default: the repo's notebooks/)")
    p.add_argument("--cell-timeout", type=int, default=1800,
                   help=f"seconds one cell may run (default 1800, at most {MAX_CELL_TIMEOUT})")
    p.add_argument("--jobs", "-j", type=int, default=default_jobs(),
                   help=f"notebooks run at once, each in its own kernel (default {default_jobs()}: min(2, cores); "
                        f"at most {MAX_JOBS})")
    p.add_argument("--list", action="store_true", help="list the notebooks and exit")
    p.add_argument("--force", action="store_true", help="let --output be a folder of committed files (docs/live)")
    p.set_defaults(func=main)


def _bounds(a) -> list:
    """(flag, value, lowest, highest) of every number: a cell may run a day; more kernels than
    notebooks buy nothing."""
    return [("--cell-timeout", a.cell_timeout, 1, MAX_CELL_TIMEOUT), ("--jobs", a.jobs, 1, MAX_JOBS)]


def main(a) -> int:
    check_bounds(_bounds(a))
    nb_dir = Path(a.notebooks_dir).resolve()
    paths = select_notebooks(a.notebooks, nb_dir)
    params = parse_parameters(a.parameters)
    check_parameters(params, paths, RESERVED)  # against each notebook's own cell, before any starts (--list too)
    if a.list:
        print("\n".join(p.stem for p in paths))
        return 0
    info = resolve_mode(a.mode)  # `--mode live` without CUDA fails here, before any kernel starts
    # a file, a path under one, or committed evidence (docs/live, a link to notebooks/): one line, nothing run
    out = untracked_dir(a.output, "--output", force=a.force).resolve()
    out.mkdir(parents=True, exist_ok=True)
    kernel = ensure_kernel()
    cache_root()  # a relative $SWA_REPRO_CACHE made absolute for the kernels (their cwd is notebooks/)
    jobs = max(1, min(a.jobs, len(paths)))
    print(f"mode {a.mode} -> {info.mode}: {info.reason}")
    print(f"running {len(paths)} notebook(s) from {nb_dir} -> {out}" + (f", {jobs} at a time" if jobs > 1 else ""),
          flush=True)
    t0, order, done, names = time.perf_counter(), run_summary.longest_first(paths, out), {}, [p.stem for p in paths]
    head = {"mode_requested": a.mode, "mode": info.mode, "mode_reason": info.reason, "parameters": params,
            "output_dir": str(out), "python": sys.executable}
    head["earlier"] = run_summary.earlier(out)  # kept while running: what artifacts.reusable may reuse
    run_summary.write(out, head, [], names, "running")  # before any file of the last run goes
    try:
        results = run_all(paths, out, a.mode, params, kernel, a.cell_timeout, jobs, order, done)
    except KeyboardInterrupt:
        return run_summary.interrupted(out, head, [done[n] for n in names if n in done], names)
    head.pop("earlier")
    failed = run_summary.write(out, {**head, "seconds": round(time.perf_counter() - t0, 2)}, results, names,
                               "done")["failed"]
    print(f"{len(results) - len(failed)}/{len(results)} notebooks ok; summary: {out / 'summary.json'}")
    return 1 if failed else 0
