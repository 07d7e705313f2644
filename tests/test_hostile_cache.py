"""Issue 43, class A and the cache items of class C: no cache state yields a verdict other than the
uncached run's. An entry is used only if it is *the* entry of its key and whole; anything else is
recomputed. A cache that cannot be written keeps the computed verdict (one warning line); an answer
with no driven run behind it is "not driven" (exit 1), never "not affected"; an overlay whose files
are not its wheel's is made again; ``patch status --vllm`` reads each edit's structure.

Every cache here is a temporary one (``SWA_REPRO_CACHE``). The family-cell cases audit one release's
Gemma-2 on sm90 and sm100 once per module (into the user's cache: warm after the first run) and
damage copies of its two entries; the recomputation they force is served by the module's own
child document (``run_child`` replaced, counted), so each case costs no child. The rest use
synthetic overlays, wheels and documents made here.
"""

from __future__ import annotations

import base64
import copy
import errno
import hashlib
import json
import os
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import release_overlay, skip_module_unless

from swa_repro.cli import main
from swa_repro.core import cache
import tempfile
from swa_repro.core.errors import UsageError

VERSION = "0.5.23"


def sign(key_parts: dict, doc) -> str:
    """An entry as a writer that knows the format would make it (key_parts, the document's sha256)."""
    digest = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
    return json.dumps({"key_parts": key_parts, "sha256": digest, "document": doc})


