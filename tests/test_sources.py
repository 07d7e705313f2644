"""The modelled flashinfer versions: source-line data, its generated doc, version lookup and evidence notes."""

from pathlib import Path

import pytest

from swa_repro.core.case import Case
from swa_repro.core.errors import CaseError
from swa_repro.core.versions import (
    FLASHINFER_VERSIONS, RECORDINGS_ROOT, evidence_note, nearest_modelled, recorded_in, version_key,
)
from swa_repro.kernel import model, sources

DOC = Path(__file__).resolve().parents[1] / "docs" / "flashinfer_versions.md"
SINCE_0_6_14 = [v for v in FLASHINFER_VERSIONS if version_key(v) >= version_key("0.6.14")]


def test_committed_doc_is_the_generated_one():
    """Regenerate with `python -m swa_repro.kernel.sources > docs/flashinfer_versions.md`."""
    assert DOC.read_text() == sources.markdown() + "\n"


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
def test_every_version_has_a_column_and_facts(version):
    header = next(line for line in sources.markdown().splitlines() if line.startswith("| fact |"))
    assert f"| {version} |" in header
    assert all(f.lines.get(version) for f in sources.FACTS)
    assert version in model.VERSION_FACTS


def test_facts_cover_exactly_the_modelled_versions_in_order():
    assert list(model.VERSION_FACTS) == list(FLASHINFER_VERSIONS)
    assert all(list(f.lines) == list(FLASHINFER_VERSIONS) for f in sources.FACTS)
    keys = [version_key(v) for v in FLASHINFER_VERSIONS]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_cap_row_agrees_with_version_facts():
    """The opt-in cap is cited exactly where VERSION_FACTS applies it (b.1)."""
    cap = next(f for f in sources.FACTS if "opt-in" in f.what)
    assert [v for v, line in cap.lines.items() if line != "—"] == SINCE_0_6_14
    assert [v for v, f in model.VERSION_FACTS.items() if f.kv_tile_optin_cap] == SINCE_0_6_14


def test_every_verdict_says_same_or_names_the_difference():
    for f in sources.FACTS:
        assert f.verdict.startswith(sources.SAME) or "(b." in f.verdict, f.what
    assert [t.split()[0] for t, _ in sources.DIFFERENCES] == [f"b.{i}" for i in range(1, 8)]


def test_check_finds_a_cited_line_that_moved(tmp_path):
    """``--check`` against a fake wheel: the token on the cited line passes, one line off fails."""
    fact = sources.Fact("x", "attn/scheduler.cuh", {v: "3" for v in FLASHINFER_VERSIONS}, "kv_chunk", sources.SAME)
    f = tmp_path / "0.6.12" / sources.PREFIXES["attn/"] / "scheduler.cuh"
    f.parent.mkdir(parents=True)
    f.write_text("a\nb\nint kv_chunk = 1;\nc\n")
    old = sources.FACTS[:]
    try:
        sources.FACTS[:] = [fact]
        assert sources.check(tmp_path) == []
        f.write_text("a\nb\nc\nint kv_chunk = 1;\n")
        assert sources.check(tmp_path) == ["0.6.12 attn/scheduler.cuh:3 lacks 'kv_chunk': c"]
    finally:
        sources.FACTS[:] = old


@pytest.mark.parametrize("given,nearest", [
    ("0.6.13", "0.6.12"), ("0.6.17", "0.6.18"), ("0.7.0", "0.7.2"), ("0.7.2.post2", "0.7.2.post1"),
    ("0.8.0", "0.7.2.post1"), ("0.5.9", "0.6.7.post2"), ("0.6.12+cu128", "0.6.12"), ("nightly", "0.7.2.post1"),
])
def test_unknown_version_names_the_nearest_and_the_check(given, nearest):
    assert nearest_modelled(given) == nearest
    with pytest.raises(CaseError) as e:
        Case((0,), (8,), flashinfer_version=given)
    msg = str(e.value)
    assert "\n" not in msg and f"nearest modelled: {nearest} " in msg
    assert f"`swa-repro fuzz --mode live --flashinfer-version {nearest}`" in msg


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
def test_every_version_is_accepted(version):
    assert Case((0,), (8,), flashinfer_version=version).flashinfer_version == version


def test_recorded_is_read_from_the_tree(tmp_path):
    root = tmp_path / "recordings"
    (root / "0.6.14").mkdir(parents=True)
    (root / "0.6.14" / "seed_bug.json").write_text("{}")
    (root / "fuzz" / "0.6.18").mkdir(parents=True)
    (root / "fuzz" / "0.6.18" / "replay.report.json").write_text("{}")  # a report is not a recording
    assert recorded_in("0.6.14", root) == ["recordings/0.6.14/"]
    assert recorded_in("0.6.18", root) == []
    (root / "fuzz" / "0.6.18" / "fuzz-s0.json").write_text("{}")
    assert recorded_in("0.6.18", root) == ["recordings/fuzz/0.6.18/"]
    assert evidence_note("0.6.18", root).startswith("modelled from source; held to real-kernel recordings")
    assert evidence_note("0.7.2", root) == (
        "modelled from source; no real-kernel recording of 0.7.2 yet: check it with "
        "`swa-repro fuzz --mode live --flashinfer-version 0.7.2` on a GPU with flashinfer 0.7.2")


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
def test_committed_tree_notes_match_its_folders(version):
    has = any(p.suffix == ".json" for d in (RECORDINGS_ROOT / version, RECORDINGS_ROOT / "fuzz" / version)
              if d.is_dir() for p in d.iterdir() if not p.name.endswith(".report.json"))
    assert bool(recorded_in(version)) == has
    assert ("no real-kernel recording" in evidence_note(version)) == (not has)
