"""Notebook 02's fuzz view: per-version coverage and the versions no real-kernel run backs yet,
checked against the committed recordings read independently (plain ``json``)."""

from __future__ import annotations

import json
import shutil

import pytest

from swa_repro.core.versions import FLASHINFER_VERSIONS
from swa_repro.evidence.fuzz import FUZZ_ROOT
from swa_repro.notebook import fuzz_view as fv

RECORDED = sorted(p.parent.name for p in FUZZ_ROOT.glob("[0-9]*/*.json") if ".report." not in p.name)


def _raw(version):
    docs = [json.loads(p.read_text()) for p in (FUZZ_ROOT / version).glob("*.json") if ".report." not in p.name]
    return [e["case"] for d in docs for e in d["cases"] if "error" not in e], docs


@pytest.mark.skipif(not RECORDED, reason="no committed fuzz recordings")
@pytest.mark.parametrize("version", sorted(set(RECORDED)))
def test_coverage_row_matches_the_recording(version):
    rows = {r["flashinfer"]: r for r in fv.coverage_rows(fv.committed_runs())}
    cases, docs = _raw(version)
    row = rows[version]
    assert row["backends"].split(",") == sorted({c["backend"] for c in cases})
    assert row["head dims"] == ",".join(str(d) for d in sorted({c["head_dim"] for c in cases}))
    assert ("fa2:bug" in row["plans"]) == any(c["backend"] == "fa2" and c["plan_window_left"] < 0 for c in cases)
    assert row["gpu"] == ", ".join(sorted({d["provenance"]["gpu"] for d in docs}))


def test_unbacked_versions_are_named_with_how_to_record(tmp_path, capsys):
    if not RECORDED:
        pytest.skip("no committed fuzz recordings")
    one = RECORDED[0]
    shutil.copytree(FUZZ_ROOT / one, tmp_path / one)
    view = fv.fuzz_view(tmp_path)
    assert fv.unbacked_versions(fv.committed_runs(tmp_path)) == [v for v in FLASHINFER_VERSIONS if v != one]
    fv.print_view(view)
    out = capsys.readouterr().out
    assert f"flashinfer {', '.join(v for v in FLASHINFER_VERSIONS if v != one)}: modelled from source alone" in out
    assert "scripts/gpu_fuzz.sh" in out


def test_totals_are_in_version_order():
    if len(set(RECORDED)) < 2:
        pytest.skip("needs recordings of two versions")
    view = fv.fuzz_view()
    order = [r["flashinfer"] for r in fv.totals_rows(view.report)]
    assert order == [v for v in FLASHINFER_VERSIONS if v in order]


def test_evidence_page_states_the_committed_totals():
    """The GPU evidence page's fuzz sentence (docs/gpu-evidence.md) is prose: hold its numbers to the recordings."""
    from conftest import REPO

    if not RECORDED:
        pytest.skip("no committed fuzz recordings")
    rep = fv.fuzz_view().report
    text = " ".join((REPO / "docs" / "gpu-evidence.md").read_text().split())
    assert f"{rep['agreements']}/{rep['comparisons']} comparisons agree" in text
    assert f"all {rep['statuses']['kernel']['undefined']} requests the model calls `undefined`" in text
    missing = fv.unbacked_versions(fv.committed_runs())
    assert all(f"**{v} (sglang" in text or f"{v} is not backed" in text for v in missing)