def one_warning(err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "warning" in lines[0] and "Traceback" not in err, err


# ----------------------------------------------------------------------------- a family cell, damaged
@pytest.fixture(scope="module")
def real():
    """Gemma-2 on sm90 and sm100 of 0.5.23, audited once (the user's cache): the two entries' text,
    the child's document per GPU class, the verdicts and the release's serving facts."""
    skip_module_unless("transformers")
    from conftest import release_overlay

    from swa_repro.sglang.audit import family_run as fr
    from swa_repro.sglang.overlay_run import child_parts

    overlay = release_overlay(VERSION)
    out = fr.audit_release(VERSION, "gemma2", ["sm90", "sm100"], note=lambda s: None)
    parts = child_parts(fr.MODULE, overlay)
    folder = cache.cache_root() / "results" / "family-cell"
    names = {g: f"{cache.key_of({'kind': 'family-cell', **parts, 'family': 'gemma2', 'gpu': g})}.json"
             for g in ("sm90", "sm100")}
    entries = {g: json.loads((folder / n).read_text()) for g, n in names.items()}
    return SimpleNamespace(user_root=cache.cache_root(), names=names, entries=entries,
                           state={g: out[g]["families"][0]["answer"]["state"] for g in names},
                           serving=fr._serving(overlay, VERSION, ["gemma2"]))


@pytest.fixture
def cells(real, tmp_path, monkeypatch):
    """A temporary cache holding the two entries (the release's overlay linked from the user's
    cache); the child replaced by one that hands back the module's document and counts its calls."""
    from swa_repro.sglang.audit import family_run as fr

    root = tmp_path / "cache"
    folder = root / "results" / "family-cell"
    folder.mkdir(parents=True)
    (root / "sglang").symlink_to(real.user_root / "sglang", target_is_directory=True)
    for g, n in real.names.items():
        (folder / n).write_text(json.dumps(real.entries[g]))
    monkeypatch.setenv("SWA_REPRO_CACHE", str(root))
    calls = []

    def child(module, overlay, args, what, cache=True):
        calls.append(args)
        gpus = args[args.index("--gpus") + 1].split(",")
        by_gpu = {g: [copy.deepcopy(real.entries[g]["document"]["family"])] for g in gpus}
        return {"release": copy.deepcopy(real.entries["sm90"]["document"]["release"]), "by_gpu": by_gpu}, 1.0, {}

    monkeypatch.setattr(fr, "run_child", child)
    monkeypatch.setattr(fr, "_serving", lambda overlay, version, *arch: copy.deepcopy(real.serving))
    return SimpleNamespace(folder=folder, calls=calls, path={g: folder / n for g, n in real.names.items()})


def _all_exact(entry: dict) -> dict:
    """``entry``'s cell with every driven path exact and its cap kept: a cell that reads "not affected"."""
    e = copy.deepcopy(entry)
    for r in e["document"]["family"]["paths"]:
        r.update(verdict="exact", cap="kept")
    return e


def _copy_of_other(real, c):  # another cell's whole, signed entry (one that answers "not affected") in its place
    e = _all_exact(real.entries["sm100"])
    c.path["sm100"].write_text(sign(e["key_parts"], e["document"]))
    c.path["sm90"].write_text(c.path["sm100"].read_text())


def _link_to_other(real, c):
    _copy_of_other(real, c)
    c.path["sm90"].unlink()
    c.path["sm90"].symlink_to(c.path["sm100"])


def _paths_emptied(real, c):  # the document cut down, key_parts intact
    e = copy.deepcopy(real.entries["sm90"])
    e["document"]["family"]["paths"] = []
    c.path["sm90"].write_text(json.dumps(e))


def _paths_emptied_signed(real, c):  # the same, with a matching sha256: the shape check still refuses it
    e = real.entries["sm90"]
    doc = copy.deepcopy(e["document"])
    doc["family"]["paths"] = []
    c.path["sm90"].write_text(sign(e["key_parts"], doc))


def _verdicts_edited(real, c):
    c.path["sm90"].write_text(json.dumps(_all_exact(real.entries["sm90"])))


def _document_empty(real, c):
    c.path["sm90"].write_text(json.dumps({"key_parts": real.entries["sm90"]["key_parts"], "document": {}}))


def _document_zero(real, c):
    c.path["sm90"].write_text(json.dumps({"key_parts": real.entries["sm90"]["key_parts"], "document": 0}))


def _document_list(real, c):
    c.path["sm90"].write_text(json.dumps({"document": []}))


def _a_folder(real, c):
    c.path["sm90"].unlink()
    (c.path["sm90"] / "x").mkdir(parents=True)


@pytest.mark.parametrize("damage", [_copy_of_other, _link_to_other, _paths_emptied, _paths_emptied_signed,
                                    _verdicts_edited, _document_empty, _document_zero, _document_list, _a_folder])
def test_a_damaged_family_cell_is_recomputed_never_read_as_a_verdict(real, cells, damage):
    """The cell's entry is another cell's (a copy or a link), cut down, edited, of the wrong shape or a
    folder: the audit recomputes it (once) and answers what the undamaged audit answered, and the
    entry is whole again afterwards; the other cell's entry is still used."""
    from swa_repro.sglang.audit import family_run as fr

    assert real.state["sm90"] != "not affected"  # the undamaged answer (Gemma-2 is affected on 0.5.23)
    damage(real, cells)
    out = fr.audit_release(VERSION, "gemma2", ["sm90", "sm100"], note=lambda s: None)
    assert out["sm90"]["families"][0]["answer"]["state"] == real.state["sm90"]
    assert len(cells.calls) == 1 and "sm90" in cells.calls[0][cells.calls[0].index("--gpus") + 1]
    assert out["sm90"]["release"]["result_cache"]["computed"] == 1
    again = fr.audit_release(VERSION, "gemma2", ["sm90"], note=lambda s: None)  # the rewritten entry is used
    assert again["sm90"]["release"]["result_cache"]["cache"] == "hit" and len(cells.calls) == 1
    assert again["sm90"]["families"][0]["answer"]["state"] == real.state["sm90"]


# ----------------------------------------------------------------------------- absence of evidence
def _family(paths: list) -> dict:
    return {"family": "gemma2", "paths": paths, "build": {}, "serving": {"default_prefill": "ragged"}}


@pytest.mark.parametrize("paths", [[], [{"path": "extend_paged", "kind": "sliding", "status": "absent", "why": "-"}]])
def test_a_family_with_no_driven_path_is_not_driven_and_incomplete(paths):
    """No path recorded, or none driven: "not driven" (and the audit incomplete: exit 1), never "not affected"."""
    from swa_repro.sglang.audit import family_run as fr
    from swa_repro.sglang.audit.family_verdict import answer

    f = _family(paths)
    f["answer"] = answer(f, "sm90")
    assert f["answer"]["state"] == "not driven"
    assert fr.incomplete({"families": [f]})


def test_a_plain_audit_with_driven_runs_but_no_plan_recorded_reads_no_class_fixed():
    """Runs said driven with no plan() call behind them are no evidence of a fix: no class reads "fixed",
    and the audit is incomplete (exit 1); with the plans recorded and no finding, a class reads fixed."""
    from swa_repro.sglang.audit import core as audit
    from swa_repro.sglang.audit import table as at

    driven = [{"path": p, "layer": ly, "plans": []} for p in ("extend_paged", "decode", "extend_ragged_no_prefix")
              for ly in ("swa8_cap50", "full_cap50")]
    doc = {"findings": [], "driven": driven, "not_driven": []}
    assert "fixed" not in {c["state"] for c in at.cells(doc).values()}
    assert audit.incomplete(doc)
    for d in driven:
        d["plans"] = ["BatchPrefillWithPagedKVCacheWrapper.plan(window_left=8, logits_soft_cap=50.0)"]
    assert at.cell(doc, "paged_only_window")["state"] == "fixed" and not audit.incomplete(doc)


def test_a_plain_audit_entry_with_its_findings_stripped_is_recomputed(tmp_path, monkeypatch):
    """``overlay_run.run_child``'s cached document (the plain audit's) with its findings removed reads as
    every class fixed; the entry no longer matches its sha256, so the child runs again."""
    from swa_repro.sglang import overlay_run

    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path))
    monkeypatch.setattr(overlay_run, "child_parts", lambda module, overlay: {"module": module})
    runs = []

    def child(module, overlay, args, what):
        runs.append(1)
        return {"document": {"findings": [{"path": "extend_paged"}], "driven": [{"path": "extend_paged"}]},
                "seconds": 1.0}

    monkeypatch.setattr(overlay_run, "run_in_child", child)
    doc, _, how = overlay_run.run_child("m", tmp_path, [], "audit")
    entry = next((tmp_path / "results" / "overlay-run").glob("*.json"))
    e = json.loads(entry.read_text())
    e["document"]["document"]["findings"] = []
    entry.write_text(json.dumps(e))
    doc, _, how = overlay_run.run_child("m", tmp_path, [], "audit")
    assert doc["findings"] and how["cache"] == "miss" and len(runs) == 2


