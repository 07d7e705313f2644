"""``make lab``'s scratch copy of the notebooks: what the lab opens, so exploring never dirties the repo.

JupyterLab saves a notebook on every save and autosave (every two minutes): opened from
``notebooks/``, an edited ``parameters`` cell was written into the tracked ``.py`` behind the user's
back. ``make lab`` opens ``scratch/`` instead (git-ignored), filled from ``notebooks/`` first by
:func:`sync`, which never discards an edit:

* a notebook (``NN_name.py``, and ``jupytext.toml``, which keeps saves to the ``.py``) not in the
  scratch folder is copied;
* an unedited copy (its bytes are what was copied) is replaced when the tracked notebook changed;
* an edited copy is kept; if the tracked notebook changed too, a line says so, with the ``diff`` to
  look at and how to take the new one (delete the copy);
* a copy whose tracked notebook is gone, and any other file there, are left alone.

What was copied is recorded in ``scratch/.swa-repro-scratch.json`` (the sha256 of each file as
copied); a copy identical to the tracked file counts as unedited, whatever the record says.

    python -m swa_repro.notebook.scratch notebooks scratch   # what `make lab` runs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from swa_repro.core import outputs
from swa_repro.core.errors import UsageError
from swa_repro.core.outputs import write_atomic

MANIFEST = ".swa-repro-scratch.json"
CONFIG = "jupytext.toml"


def tracked_files(src: Path) -> list[Path]:
    """The files a scratch copy holds: the notebooks (``NN_name.py``) and the jupytext config."""
    from swa_repro.notebook.runner import available_notebooks

    return available_notebooks(src) + ([src / CONFIG] if (src / CONFIG).is_file() else [])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(dst: Path) -> dict:
    try:
        doc = json.loads((dst / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    files = doc.get("files") if isinstance(doc, dict) else None
    return {k: v for k, v in files.items() if isinstance(v, str)} if isinstance(files, dict) else {}


def check_dst(src, dst) -> None:
    """``LAB_ROOT`` before anything is copied, one line each: a folder that can be made and written
    (not a file, not read-only, its record not a folder), and not the checkout or a folder of tracked
    files, a link to ``notebooks/`` included: only ``LAB_ROOT=notebooks`` itself (the same path as
    ``LAB_FROM``) opens the tracked notebooks, saying so."""
    if os.path.abspath(src) == os.path.abspath(dst):
        return
    d = outputs.out_dir(dst, "LAB_ROOT")
    why = outputs.tracked_reason(d)
    if why:
        raise UsageError(f"LAB_ROOT {dst}: {why}, so a save would write tracked files; give a git-ignored folder "
                         f"(the default scratch), or LAB_ROOT={src} to edit the tracked notebooks on purpose")
    if os.path.isdir(d / MANIFEST) or (os.path.lexists(d / MANIFEST) and not os.path.isfile(d / MANIFEST)):
        raise UsageError(f"LAB_ROOT {dst}: {d / MANIFEST} is not a file: remove it (make lab writes its record "
                         "there)")
    why = outputs.read_only_reason(d) if d.is_dir() else None
    if why:
        raise UsageError(f"LAB_ROOT {dst}: {why}; give a folder you can write")


def sync(src, dst) -> list[tuple[str, str, str]]:
    """Bring the scratch folder ``dst`` up to date with the tracked notebooks in ``src``, keeping
    every edit. Returns ``(file, action, why)`` per file: action is ``copied``, ``refreshed``,
    ``kept`` (an edited copy), or ``same``. Nothing happens when ``dst`` is ``src``."""
    src, dst = Path(src).resolve(), Path(dst).resolve()
    if src == dst:
        return []
    dst.mkdir(parents=True, exist_ok=True)
    base = _manifest(dst)
    out = []
    for f in tracked_files(src):
        copy, new = dst / f.name, _sha(f)
        if not copy.is_file():
            action, why = "copied", "new" if f.name not in base else "the copy had been deleted"
        else:
            have = _sha(copy)
            if have == new:
                action, why = "same", ""
            elif have == base.get(f.name):
                action, why = "refreshed", f"{f.name} changed in {src.name}/; the copy had no edits"
            else:
                action, look = "kept", f"diff {_rel(f)} {_rel(copy)} (delete {_rel(copy)} to take the tracked one)"
                if new == base.get(f.name):
                    why = "your edits; the tracked notebook is unchanged"
                elif f.name in base:
                    why = f"your edits; {src.name}/{f.name} changed since it was copied: {look}"
                else:
                    why = f"it differs from {src.name}/{f.name} and make lab did not copy it: {look}"
        if action in ("copied", "refreshed"):
            write_atomic(copy, f.read_bytes())
            base[f.name] = new
        elif action == "same":
            base[f.name] = new
        out.append((f.name, action, why))
    doc = {"from": str(src), "note": "sha256 of each file as make lab last copied it from there "
                                     "(swa_repro/notebook/scratch.py)", "files": dict(sorted(base.items()))}
    write_atomic(dst / MANIFEST, (json.dumps(doc, indent=1) + "\n").encode())
    return out


def _rel(p: Path) -> str:
    try:
        return os.path.relpath(p)
    except ValueError:
        return str(p)


def report(src, dst, actions) -> list[str]:
    """What ``make lab`` prints: where the lab opens and what a save does, then one line per copy
    that changed or that kept edits."""
    src, dst = Path(src), Path(dst)
    if not actions and Path(src).resolve() == Path(dst).resolve():
        return [f"make lab: opening the tracked {_rel(dst)}/ itself: a save (and the autosave) writes its files"]
    lines = [f"make lab: opening {_rel(dst)}/, your git-ignored copy of {_rel(src)}/; a save (and the autosave, "
             f"every 2 minutes) writes there only"]
    copied = [f for f, a, _ in actions if a == "copied"]
    if copied:
        lines.append(f"  copied {len(copied)} file(s): {', '.join(copied)}")
    lines += [f"  {a} {f}: {why}" for f, a, why in actions if a in ("refreshed", "kept")]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="the tracked notebooks (notebooks/)")
    ap.add_argument("dst", help="the scratch folder the lab opens (scratch/)")
    a = ap.parse_args(argv)
    if not Path(a.src).is_dir():
        print(f"make lab: {a.src} is not a folder", file=sys.stderr)
        return 2
    try:
        check_dst(a.src, a.dst)
    except UsageError as e:
        print(f"make lab: {e}", file=sys.stderr)
        return 2
    print("\n".join(report(a.src, a.dst, sync(a.src, a.dst))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
