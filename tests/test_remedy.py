"""Issue #42: one remedy, decided by the audit (``sglang.audit.family_fix.remedy``) and used by ``doctor
--model`` and notebook 07 (``notebook.family_answer``), confirmed by the audit of the release with it; the
exit status for CI (``core.exit_status``); the first lines that never say "fixed" for a backend still
affected; the vLLM audit's answer in short lines with what to do; ``--fix all,NAME``; ``--help``'s purpose.

The sweep reads the committed family table (``docs/audit/families.json``: every family x GPU class x
release, and 0.5.23 with ``--fix all``) and, for 0.5.20 and 0.5.23, the audits of one child per release
(shipped, and with the remedy's fixes), content-cached: never one audit per cell. 0.5.20's sweep is in the
release matrix (``make test-matrix``), and so are doctor's and notebook 07's cohere2/sm100 on it: ``make test``
asks them of 0.5.23, whose cells the sweep has made (one release's children, never a second release's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swa_repro.cli import main
from swa_repro.core.exit_status import FAIL_ON, exit_status
from swa_repro.engine.families import GPU_CLASSES
from swa_repro.notebook import family_answer as FA
from swa_repro.sglang.audit.family_fix import fix_names, remedy, remedy_text
from swa_repro.sglang.audit.family_verdict import HYBRID, LAYER_NOT_HF
from swa_repro.sglang.fix import ALL, parse_names

REPO = Path(__file__).resolve().parents[1]
TABLE = json.loads((REPO / "docs" / "audit" / "families.json").read_text())
SWEPT = ("0.5.20", "0.5.23")


def _cells(releases=None):
    return [(r["sglang"], r["gpu"], f, c) for r in TABLE["rows"] if releases is None or r["sglang"] in releases
            for f, c in r["cells"].items()]


# ----------------------------------------------------------------------------- --fix all beside names
def test_fix_all_beside_the_names_it_includes_is_all():
    """The audit's remedy spells out what ``all`` includes; that spelling is a valid ``--fix``."""
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang.patch.cli import _target_file

    assert parse_names("all,commandr_window_hook,sm100_no_cutlass_window") == ALL
    assert fix_names({"fix": ["all", "commandr_window_hook"]}) == ALL and fix_names({"fix": None}) == ()
    assert _target_file("all,commandr_window_hook", ALL) == "srt/layers/attention/flashinfer_backend.py"
    with pytest.raises(UsageError, match=r"unknown bogus; choose all \(every fix\) or from"):
        parse_names("all,bogus")


# ----------------------------------------------------------------------------- the exit status
@pytest.mark.parametrize("state, any_, default, never", [
    ("not affected", 0, 0, 0), ("flashinfer refused", 0, 0, 0), ("refused", 0, 0, 0),
    ("affected on the default path", 1, 1, 0), ("affected", 1, 1, 0), ("layer != HF", 1, 1, 0),
    ("only with flags", 1, 0, 0), ("only with speculative decoding", 1, 0, 0),
    ("not driven", 1, 1, 1), ("not built", 1, 1, 1), ("unknown (not driven)", 1, 1, 1), (HYBRID, 1, 1, 1),
    ("a state added later", 1, 1, 1),
])
def test_exit_status_of_each_state(state, any_, default, never):
    assert [exit_status([state], f) for f in FAIL_ON] == [any_, default, never]
    assert exit_status(["not affected", state]) == any_ and exit_status([]) == 0


def test_every_state_the_table_has_is_placed():
    """A committed cell's state is one the exit status knows (an unknown one would fail every run)."""
    from swa_repro.core.exit_status import DEFAULT_PATH, OK, OTHER_PATHS

    # arch_cells' decided cells: answers the audit could not drive, exit 1 under every --fail-on
    from swa_repro.sglang.audit.family_verdict import NOT_DRIVEN

    known = OK | DEFAULT_PATH | OTHER_PATHS | {"not built", "unknown (not driven)", HYBRID, "crashes on FlashInfer",
                                               "fallback: not audited", NOT_DRIVEN}
    assert exit_status(["crashes on FlashInfer"], "never") == exit_status(["fallback: not audited"], "never") == 1
    assert exit_status([NOT_DRIVEN], "never") == 1  # a built column with no path driven (NemotronH's defaults)
    assert {c["state"] for *_, c in _cells()} <= known