def test_a_vllm_cell_with_no_row_is_not_driven_and_exits_1(monkeypatch, capsys):
    """``vllm.audit.verdict`` started from "not affected": a cell with no row at all read as an all-clear."""
    from swa_repro.vllm.audit import core as va
    from swa_repro.vllm.audit import verdict as vv

    fam = {"family": "gemma2", "layers": {"sliding": {"hf_window_left": 4095}}}
    assert vv.cell({"family": fam, "rows": []})["state"] == "not driven"
    doc = {"families": [fam], "audits": {"9.0": {"gemma2": {"family": fam, "rows": [], "platform": {}}}}}
    monkeypatch.setattr(va, "run_release", lambda *a, **k: (doc, 1.0, {"cache": "hit"}))
    assert main(["audit", "--vllm", "0.34.0", "--model", "gemma2", "--gpu", "sm90", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["audits"]["9.0"]["gemma2"]["rows"] == []


# ----------------------------------------------------------------------------- a cache that cannot be written
def _root_a_file(tmp_path, monkeypatch):
    (tmp_path / "c").write_text("not a folder")
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "c"))


def _read_only(tmp_path, monkeypatch):  # as root the bits do not stop a write: the refusal a read-only folder gives
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "c"))

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)  # the one writer the cache writes through


def _disk_full(tmp_path, monkeypatch):
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "c"))
    real_replace = os.replace

    def full(src, dst):
        if str(dst).endswith(".json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full)


@pytest.mark.parametrize("make", [_root_a_file, _read_only, _disk_full])
@pytest.mark.parametrize("cells_api", [False, True])
def test_a_cache_that_cannot_be_written_keeps_the_verdict_with_one_warning(tmp_path, monkeypatch, capsys, make,
                                                                           cells_api):
    """The computed document is returned (not lost), one warning line, no traceback, no temp file left."""
    make(tmp_path, monkeypatch)
    monkeypatch.setattr(cache, "_WARNED", set(), raising=False)
    if cells_api:
        docs, how = cache.cached_cells("k", {"a": 1}, [{"c": 1}, {"c": 2}], lambda cs: [{"v": c["c"]} for c in cs])
        assert docs == [{"v": 1}, {"v": 2}]
    else:
        doc, how = cache.cached("k", {"a": 1}, lambda: {"v": 1})
        assert doc == {"v": 1}
    assert how["cache"] == "unwritable"
    one_warning(capsys.readouterr().err)
    root = tmp_path / "c"
    assert not root.is_dir() or not [p for p in root.rglob("*.tmp")]


def test_write_atomic_removes_its_temp_file_on_failure(tmp_path, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError):
        cache.write_atomic(tmp_path / "e.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_an_audit_with_the_cache_root_a_file_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    """An overlay cannot be made there (results could be recomputed; a release's files cannot)."""
    (tmp_path / "c").write_text("not a folder")
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "c"))
    assert main(["audit", "--sglang", VERSION, "--model", "gemma2", "--gpu", "sm90"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "SWA_REPRO_CACHE" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- overlays, markers, wheels
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def fake_overlay(target: Path, pkg: str, version: str, files: dict, marker: dict, absent=()) -> None:
    """A release's files as its wheel lists them (RECORD with each sha256; ``absent``: listed, left out)."""
    rows = []
    for rel, text in files.items():
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_text(text)
        rows.append(f"{rel},sha256={_b64(text.encode())},{len(text)}")
    rows += [f"{rel},sha256={_b64(b'compiled')},8" for rel in absent]
    dist = target / f"{pkg}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Name: {pkg}\nVersion: {version}\n")
    (dist / "RECORD").write_text("\n".join(rows + [f"{dist.name}/RECORD,,"]) + "\n")
    (target / ".swa-repro-overlay.json").write_text(json.dumps(marker, indent=1))


GEMMA = "class Gemma2ForCausalLM:\n    pass\n\n\nEntryClass = Gemma2ForCausalLM\n"


def _same_size_mtime_back(f: Path):
    st = f.stat()
    f.write_text(f.read_text().replace("pass", "PASS"))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


DAMAGE = {"cut short": lambda f: f.write_text(f.read_text()[:10]),
          "same size, mtime put back": _same_size_mtime_back,
          "removed": lambda f: f.unlink()}


@pytest.mark.parametrize("damage", ["cut short", "same size, mtime put back", "removed", "marker cut short"])
def test_a_damaged_sglang_overlay_is_installed_again_never_used(tmp_path, monkeypatch, damage):
    from swa_repro.sglang import provision

    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path))
    target = provision.overlay_dir("0.5.99")
    fake_overlay(target, "sglang", "0.5.99", {"sglang/__init__.py": "", "sglang/srt/models/gemma2.py": GEMMA},
                 {"sglang": "0.5.99"})
    installs = []

    def install(version, tgt):
        installs.append(version)
        raise UsageError("installed again")

    monkeypatch.setattr(provision, "_install", install)
    assert provision.provision("0.5.99")[1]["cached"] and not installs  # intact: used as it is
    if damage == "marker cut short":
        m = target / provision.MARKER
        m.write_text(m.read_text()[:12])
    else:
        DAMAGE[damage](target / "sglang/srt/models/gemma2.py")
    with pytest.raises(UsageError, match="installed again"):
        provision.provision("0.5.99")
    assert installs == ["0.5.99"]


