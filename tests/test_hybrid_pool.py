"""sglang's hybrid SWA KV pool, driven with the release's own classes (issue #41: the "unknown (hybrid SWA
pool)" cells), against oracles outside ``audit.hybrid_pool``:

* a hand-built two-request batch whose SWA slot per position is computed by hand from the release's
  source read as text: the allocator's free list starts at slot 1 (allocator/token.py ``clear``), a
  request's slots are taken in order, and a decoding request's positions below the eviction threshold
  (``free_swa_out_of_window_slots``' last ``evict_threshold = ...``, evaluated on the batch's numbers)
  read slot 0 (``clear_full_to_swa_mapping``);
* the verdict: a cell driven on the pool gets an ordinary state, one that was not keeps
  "unknown (hybrid SWA pool)" with why;
* 0.5.23's BeamForCausalLM (hybrid SWA) through the family child: a verdict, decode exact on the pool,
  and the verify reading exactly the evicted positions' slots (counted from the batch's lengths).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
import tempfile
from pathlib import Path

import pytest
from conftest import release_overlay, skip_module_unless

skip_module_unless("torch")

SEQS, WINDOW, FOREIGN = (12, 5), 4, 7


def _threshold_rule(overlay) -> str:
    """The eviction threshold as text, read with ``ast`` from the release's file: the last
    ``evict_threshold = ...`` of ``free_swa_out_of_window_slots`` that is not the ``retain_floor`` clamp
    (the default branch: a radix cache with prefix sharing; 0.5.14: no page-margin drop), or before
    0.5.14 the second argument of ``ScheduleBatch._evict_swa``'s ``new_swa_evicted_seqlen = max(...)``."""
    srt = overlay / "sglang" / "srt"
    fn = next((n for n in ast.parse((srt / "mem_cache" / "common.py").read_text()).body
               if isinstance(n, ast.FunctionDef) and n.name == "free_swa_out_of_window_slots"), None)
    if fn is None:
        batch = ast.parse((srt / "managers" / "schedule_batch.py").read_text())
        fn = next(n for n in ast.walk(batch) if isinstance(n, ast.FunctionDef) and n.name == "_evict_swa")
        (rule,) = [ast.unparse(n.value.args[1]) for n in ast.walk(fn) if isinstance(n, ast.Assign)
                   and [ast.unparse(t) for t in n.targets] == ["new_swa_evicted_seqlen"]
                   and isinstance(n.value, ast.Call)]
        return rule.replace("self.tree_cache.", "")
    rules = [ast.unparse(n.value) for n in sorted(ast.walk(fn), key=lambda n: getattr(n, "lineno", 0))
             if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["evict_threshold"]
             and "evict_threshold" not in ast.unparse(n.value)]
    assert rules, "the release's eviction threshold was not found"
    return rules[-1]