def test_help_says_what_the_tool_is_for(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    first = text.split("\n\n")[1].replace("\n", " ")  # the line after usage
    assert first.startswith("Finds and fixes sliding-window and soft-cap attention errors in sglang's and vLLM's "
                            "FlashInfer backends") and "exit status: 0 not affected, 1 affected" in text.replace("\n", " ")


# ----------------------------------------------------------------------------- layer != HF, as vLLM says it
def _cohere2_fixed(verdict_vs_layer: str) -> dict:
    """A family document as ``audit.family`` writes it for Cohere2 with the hook: the runner plans the
    layers' window (HF's inclusive 4096), one key more than transformers' mask (4095) on every path."""
    runs = [{"status": "driven", "kind": "sliding", "path": p, "verdict": "extra", "verdict_vs_layer": verdict_vs_layer,
             "cap": "none"} for p in ("extend_ragged_no_prefix", "decode")]
    runs.append({"status": "driven", "kind": "full", "path": "decode", "verdict": "exact", "cap": "none"})
    return {"family": "cohere2", "paths": runs, "serving": {"default_backend": {"sm90": "flashinfer"}},
            "kinds": {"sliding": {"layer_window": 4096, "intended_window": 4095},
                      "full": {"layer_window": -1, "intended_window": -1}}}


def test_a_layer_asking_another_window_than_hf_is_layer_not_hf_as_in_vllm():
    """Issue #40 point 4: every kernel told what the layer asks, the layer asking HF's inclusive count:
    ``layer != HF`` (vllm.audit.verdict's state and words), a finding for ``--fail-on any`` and ``default`` as
    there; no fix offered. A kernel told something else is still affected, with the window line beside."""
    from swa_repro.sglang.audit.family_verdict import answer
    from swa_repro.vllm.audit.verdict import judge

    a = answer(_cohere2_fixed("exact"), "sm90")
    assert a["state"] == LAYER_NOT_HF and a["why"] == ["sliding layer asks window_left 4096, transformers' mask 4095"]
    doc = {"family": {"layers": {"sliding": {"hf_window_left": 4095}}}}
    row = {"layer": "sliding", "path": "decode", "asked": {"window_left": 4096}, "kernels": [{"kernel": "k", "differs": []}]}
    assert judge(doc, [row])["state"] == a["state"] and judge(doc, [row])["why"] == a["why"]  # both engines alike
    assert [exit_status([a["state"]], f) for f in FAIL_ON] == [1, 1, 0]
    r = remedy("cohere2", {**a, "layer_window": {"sliding": 4096}}, "sm90")
    assert r["fix"] is None and "no fix in swa-repro" in r["instead"] and "4096" in r["instead"]
    b = answer(_cohere2_fixed("extra"), "sm90")
    assert b["state"] == "affected on the default path" and b["why"][-1] == a["why"][0]


# ----------------------------------------------------------------------------- one remedy: the committed table
def _fake_family(family, cell, gpu):
    """What ``family_run.audit_release`` gives ``family_answer`` for a cell: its answer and the audit's remedy."""
    return {"family": family, "answer": {"state": cell["state"]}, "paths": [], "remedy": remedy(family, cell, gpu)}


@pytest.mark.parametrize("gpu, family, cell", [(g, f, c) for v, g, f, c in _cells(("0.5.23",))
                                               if f in TABLE["fixed"]["cells"][g]],  # the --fix all table's columns
                         ids=lambda x: x if isinstance(x, str) else "")
def test_doctor_and_notebook_take_the_audits_remedy_and_it_is_confirmed(gpu, family, cell, monkeypatch):
    """0.5.23 from the committed table alone: ``fix_answer`` (doctor --model, notebook 07) recommends the
    audit's remedy, audits the release with exactly its fixes, and the committed ``--fix all`` table
    (the audit with them) says not affected wherever the remedy is a fix."""
    fixed_cells = TABLE["fixed"]["cells"][gpu]
    asked = []

    def audited(release, model, g, fixes=None):
        asked.append(tuple(fixes))
        return {"family": model, "answer": {"state": fixed_cells[model]["state"]}, "paths": []}

    monkeypatch.setattr(FA, "family_audit", audited)
    r = remedy(family, cell, gpu)
    fx = FA.fix_answer("0.5.23", family, gpu, _fake_family(family, cell, gpu))
    assert fx["remedy"] == r and fx["command"] == remedy_text(r)
    assert FA.fix_sentence(fx).startswith(remedy_text(r) if r["fix"] else r["instead"] or "nothing to fix")
    if r["fix"]:
        assert asked == [ALL] == [fix_names(r)] and TABLE["fixed"]["command"].endswith("--fix all")
        # not affected, or layer != HF where the model file's window is not HF's (Cohere2's, kept on purpose)
        assert fx["fixed_state"] in ("not affected", LAYER_NOT_HF), (family, gpu, fx)
        assert fx["exact"], (family, gpu, fx)  # either end state is what the fixes can reach
        assert ("commandr_window_hook" in r["fix"]) == (family == "cohere2") and \
            ("sm100_no_cutlass_window" in r["fix"]) == (gpu == "sm100")
    else:
        assert asked == [] and (cell["state"] == "not affected" or r["instead"]), (family, gpu, r)


def test_cohere2_on_sm100_gets_the_family_and_gpu_fixes(monkeypatch):
    """Issue #42 item 1: the old picker (``candidate_fixes``, from the backend file's fix states) never
    added the model file's or the GPU class's fixes; the audit's remedy names them, and the release is
    audited again with them."""
    row = next(r for r in TABLE["rows"] if r["sglang"] == "0.5.20" and r["gpu"] == "sm100")
    cell = row["cells"]["cohere2"]
    asked = []
    monkeypatch.setattr(FA, "family_audit", lambda *a, fixes=None: asked.append(fixes) or {
        "answer": {"state": "not affected"}, "paths": []})
    fx = FA.fix_answer("0.5.20", "cohere2", "sm100", {**_fake_family("cohere2", cell, "sm100"),
                                                      "paths": [{"status": "driven", "kind": "sliding", "path": "decode",
                                                                 "verdict": "extra", "cap": "none"}]})
    assert fx["fixes"] == ["all", "commandr_window_hook", "sm100_no_cutlass_window"] and asked == [ALL]
    assert FA.fix_sentence(fx) == ("swa-repro patch --fix all (it includes commandr_window_hook, "
                                   "sm100_no_cutlass_window): the audit of the release with it says not affected")
    assert not hasattr(FA, "candidate_fixes") and not hasattr(FA, "needed_fixes")  # no second decider


@pytest.mark.parametrize("release, gpu, family, cell", [x for x in _cells() if x[3]["state"] in (
    "affected on the default path", "only with flags", "only with speculative decoding")],
    ids=lambda x: x if isinstance(x, str) else "")
def test_every_affected_cell_of_the_table_gets_fixes_that_apply_or_is_told_to_upgrade(release, gpu, family, cell):
    """The fixes are written against 0.5.14-0.5.23's files (``fix``); an older release's remedy was
    ``patch --fix all``, which refuses its file: it is told to upgrade instead, with the command to ask."""
    from swa_repro.core.versions import sglang_release_key as parse

    r = remedy(family, cell, gpu, release)
    if (cell.get("note") or "").startswith("served through sglang's Transformers fallback"):  # no fix edits it
        assert r["fix"] is None and r["instead"].startswith("no fix in swa-repro: sglang's Transformers fallback")
    elif cell["layer_window"].get("sliding") == -1:  # the model file's: no fix in any release
        assert r == remedy(family, cell, gpu) and r["fix"] is None and "--context-length" in r["instead"]
    elif parse(release) < parse("0.5.14"):
        assert r["fix"] is None and r["instead"].startswith(f"no swa-repro fix for sglang {release}: ")
        assert r["instead"].endswith(f"swa-repro audit --sglang 0.5.23 --model {family} --gpu {gpu}")
    else:
        assert r == remedy(family, cell, gpu) and fix_names(r) == ALL


# ----------------------------------------------------------------------------- the sweep: 0.5.20 and 0.5.23
class _Audits(dict):
    """``{(release, fixed): {gpu: document}}``, each made on first use: one child per release for every
    family and GPU class, shipped or with ``--fix all`` (content-cached cells: a warm cache reads them).
    On first use, not up front: ``make test`` sweeps 0.5.23 only (0.5.20's sweep is in the matrix), and
    the tests of one cell compute (or read) just that cell."""

    def __missing__(self, key):
        from conftest import release_families

        v, fixed = key
        self[key] = release_families(v, ALL if fixed else None)
        assert set(self[key]) == set(TABLE["gpus"])
        return self[key]


@pytest.fixture(scope="module")
def audits():
    return _Audits()


@pytest.mark.slow
# 0.5.20 is in the release matrix (0.5.15-0.5.22: docs/development.md): its sweep (every family x GPU class,
# shipped and fixed: two children) runs in make test-matrix, with the tests below on its cohere2/sm100 cell.
@pytest.mark.parametrize("release", [pytest.param(v, marks=pytest.mark.matrix) if v != "0.5.23" else v for v in SWEPT])
def test_sweep_doctor_notebook_and_audit_give_one_remedy_the_audit_confirms(release, audits, monkeypatch):
    """Every family x GPU class of ``release``: the audit's remedy (as ``audit --model`` stores and
    prints it) is the committed table's, doctor's answer (``family_answer.verdict``, notebook 07's
    functions) names the same, and the audit of the release with its fixes says not affected."""
    docs = {fixed: {g: {f["family"]: f for f in d["families"]} for g, d in audits[release, fixed].items()}
            for fixed in (False, True)}
    monkeypatch.setattr(FA, "family_audit", lambda v, model, g, fixes=None: {
        **docs[bool(fixes)][g][model], "release": {}, "gpu": g})
    committed = {(r["gpu"], f): c for r in TABLE["rows"] if r["sglang"] == release for f, c in r["cells"].items()}
    seen = 0
    for g in TABLE["gpus"]:
        for family, f in docs[False][g].items():
            r = f["remedy"]
            assert r == remedy(family, committed[g, family], g, release), (release, g, family)
            v = FA.verdict(family, g, release)
            fx = v["fix"]
            assert fx["remedy"] == r and fx["command"] == remedy_text(r)
            assert exit_status([v["answer"]["state"]]) == (v["answer"]["state"] != "not affected"
                                                          and v["answer"]["state"] != "flashinfer refused")
            if r["fix"]:
                assert fix_names(r) == ALL and fx["fixed_state"] in ("not affected", LAYER_NOT_HF) and fx["exact"], \
                    (g, family, fx)
                seen += 1
            else:
                assert r["instead"] or f["answer"]["state"] == "not affected", (g, family)
    assert seen >= 3 * len(TABLE["gpus"])  # gemma2, gemma3, cohere2 on every class


# 0.5.20 (issue #42's release) is in the release matrix: on 0.5.23 the same cell (affected as shipped, layer != HF
# with the remedy: the committed table) is read from the sweep's children; 0.5.20's would be two children more.
ISSUE_RELEASES = [pytest.param("0.5.20", marks=pytest.mark.matrix), "0.5.23"]


@pytest.mark.slow
@pytest.mark.parametrize("release", ISSUE_RELEASES)
def test_doctor_model_cohere2_sm100_recommends_the_audits_remedy_and_exits_1(release, monkeypatch, capfd):
    """``doctor --model cohere2 --gpu sm100`` on an installed ``release``: the audit's remedy, confirmed,
    and exit 1 (affected as shipped); ``--fail-on never``: 0."""
    from swa_repro.core import mode
    from swa_repro.notebook import doctor

    real = mode.dist_version
    monkeypatch.setattr(mode, "dist_version", lambda d: release if d == "sglang" else real(d))
    monkeypatch.setattr(doctor, "doctor_report", dict)
    monkeypatch.setattr(doctor, "_print_report", lambda r: None)
    capfd.readouterr()
    assert main(["doctor", "--model", "cohere2", "--gpu", "sm100"]) == 1
    out = capfd.readouterr().out
    assert "ANSWER: affected on the default path" in out
    assert ("WHAT TO DO: swa-repro patch --fix all (it includes commandr_window_hook, sm100_no_cutlass_window): the audit "
            "of the release with it says layer != HF (sliding layer asks window_left 4096, transformers' mask 4095") in out
    assert main(["doctor", "--model", "cohere2", "--gpu", "sm100", "--fail-on", "never"]) == 0


@pytest.mark.slow
def test_audit_exit_status_and_first_line(capfd):
    """Issue #42's checks: ``audit --sglang 0.5.23 --model gemma2`` exits 1 and its first line does not
    say "backend fixed"; with the remedy's fixes (``all`` beside names) cohere2 on sm100 is layer != HF (its
    layers' own window, HF's count), a finding for --fail-on any as in vLLM's audit, 0 with --fail-on never."""
    capfd.readouterr()
    assert main(["audit", "--sglang", "0.5.23", "--model", "gemma2"]) == 1
    out = capfd.readouterr().out
    first = out.splitlines()[0]
    assert "backend fixed" not in out and "backend PR #31501 applied (the window on the paged-only prefill" in first
    assert "ANSWER: affected on the default path" in out and "WHAT TO DO: swa-repro patch --fix all" in out
    assert main(["audit", "--sglang", "0.5.23", "--model", "gemma2", "--fail-on", "never"]) == 0
    capfd.readouterr()
    fixed = ["audit", "--sglang", "0.5.23", "--model", "cohere2", "--gpu", "sm100", "--fix",
             "all,commandr_window_hook,sm100_no_cutlass_window"]
    assert main(fixed) == 1
    out = capfd.readouterr().out
    assert out.startswith("PATCHED COPY (swa-repro patch --fix ") and "ANSWER: layer != HF" in out
    assert main([*fixed, "--fail-on", "never"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("release", ISSUE_RELEASES)
def test_notebook_07_cohere2_sm100_recommends_the_audits_remedy(release, tmp_path):
    """Notebook 07 with cohere2 on sm100 (the issue's 0.5.20; 0.5.23): the audit's remedy, its check
    passing (the issue's Run All ended in an AssertionError). The suite's one run of notebook 07: it also
    holds what test_family_answer's run of it held (its run on the pinned baseline is in the release
    matrix): model mode said, its checks, the three keys figures, the answer."""
    from swa_repro.notebook.places import NOTEBOOKS_DIR
    from swa_repro.notebook.runner import ensure_kernel, run_one

    params = {"model": "cohere2", "gpu": "sm100", "sglang_release": release}
    r = run_one(NOTEBOOKS_DIR / "07_my_model_my_gpu.py", tmp_path, "model", params, ensure_kernel(), 900)
    assert r["status"] == "ok" and r["checks_failed"] == 0, r.get("error")
    assert r["mode"] == "model" and r["checks_passed"] >= 3
    assert {"07_my_model_my_gpu_keys.png", "07_my_model_my_gpu_keys_zoomed.png",
            "07_my_model_my_gpu_keys_fixed.png"} <= {str(f).rsplit("/", 1)[-1] for f in r["figures"]}
    html = (tmp_path / "07_my_model_my_gpu.html").read_text()
    assert "Mode: model" in html and "the CPU audit is all there is" in html
    assert "ANSWER: affected on the default path" in html
    assert ("swa-repro patch --fix all (it includes commandr_window_hook, sm100_no_cutlass_window): the audit of "
            "the release with it says layer != HF (sliding layer asks window_left 4096") in html


# ----------------------------------------------------------------------------- the vLLM audit's answer
def _vllm_doc(capped=True, default="FLASH_ATTN", error=None):
    """One cell as ``vllm.audit.drive`` documents it: gemma2, the prefill on the planned wrapper, every decode
    on XQA, told no soft cap where ``capped``."""
    fam = {"family": "gemma2", "hf_sliding_window": 4096, "hf_cap": 50.0, "head_dim": 256, "how": "Gemma2Config",
           "sources": {"window": "vllm/model_executor/models/gemma2.py:156"},
           "layers": {"full": {"hf_window_left": -1}, "sliding": {"hf_window_left": 4095}}}
    rows = []
    for layer, w in (("full", -1), ("sliding", 4095)):
        for path in ("prefill", "decode", "mixed", "cuda_graph_decode", "spec_decode"):
            asked = {"window_left": w, "logits_soft_cap": 50.0, "sm_scale": 0.0625, "sinks": False}
            direct = path != "prefill"
            rows.append({"layer": layer, "path": path, "asked": asked, "kernels": [{
                "kernel": "xqa_batch_decode_with_kv_cache" if direct else "BatchPrefillWithPagedKVCacheWrapper",
                "how": "call" if direct else "run", "told": {**asked, "logits_soft_cap": 0.0 if direct else 50.0},
                "differs": ["logits_soft_cap 50.0 asked, not passed told"] if direct and capped else []}]})
    pl = {"order": ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"], "default": default, "default_checked": False,
          "flashinfer_valid": True, "flashinfer_reasons": [], "source": "vllm/platforms/cuda.py:80"}
    return {"family": fam, "rows": rows, "platform": pl, "kv_cache_layout": "LBNHC",
            "backend_file": "/o/vllm/v1/attention/backends/flashinfer.py", **({"error": error} if error else {})}


def test_vllm_answer_is_short_lines_naming_the_fix_and_the_default_backend():
    """Issue #42 item 7: the verdict was one ~1,000-character line, named no remedy, and did not say
    that FlashInfer is not vLLM's default on sm90."""
    from swa_repro.vllm.audit.core import render
    from swa_repro.vllm.audit.verdict import FLASHINFER_FLAG

    lines = render(_vllm_doc(), "0.34.0", GPU_CLASSES["sm90"])
    answer = lines[next(i for i, ln in enumerate(lines) if ln.startswith("  ANSWER: ")):]
    assert answer[0] == "  ANSWER: affected" and max(map(len, answer)) <= 120, max(answer, key=len)
    assert "    ... 2 more (--json has them all)" in answer  # 8 findings, 6 shown
    assert "  NOTE: FlashInfer is not vLLM 0.34.0's default backend on sm90 (FLASH_ATTN is):" in answer
    assert f"        this answer holds only for a server started with {FLASHINFER_FLAG}" in answer
    todo = answer[answer.index(next(ln for ln in answer if ln.startswith("  WHAT TO DO: "))):]
    assert todo[0] == "  WHAT TO DO: swa-repro patch apply --vllm --fix cap-route --in-place"
    assert todo[2] == "              check it: swa-repro audit --vllm 0.34.0 --fix cap-route"
    fixed = render(_vllm_doc(capped=False, default="FLASHINFER"), "0.34.0 with --fix cap-route", GPU_CLASSES["sm100"])
    assert "  ANSWER: not affected" in fixed and not any("WHAT TO DO" in ln or "not vLLM" in ln for ln in fixed)


@pytest.mark.parametrize("doc, fail_on, rc", [
    (_vllm_doc(), "any", 1), (_vllm_doc(), "default", 1), (_vllm_doc(), "never", 0),
    (_vllm_doc(capped=False), "any", 0), (_vllm_doc(error="RuntimeError: no driver"), "never", 1),
])
def test_vllm_audit_exit_status(doc, fail_on, rc, monkeypatch, capsys):
    from swa_repro.vllm.audit import core as audit

    monkeypatch.setattr(audit, "run_release", lambda *a, **k: (
        {"audits": {"9.0": {"gemma2": doc}}, "families": [doc["family"]]}, 0.1, {"cache": "hit"}))
    monkeypatch.setattr(audit, "live_mode", lambda m: None)
    assert main(["audit", "--vllm", "0.34.0", "--fail-on", fail_on]) == rc
    assert main(["audit", "--vllm", "0.34.0", "--fail-on", fail_on, "--json"]) == rc