@pytest.mark.parametrize("damage", ["backend cut short", "marker cut short", ".deps file cut short",
                                    ".deps file same size, mtime put back", ".deps RECORD removed"])
def test_a_damaged_vllm_overlay_is_unpacked_again_never_used(tmp_path, monkeypatch, damage):
    """The release's files and ``.deps``' (vLLM's pure imports this venv lacks, each its own wheel's
    RECORD): a damaged ``.deps`` file ran the child on other code than the key says."""
    from swa_repro.vllm import provision

    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path))
    target = tmp_path / "vllm" / "0.34.0"
    fake_overlay(target, "vllm", "0.34.0", {"vllm/__init__.py": "", provision.BACKEND: GEMMA}, {},
                 absent=("vllm/_C.abi3.so",))
    for pkg in ("openai", "cbor2"):
        fake_overlay(target / ".deps", pkg, "1.0", {f"{pkg}/__init__.py": "class Client:\n    pass\n"}, {})
    dep = target / ".deps" / "openai" / "__init__.py"
    if damage.startswith(".deps"):
        damage = {".deps file cut short": lambda: DAMAGE["cut short"](dep),
                  ".deps file same size, mtime put back": lambda: _same_size_mtime_back(dep),
                  ".deps RECORD removed": lambda: (target / ".deps" / "cbor2-1.0.dist-info" / "RECORD").unlink()}[damage]
    (target / provision.MARKER).write_text(json.dumps({"vllm": "0.34.0", "deps": provision.deps_for(target)}))
    unpacks = []

    def unpack(version, tgt):
        unpacks.append(version)
        raise UsageError("unpacked again")

    monkeypatch.setattr(provision, "_unpack", unpack)
    assert provision.provision("0.34.0")[1]["cached"] and not unpacks
    if callable(damage):
        damage()
    else:
        f = target / (provision.MARKER if damage == "marker cut short" else provision.BACKEND)
        f.write_text(f.read_text()[:12])
    with pytest.raises(UsageError, match="unpacked again"):
        provision.provision("0.34.0")
    assert unpacks == ["0.34.0"]


