"""Where the notebooks live, where a run of one writes, and the parameters every run is given.

Read alike by the runner (``swa-repro run``), the kernel side of a run (``artifacts.artifact_set``)
and a notebook's parameters cell (``param_cell.check``); kept below all three, so none imports
another for a folder.
"""

from __future__ import annotations

from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO_DIR / "notebooks"
RESERVED = ("mode", "output_dir")  # the runner gives every notebook these; its --parameters may not


def output_path(output_dir) -> Path:
    """``output_dir`` as a notebook writes it: a relative one is taken from the repo root, as
    ``make repro`` does, not from the kernel's cwd (notebooks/ in the lab), so an interactive run
    and a headless one fill the same ``artifacts/``. ``swa-repro run`` passes an absolute path."""
    p = Path(output_dir).expanduser()
    return p if p.is_absolute() else REPO_DIR / p
