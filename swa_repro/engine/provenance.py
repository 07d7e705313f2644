"""Where the generated audit tables go and what each says about how it was made.

Both engines' release tables (``docs/audit/releases.json``, ``families.json``: ``sglang.audit.table``
/ ``family_table``; ``vllm-releases.json``: ``vllm.audit.table``) carry the same provenance: the command,
the date, this checkout's commit and the base venv's python / torch / flashinfer, and one sentence
of how each release's code was run (the engine's own words).
"""

from __future__ import annotations

import datetime
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABLE_DIR = ROOT / "docs" / "audit"


def table_out(out: Path, fixed: bool) -> Path:
    """Where a release table goes: ``out``, or for a table of fixed releases asked into the committed
    tables' folder, its ``fixed/`` beside them. ``out`` is compared resolved, so ``--out docs/audit``
    typed at the checkout's root is that folder too: compared as typed, a fixed table went over the
    unfixed one."""
    return TABLE_DIR / "fixed" if fixed and Path(out).resolve() == TABLE_DIR.resolve() else Path(out)


def provenance(command: str, how: str) -> dict:
    """The table's provenance, its keys in the committed tables' order (``timings_s``, the engine's,
    goes after them)."""
    from importlib import metadata

    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except OSError:
        commit = None
    return {"command": command, "date": datetime.date.today().isoformat(), "swa_repro_commit": commit,
            "python": platform.python_version(), "torch": metadata.version("torch"),
            "base_flashinfer": metadata.version("flashinfer-python"), "how": how}
