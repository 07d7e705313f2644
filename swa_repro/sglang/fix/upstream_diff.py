"""The diffs of ``docs/upstream`` against sglang 0.5.23's own file: where the file is, its text
(the provisioned overlay), a unified diff with sglang's repository paths, one per fix, and the
plus side of a diff applied strictly (what ``patch -p1`` would make, without fuzz).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from swa_repro.sglang.fix import FIXES, ORDER, apply_fixes, states
from swa_repro.sglang.patch.classify import REL_PATH

VERSION = "0.5.23"
REPO_PATH = f"python/sglang/{REL_PATH}"
ROOT = Path(__file__).resolve().parents[3]
LIVE = ROOT / "recordings" / "sglang-live" / f"fix-{VERSION}"
TEST = "test/registered/attention/unittests/swa/test_flashinfer_plan_time_params.py"  # sglang's layout


def source(version: str = VERSION) -> str:
    from swa_repro.sglang.provision import provision

    overlay, _ = provision(version)
    return (overlay / "sglang" / REL_PATH).read_text()


def unified(old: str, new: str, path: str = REPO_PATH) -> str:
    """``old`` -> ``new`` as a unified diff of ``path`` (sglang's repository path; default the backend)."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))


def diffs(text: str) -> dict[str, str | None]:
    """name -> diff against ``text`` (None: nothing of its own to change); plus ``all``."""
    st = states(text)
    out = {n: None if st[n].state == "applied" or FIXES[n].requires else unified(text, apply_fixes(text, (n,)))
           for n in ORDER}
    out["all"] = unified(text, apply_fixes(text, ORDER))
    return out


def plus_side(text: str, diff: str) -> str:
    """``text`` with ``diff`` applied, hunk by hunk, every context and removed line checked (what
    ``patch -p1`` would do to the file, without fuzz)."""
    old, new, i = text.splitlines(keepends=True), [], 0
    lines = diff.splitlines(keepends=True)
    for k, ln in enumerate(lines):
        if ln.startswith("@@"):
            start = int(ln.split()[1].split(",")[0][1:]) - 1 if ln.split()[1] != "-0,0" else 0
            new += old[i:start]
            i = start
        elif ln.startswith((" ", "-")) and not ln.startswith("--- "):
            if old[i] != ln[1:]:
                raise ValueError(f"diff line {k + 1} does not match the file at line {i + 1}")
            if ln[0] == " ":
                new.append(old[i])
            i += 1
        elif ln.startswith("+") and not ln.startswith("+++ "):
            new.append(ln[1:])
    return "".join(new + old[i:])
