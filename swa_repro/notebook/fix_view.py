"""Notebooks 03 and 04's view of ``swa-repro patch --fix``: a release's own backend file, each fix's
state in it and its diff (03), and the audit of that release as shipped and with the fixes, per
finding class and per path (04).

A release comes from its overlay (``sglang.provision``, cached; installing one needs the package
index). Where it cannot be had (no network), :func:`load_release` / :func:`audit_pair` say so in one
line and the sections skip; any other failure (a fix that refuses the file, an audit that fails)
is raised, never hidden.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from swa_repro.core.errors import UsageError
from swa_repro.engine.patching import PatchError
from swa_repro.notebook.plots import SMALL, _pct
from swa_repro.notebook.show import Row, col
from swa_repro.sglang.audit import table as at
from swa_repro.sglang.fix import FIXES, apply_fixes, parse_names, states
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.patch.classify import REL_PATH

FILE = f"sglang/{REL_PATH}"
SKIP = "skipped: "  # the one line a section prints when the release cannot be had


@dataclass(frozen=True)
class Release:
    """Release ``version``'s backend file as shipped, the fixes chosen for it, and the file with them."""
    version: str
    names: tuple
    text: str | None = None  # None: not provisioned (``skipped`` says why)
    path: str | None = None
    fixed: str | None = None  # None: not provisioned, or the fixes refuse the file (``skipped`` says why)
    skipped: str | None = None

    @property
    def line(self) -> str:
        return self.skipped or f"sglang {self.version}: {self.path}\nchosen: {', '.join(self.names)}"


def load_release(version: str, fixes: str) -> Release:
    """``fixes``: ``all`` or a comma list (an unknown name raises). A release that cannot be had, or
    whose file the fixes do not know (they were written for 0.5.14-0.5.23): ``skipped`` says why."""
    from swa_repro.sglang.provision import provision

    # the finding classes this runner audits (ORDER); the family fixes (a model file's window hook, sm100's
    # cutlass choice, the full layers' prefix pass) need a family's layers: notebook 07 and audit --model
    names = tuple(n for n in parse_names(fixes) if n in ORDER)
    if other := [n for n in parse_names(fixes) if n not in ORDER and fixes.strip() != "all"]:
        raise UsageError(f"fixes: {','.join(other)} need a model family's layers: run notebook 07 or "
                         f"`swa-repro audit --sglang {version} --model FAMILY --fix {','.join(other)}`")
    try:
        overlay, _ = provision(version)
    except UsageError as e:
        return Release(version, names, skipped=f"{SKIP}sglang {version} cannot be provisioned here ({e})")
    path = overlay / FILE
    text = path.read_text()
    try:
        return Release(version, names, text, str(path), apply_fixes(text, names))
    except PatchError as e:
        return Release(version, names, text, str(path), skipped=f"{SKIP}the fixes refuse sglang {version}'s file: {e}")


def file_unchanged(rel: Release) -> bool:
    """The release's file still reads as it did when loaded (nothing here writes it)."""
    return Path(rel.path).read_text() == rel.text


# ----------------------------------------------------------------------------- notebook 03
@dataclass(frozen=True)
class StateRow(Row):
    fix: str = col("fix")
    chosen: bool = col("chosen", fmt=lambda v: "yes" if v else "")
    state: str = col("in the release")
    why: str = col("why", fmt=lambda v: v or "")


def state_rows(rel: Release) -> list[StateRow]:
    """Every fix's state in the release's file as shipped (needed / applied / unknown)."""
    return [StateRow(n, n in rel.names, s.state, s.why) for n, s in states(rel.text).items()]


def step_diffs(rel: Release, context: int = 1) -> list[tuple[str, str]]:
    """``(fix, diff)`` per chosen fix, in application order: the file with the fixes before it
    applied -> with it too, so each diff is that fix's edit alone ("" when the release has it)."""
    out, prev = [], rel.text
    for i, name in enumerate(rel.names):
        new = apply_fixes(rel.text, rel.names[:i + 1])
        out.append((name, "".join(difflib.unified_diff(prev.splitlines(True), new.splitlines(True), f"a/{FILE}",
                                                       f"b/{FILE}", n=context))))
        prev = new
    return out


def diff_text(name: str, diff: str) -> str:
    """One fix's summary and its diff (or why it has none)."""
    why = "its parts are the fixes above" if FIXES[name].requires else "the release already has it"
    return f"## {name}: {FIXES[name].summary}\n" + (diff.rstrip() if diff else f"(no edit: {why})")


def apply_commands(rel: Release, installed: str | None) -> list[str]:
    """How to apply the chosen fixes for real (``swa-repro patch apply --fix``): in place only on the
    installed sglang of that release, never on the cached overlay (a copy from it instead)."""
    fix = ",".join(rel.names)
    if installed == rel.version:
        return [f"swa-repro patch apply --fix {fix} --out flashinfer_backend.py   # a fixed copy",
                f"swa-repro patch apply --fix {fix} --in-place   # the installed file, with a backup "
                "(`swa-repro patch revert` restores it)"]
    return [f"swa-repro patch apply --fix {fix} --source {rel.path} --out flashinfer_backend.py   # a fixed copy",
            f"swa-repro patch apply --fix {fix} --in-place   # where sglang {rel.version} is installed "
            f"(this machine has {installed}), with a backup"]