def _hand_view(overlay, seqs, window: int, decode: bool) -> list[list[int]]:
    """Each request's SWA slot per position, by hand: the free list starts at 1 (read in token.py), a
    foreign request takes the first FOREIGN, then each request its positions in order; a decoding
    request's positions below the release's threshold (pre_len = seq - 1) read slot 0."""
    mem = overlay / "sglang" / "srt" / "mem_cache"
    token = next(t for p in (mem / "allocator" / "token.py", mem / "allocator.py") if p.is_file()
                 for t in [p.read_text()] if "class TokenToKVPoolAllocator" in t)
    assert re.search(r"self\.free_pages = torch\.arange\(\s*1,", token)  # slot 0 is the padding slot
    rule = _threshold_rule(overlay)
    out, nxt = [], 1 + FOREIGN
    for n in seqs:
        thr = eval(rule, {"pre_len": n - 1, "sliding_window_size": window, "page_size": 1, "max": max,
                          "ceil_align": lambda x, a: -(-x // a) * a}) if decode else 0
        out.append([0 if p < thr else nxt + p for p in range(n)])
        nxt += n
    return out


MODES = ("decode", "extend")


@functools.cache
def _probes(version: str) -> dict:
    """``{mode: probe}``: one child per release for both modes (its cost is importing the release's
    pools; cached by content, so a second process reads it)."""
    from swa_repro.sglang.overlay_run import run_child

    doc, _, _ = run_child("swa_repro.sglang.audit.hybrid_pool", release_overlay(version),
                          ["--seqs", ",".join(map(str, SEQS)), "--window", str(WINDOW), "--modes", ",".join(MODES)],
                          "hybrid pool probe")
    return doc["by_mode"]


# 0.5.14 is in the release matrix: its pool and eviction are 0.5.23's classes and function (its threshold a page
# lower, read by the same _threshold_rule branch). The other route (ScheduleBatch._evict_swa, the allocator in
# swa_memory_pool.py) is 0.5.10's in make test, a release make test installs and compiles anyway
# (test_server_run's ServerArgs child, test_swa_archs, test_fallback_cells); 0.5.12, on the same route, was a
# release of its own for this probe alone (its overlay and its compile) and is in the release matrix.
@pytest.mark.parametrize("version", ["0.5.23", pytest.param("0.5.14", marks=pytest.mark.matrix),
                                     pytest.param("0.5.12", marks=pytest.mark.matrix), "0.5.10"])
@pytest.mark.parametrize("mode", MODES)
def test_a_two_request_batch_reads_the_swa_slots_the_releases_rules_give(version, mode):
    """The release's SWAKVPool and allocator (0.5.23; 0.5.14, whose threshold is a page lower; 0.5.10 and 0.5.12,
    whose allocator and eviction live elsewhere) around two requests: each position's SWA slot as the release translates it equals the hand count;
    a decode frees the first request's out-of-window slots (read as slot 0), an extend frees none."""
    overlay = release_overlay(version)
    doc = _probes(version)[mode]
    assert doc["facts"]["pool"] == "SWAKVPool" and doc["facts"]["allocator"] == "SWATokenToKVPoolAllocator"
    want = _hand_view(overlay, SEQS, WINDOW, mode == "decode")
    assert doc["view"] == want
    assert doc["facts"]["freed"] == sum(row.count(0) for row in want)
    assert (doc["facts"]["freed"] > 0) == (mode == "decode")


def test_one_child_probes_every_mode(monkeypatch, tmp_path):
    """The probe's child takes every mode at once (one import of the release's pools for both, not a child
    per mode): each mode's document is the single-mode probe's, and a bad mode is refused by the parser."""
    from swa_repro.sglang.audit import hybrid_pool

    monkeypatch.setattr(hybrid_pool, "probe", lambda seqs, window, mode: {"mode": mode, "seqs": seqs, "window": window})
    monkeypatch.setattr("swa_repro.sglang.audit.family_build.vllm_placeholder", lambda: None)
    monkeypatch.setattr("swa_repro.sglang.releases.ensure_sgl_kernel", lambda: None)
    monkeypatch.setattr("swa_repro.engine.bytecode.share", lambda overlay: None)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    out = tmp_path / "out.json"
    args = ["--overlay", str(tmp_path), "--out", str(out), "--seqs", "3,2", "--window", "4"]
    assert hybrid_pool.main([*args, "--modes", "decode,extend"]) == 0
    assert json.loads(out.read_text()) == {"by_mode": {m: {"mode": m, "seqs": [3, 2], "window": 4} for m in MODES}}
    with pytest.raises(SystemExit):
        hybrid_pool.main([*args, "--modes", "decode,prefill"])


# ----------------------------------------------------------------------------- the verdict
def _family(pooled: bool, status: str = "driven") -> dict:
    path = {"kind": "sliding", "path": "extend_ragged_no_prefix", "status": status, "verdict": "extra",
            "cap": "none", "why": None if status == "driven" else "sglang raised: IndexError (swa.py:485)"}
    if pooled:
        path["hybrid_pool"] = {"pool": "SWAKVPool", "allocator": "SWATokenToKVPoolAllocator", "layer_pool": "swa",
                               "foreign_slots": 7, "freed": 0, "eviction": "sglang/srt/mem_cache/common.py:75"}
    return {"family": "BeamForCausalLM", "paths": [path], "serving": {"default_prefill": "ragged",
                                                                      "flashinfer_kept": True},
            "build": {"model_class": "BeamForCausalLM", "model_config": {"is_hybrid_swa": True}}}


def test_a_cell_driven_on_the_hybrid_pool_gets_an_ordinary_verdict():
    """Runs driven on the release's hybrid pool: the state is the one they show (no "unknown"), and the
    note says the pool and the eviction it was judged with; runs not on it keep HYBRID and say why."""
    from swa_repro.sglang.audit import family_verdict as fr

    a = fr.answer(_family(True), "sm90")
    assert a["state"] == "affected on the default path" == fr._answer(_family(True), "sm90")["state"]
    assert "judged on sglang's hybrid SWA KV pool" in a["note"] and "common.py:75" in a["note"]
    assert "ordinary_pool" not in a
    b = fr.answer(_family(False), "sm90")
    assert b["state"] == fr.HYBRID and b["ordinary_pool"] == "affected on the default path"
    c = fr.answer(_family(True, status="sglang raised"), "sm90")
    assert c["state"] == fr.HYBRID and "IndexError" in c["why"][0]


# ----------------------------------------------------------------------------- 0.5.23, the real model
def _content_file(doc: dict) -> Path:
    """``doc`` as JSON in a file named by its content: the child's arguments are its cache key, so a path
    that changes every run (pytest's tmp_path) made a warm suite run the child again."""
    text = json.dumps(doc, default=str, sort_keys=True)
    path = Path(tempfile.gettempdir()) / f"swa-repro-smalls-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def test_the_smalls_file_is_named_by_its_content():
    """The Beam child's ``--smalls-file`` path is part of its cache key: the same content, the same path
    (a warm suite reads the child's result), another content another path (never a stale result)."""
    a, b = {"BeamForCausalLM": {"sliding_window": 8}}, {"BeamForCausalLM": {"sliding_window": 16}}
    assert _content_file(a) == _content_file(dict(a)) != _content_file(b)
    assert json.loads(_content_file(a).read_text()) == a and json.loads(_content_file(b).read_text()) == b


@pytest.mark.slow
def test_0_5_23_beam_on_the_hybrid_pool_gets_a_verdict():
    """BeamForCausalLM (0.5.23 ``is_hybrid_swa_model``) through the family child at its published
    window: every sliding run is driven on the hybrid pool; decode (the window trimmed to W + 1 keys)
    is exact after the release freed the out-of-window slots; the EAGLE verify reads every committed
    position, and on this pool the evicted ones come back as slots the request no longer holds:
    exactly ``committed - 1 - W`` of its first request (pre_len ``committed - 1``)."""
    pytest.importorskip("transformers")
    from swa_repro.sglang.audit import arch_cells
    from swa_repro.sglang.audit import family_verdict as fr
    from swa_repro.sglang.audit.family_run import MODULE
    from swa_repro.sglang.overlay_run import run_child

    overlay = release_overlay("0.5.23")
    smalls, _ = arch_cells.plan("0.5.23", overlay)
    smalls_file = _content_file({"BeamForCausalLM": smalls["BeamForCausalLM"]["small"]})
    doc, _, _ = run_child(MODULE, overlay, ["--families", "BeamForCausalLM", "--gpus", "sm90", "--paths",
                                            "decode,target_verify_eagle", "--smalls-file", str(smalls_file)],
                          "hybrid family audit")
    (f,) = doc["by_gpu"]["sm90"]
    assert f["build"]["model_config"]["is_hybrid_swa"] is True
    runs = {(r["path"], r["kind"]): r for r in f["paths"]}
    w, committed = f["build"]["runner_window"], f["config"]["sliding_window"] + 256
    dec, ver = runs["decode", "sliding"], runs["target_verify_eagle", "sliding"]
    assert dec["hybrid_pool"]["layer_pool"] == "swa" and dec["hybrid_pool"]["freed"] == committed - w
    assert dec["verdict"] == "exact"
    assert ver["hybrid_pool"]["freed"] == committed - 1 - w
    assert ver["keys"]["eager"]["foreign_keys"] == committed - 1 - w
    a = fr.answer({**f, "serving": {"default_prefill": "ragged", "flashinfer_kept": True}}, "sm90")
    assert a["state"] == "only with speculative decoding" and "hybrid SWA KV pool" in a["note"]