def test_a_damaged_fixed_sglang_overlay_is_made_again(tmp_path):
    """A fixed copy's files: the release's (RECORD) but the one the fix wrote (the marker's sha256)."""
    from swa_repro.sglang.fix import overlay as fo

    fixed = "fixed backend\n"
    fake_overlay(tmp_path, "sglang", "0.5.99", {"sglang/__init__.py": "", "sglang/b.py": "original\n",
                                                 "sglang/srt/models/gemma2.py": GEMMA}, {})
    (tmp_path / "sglang/b.py").write_text(fixed)
    marker = {"file": "sglang/b.py", "original_sha256": hashlib.sha256(b"original\n").hexdigest(),
              "fixed_sha256": hashlib.sha256(fixed.encode()).hexdigest()}
    (tmp_path / fo.MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k != "original_sha256"}))
    assert fo.intact(tmp_path) is None  # a marker without its keys is no marker
    (tmp_path / fo.MARKER).write_text(json.dumps(marker))
    assert fo.intact(tmp_path) is not None
    (tmp_path / "sglang/srt/models/gemma2.py").write_text("")
    assert fo.intact(tmp_path) is None


KIT_DAMAGE = {"a release file replaced": lambda f: (f.unlink(), f.write_text("x = 1\n")),
              "an edited kit file cut short": None, "the kit marker cut short": None}