# ----------------------------------------------------------------------------- notebook 04
def audit_pair(rel: Release, note=print) -> tuple[dict, dict]:
    """The release audited as shipped and with ``rel.names`` applied (``audit_release`` twice, each
    from the shared content-keyed cache when it holds it: ``core.cache``); one ``note`` line for both."""
    from swa_repro.sglang.audit.release import audit_release

    pair = audit_release(rel.version, note=lambda s: None), audit_release(rel.version, fixes=rel.names, note=lambda s: None)
    how = [d["release"].get("result_cache", {}).get("cache", "off") for d in pair]
    secs = [d["release"].get("child_seconds") for d in pair]
    said = ", ".join(f"{w}: {'cached result' if h == 'hit' else f'audited now in {t} s'}"
                     for w, h, t in zip(("as shipped", "with the fixes"), how, secs))
    note(f"sglang {rel.version}: overlay {pair[0]['release'].get('overlay')} ({said})")
    return pair


def frame(rows):
    """Typed rows as an HTML table (a pandas Styler: every cell whole, where a DataFrame's repr cuts
    at 50 characters and a text table at its width), left-aligned, no index."""
    import pandas as pd

    df = pd.DataFrame([r.cells() for r in rows])
    return df.style.hide(axis="index").set_properties(**{"text-align": "left", "white-space": "normal"})


@dataclass(frozen=True)
class ClassRow(Row):
    key: str = col(None)
    finding: str = col("finding")
    chosen: bool = col("fix chosen", fmt=lambda v: "yes" if v else "")
    before: str = col("as shipped")
    after: str = col("with the fixes")
    evidence: str = col("evidence after")


def class_rows(before: dict, after: dict, names) -> list[ClassRow]:
    """Each finding class's cell (``audit.table.cell``) as shipped -> with the fixes."""
    b, a = at.cells(before), at.cells(after)
    return [ClassRow(k, c.title, k in names, b[k]["state"], a[k]["state"], (a[k]["evidence"] or [""])[0])
            for k, c in at.CLASSES.items()]


@dataclass(frozen=True)
class KeyRow(Row):
    path: str = col("path")
    before: str = col("keys as shipped")
    after: str = col("keys with the fixes")
    before_verdict: str | None = col(None)
    after_verdict: str | None = col(None)
    before_cell: dict | None = col(None)
    after_cell: dict | None = col(None)


def key_rows(before: dict, after: dict) -> list[KeyRow]:
    """Per path, the keys a sliding-window layer's queries attend (``audit.table.key_cells``)."""
    b, a = at.key_cells(before), at.key_cells(after)
    paths = sorted(b.keys() | a.keys(), key=at._PATH_ORDER.index)
    verdict = lambda c: c and c["verdict"]  # noqa: E731
    return [KeyRow(p, at.key_text(b.get(p)), at.key_text(a.get(p)), verdict(b.get(p)), verdict(a.get(p)),
                   b.get(p), a.get(p)) for p in paths]


def window_paths(names) -> set:
    """The paths the chosen window fixes are about: their keys must read exact after."""
    return {p for n in names if at.CLASSES[n].parameter == "window_left" for p in at.CLASSES[n].paths}


def held_exact(row: KeyRow, names) -> bool:
    """Whether a path's keys must read exact with the fixes: a chosen window fix is about it, or
    it was exact as shipped (a fix must not break it). Others are left to the fixes not chosen."""
    return row.path in window_paths(names) or row.before_verdict == "exact"


def keys_figure(rows: list[KeyRow], title: str) -> Figure:
    """Fraction of a sliding-window layer's queries that see keys outside their window, per path,
    as shipped and with the fixes (cell text: that fraction, and intended keys never read)."""
    fig = Figure(figsize=(1.25 * len(rows) + 2.2, 2.6), layout="constrained")
    ax = fig.subplots()
    both = ([r.before_cell for r in rows], [r.after_cell for r in rows])
    grid = [[c["queries_with_extra"] / c["queries"] if c and c["queries"] else float("nan") for c in cells]
            for cells in both]
    im = ax.imshow(grid, cmap=colormaps["Reds"], vmin=0, vmax=1, aspect="auto")
    for i, cells in enumerate(both):
        for j, c in enumerate(cells):
            missing = f"\n{c['missing_keys']} missing" if c and c["missing_keys"] else ""
            label = "-" if c is None or not c["queries"] else _pct(grid[i][j]) + missing
            ax.text(j, i, label, ha="center", va="center", fontsize=SMALL, color="white" if grid[i][j] > 0.55 else "black")
    ax.set(xticks=range(len(rows)), yticks=(0, 1), yticklabels=("as shipped", "with the fixes"), title=title)
    ax.set_xticklabels([r.path for r in rows], rotation=30, ha="right", fontsize=SMALL)
    fig.colorbar(im, ax=ax, label="queries seeing keys\noutside the window", format=PercentFormatter(1.0))
    return fig
