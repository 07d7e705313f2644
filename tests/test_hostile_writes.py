"""Issue 43 B: nothing is written through a link, into the checkout's committed files (``docs/``,
``recordings/``, ``notebooks/``, the checkout itself) or over a fuller table, unless named with
``--force``; an interrupted ``run`` leaves its set marked interrupted. And its C items of the same
kind: a table's ``--out`` checked before any audit, an empty ``--vllm`` list, a ``--source`` that is
no regular file, a scratch folder that cannot be one.

Each refusal is one line, exit 2, and the target (a link's target too) byte-identical afterwards
(``test_hostile_input.refused``'s snapshot). No release is installed or audited: the audits are
stand-ins that fail the test if called.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_hostile_input import refused, snapshot

from swa_repro.cli import main
from swa_repro.core import cache as core_cache
from swa_repro.core import outputs

REPO = Path(__file__).resolve().parents[1]


def _never(*a, **k):
    raise AssertionError("no work may start for a refused output")


@pytest.fixture
def linked(tmp_path):
    """``out/x.EXT`` links to ``victim/x.EXT``, a file whose bytes must survive."""
    victim, out = tmp_path / "victim", tmp_path / "out"
    victim.mkdir()
    out.mkdir()

    def make(ext: str) -> Path:
        (victim / f"x{ext}").write_bytes(b"keep me\n")
        (out / f"x{ext}").symlink_to(victim / f"x{ext}")
        return out / f"x{ext}"
    return make


# ----------------------------------------------------------------------------- links
@pytest.mark.parametrize("ext", [".json", ".npz"])
def test_mask_out_onto_a_link_is_refused(linked, tmp_path, capfd, ext):
    link = linked(ext)
    refused(capfd, ["mask", "--window-left", "4", "--prefix-lens", "0", "--extend-lens", "8", "--out", link], "is a symbolic link",
            tmp_path)
    assert link.is_symlink() and (tmp_path / "victim" / f"x{ext}").read_bytes() == b"keep me\n"


def test_mask_writes_through_the_one_writer(tmp_path, capfd):
    """An existing regular file is replaced whole (a new inode: a hard link elsewhere keeps its bytes)."""
    out, other = tmp_path / "m.json", tmp_path / "hard.json"
    out.write_bytes(b"old\n")
    os.link(out, other)
    assert main(["mask", "--window-left", "4", "--prefix-lens", "0", "--extend-lens", "8", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["requests"] and other.read_bytes() == b"old\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_fuzz_report_onto_a_link_is_refused(linked, tmp_path, capfd, monkeypatch):
    from swa_repro.evidence import fuzz

    monkeypatch.setattr(fuzz, "_finish", _never)
    link = linked(".json")
    refused(capfd, ["fuzz", "--mode", "model", "--cases", "1", "--report", link], "is a symbolic link", tmp_path)