@pytest.mark.parametrize("damage", list(KIT_DAMAGE))
def test_a_damaged_kit_copy_is_made_again_never_used(tmp_path, damage):
    """``sglang-kit/`` copies (an overlay with the kit edits) were reused on their marker alone: a file
    damaged there ran the kit on other bytes, cached under the intact key. Each is its wheel's, the
    kit edits' or the fix's (``kit_copy.kit_intact``); a damaged one is made again from the overlay."""
    from swa_repro.sglang.fix import kit_copy
    from swa_repro.sglang.fix import kit_edits as ke

    real = release_overlay("0.5.23")  # read only: its kit's text, copied (never linked) into a fake release
    overlay = tmp_path / "sglang" / "0.5.99"
    fake_overlay(overlay, "sglang", "0.5.99", {"sglang/__init__.py": "", "sglang/srt/models/gemma2.py": GEMMA,
                                               **{p: (real / p).read_text() for p in ke.FILES}}, {"sglang": "0.5.99"})
    dst = kit_copy.kit_overlay(overlay)
    assert kit_copy.kit_intact(dst) and dst.parent == tmp_path / "sglang-kit"
    edited = {p: (dst / p).read_bytes() for p in ke.FILES}
    assert all(edited[p] != (overlay / p).read_bytes() for p in ke.FILES)
    target = {"a release file replaced": dst / "sglang/srt/models/gemma2.py",
              "an edited kit file cut short": dst / ke.DENSE, "the kit marker cut short": dst / kit_copy.KIT_MARKER}[damage]
    if KIT_DAMAGE[damage]:
        KIT_DAMAGE[damage](target)
    else:
        target.write_text(target.read_text()[:40])
    assert not kit_copy.kit_intact(dst)
    assert kit_copy.kit_overlay(overlay) == dst and kit_copy.kit_intact(dst)
    assert (dst / "sglang/srt/models/gemma2.py").read_text() == GEMMA
    assert {p: (dst / p).read_bytes() for p in ke.FILES} == edited
    assert (overlay / "sglang/srt/models/gemma2.py").read_text() == GEMMA  # the overlay never written


def test_a_kit_copy_damaged_through_its_overlay_is_one_line(tmp_path):
    """A file written in place is damaged in the overlay too (hard links): made again, still damaged,
    so one line naming what to delete, never a kit run on it."""
    from swa_repro.sglang.fix import kit_copy
    from swa_repro.sglang.fix import kit_edits as ke

    real = release_overlay("0.5.23")
    overlay = tmp_path / "sglang" / "0.5.99"
    fake_overlay(overlay, "sglang", "0.5.99", {"sglang/__init__.py": "", "sglang/srt/models/gemma2.py": GEMMA,
                                               **{p: (real / p).read_text() for p in ke.FILES}}, {"sglang": "0.5.99"})
    dst = kit_copy.kit_overlay(overlay)
    with open(dst / "sglang/srt/models/gemma2.py", "a") as f:  # in place: the overlay's inode
        f.write("# edited\n")
    with pytest.raises(UsageError, match=r"does not match its wheel's RECORD \(sglang/srt/models/gemma2.py"):
        kit_copy.kit_overlay(overlay)
    assert not dst.exists() and not kit_copy.kit_intact(dst)


def _zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "x" * 4000)


def test_a_truncated_cached_wheel_is_downloaded_again(tmp_path, monkeypatch):
    from swa_repro.vllm import provision
    import subprocess

    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path))
    folder = tmp_path / "wheels" / "vllm"
    folder.mkdir(parents=True)
    whl = folder / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    _zip(whl)
    whl.write_bytes(whl.read_bytes()[:500])
    downloads = []

    def pip(cmd, **k):
        downloads.append(cmd)
        d = Path(cmd[cmd.index("-d") + 1])
        d.mkdir(parents=True, exist_ok=True)
        _zip(d / whl.name)
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(subprocess, "run", pip)
    got = provision.wheel("0.34.0")
    assert len(downloads) == 1 and zipfile.ZipFile(got).namelist() == ["vllm/__init__.py"]


# ----------------------------------------------------------------------------- patch status --vllm
SNIPPET = '''class FlashInferMetadataBuilder:
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        can_use_trtllm = can_use_trtllm_attention(self.num_qo_heads, self.num_kv_heads)
        self.use_trtllm_decode_attention = can_use_trtllm

        # Global hyperparameters shared by all attention layers
        self.global_hyperparameters = infer_global_hyperparameters(
            get_per_layer_parameters(vllm_config, layer_names, FlashInferImpl)
        )
        self.logits_soft_cap = self.global_hyperparameters.logits_soft_cap

    def build(self):
        prefill_use_trtllm = causal and use_trtllm_attention(
            self.num_qo_heads,
        )
'''


@pytest.mark.parametrize("action", [["status"], ["apply", "--in-place"]])
def test_vllm_patch_reads_a_file_missing_one_edit_as_partly_applied(tmp_path, monkeypatch, capsys, action):
    """The cap-route edits applied to both files, then the prefill route's argument line removed
    (its call otherwise whole): not "applied", and apply neither says "nothing to do" nor writes anything."""
    from swa_repro.vllm.fix import fixes as vfix
    from swa_repro.vllm.fix import flashinfer_utils as fix_utils
    from swa_repro.vllm.provision import BACKEND
    from tests.test_vllm_fix_rule import UTILS_SNIPPET

    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise ImportError('the command must not import vllm')\n")
    f, u = site / BACKEND, site / fix_utils.UTILS
    for x in (f, u):
        x.parent.mkdir(parents=True, exist_ok=True)
    u.write_text(fix_utils.edit(UTILS_SNIPPET, "x"))
    lines = vfix.edit(SNIPPET, "x").splitlines(True)
    i = max(k for k, ln in enumerate(lines) if "has_logits_soft_cap=self.logits_soft_cap is not None," in ln)
    f.write_text("".join(lines[:i] + lines[i + 1:]))  # the prefill route's argument gone
    monkeypatch.syspath_prepend(str(site))
    before = sorted(p.name for p in f.parent.iterdir()), f.read_bytes(), u.read_bytes()
    argv = ["patch", *action, "--vllm"]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert "partly applied (missing: prefill route)" in out + err and "nothing to do" not in out + err
    assert "Traceback" not in err
    if action != ["status"]:
        assert rc == 2 and len(err.strip().splitlines()) == 1
    assert (sorted(p.name for p in f.parent.iterdir()), f.read_bytes(), u.read_bytes()) == before


def test_a_fixed_copy_holding_other_fix_code_than_this_process_makes_is_made_again(tmp_path):
    """The fixed copy's key hashes the fix code on disk; a copy made by a process that imported older
    fix code carries the current key and the old edit (seen: 0.5.20's copy without the per-wrapper mask
    buffers, made by a test run across a merge). Its marker is whole and its files match it, so only
    the bytes the fixes make now tell: the copy is made again, never audited."""
    import os
    import shutil

    from conftest import release_overlay
    from swa_repro.engine.patching import sha256_hex
    from swa_repro.sglang.fix import apply_fixes
    from swa_repro.sglang.fix import overlay as fo

    shipped = release_overlay("0.5.23")
    overlay = tmp_path / "sglang" / "0.5.23"
    shutil.copytree(shipped, overlay, copy_function=os.link, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", fo.MARKER))
    names = ["eagle_verify_window"]
    dst, info = fo.fixed_overlay("0.5.23", names, overlay)
    now = (dst / info["file"]).read_bytes()
    assert b"cuda_graph_custom_mask[i]" in now
    # what the old code made: the tree window without the per-wrapper buffers (the alternative kept for
    # comparison), written as a whole copy with its marker agreeing
    old = (overlay / info["file"]).read_text()
    stale = apply_fixes(old, names).replace("self.cuda_graph_custom_mask[i]", "self.cuda_graph_custom_mask").encode()
    target = dst / info["file"]
    target.unlink()
    target.write_bytes(stale)
    (dst / fo.MARKER).write_text(json.dumps({**info, "fixed_sha256": sha256_hex(stale)}))
    assert fo.intact(dst) is not None  # whole and self-consistent: the old check used it
    again, info2 = fo.fixed_overlay("0.5.23", names, overlay)
    assert again == dst and (again / info2["file"]).read_bytes() == now and info2["fixed_sha256"] == sha256_hex(now)
