"""The committed vLLM live recording (recordings/vllm-live, issue #27's GPU step), held to its data:
the summary regenerates from the files, the provenance is there, and the claims of its README hold
row for row: XQA drops Gemma-2's cap on real kernels while doing what it is told, the fix removes every
wrong row, Cohere2 attends its asked window and one key more than transformers' mask."""

from __future__ import annotations

from pathlib import Path

import pytest

CALL = Path(__file__).resolve().parents[1] / "recordings" / "vllm-live" / "0.33.0" / "call-20261205T2228-h200"
XQA = "xqa_batch_decode_with_kv_cache"


@pytest.fixture(scope="module")
def docs():
    from swa_repro.vllm.audit.live_report import load

    return {site: load(CALL / f"live-{site}.json.xz") for site in ("shipped", "fixed")}


def _rows(doc, family):
    return {(r["layer"], r["path"]): r for r in doc["families"][family]["rows"]}


def test_the_summary_is_generated_from_the_files():
    from swa_repro.vllm.audit.live_report import summary

    assert (CALL / "SUMMARY.md").read_text() == "\n".join(summary(CALL)) + "\n"


def test_provenance_gpu_driver_torch_versions_date_and_commands():
    gpu = (CALL / "gpu.txt").read_text()
    for line in ("date -u: 2026-12-05T", "NVIDIA H200", "driver: 580.", "torch: 2.11.0+cu130", "code digest: ",
                 "flashinfer 0.7.2.post1, vllm 0.33.0; exit status 0", "swa_repro.vllm.live --overlay",  # as run then
                 "patch apply --vllm --fix cap-route"):
        assert line in gpu, line


def test_every_path_ran_on_the_real_kernels_and_each_kernel_did_what_it_was_told(docs):
    for site, d in docs.items():
        assert d["kernels"] == "real FlashInfer" and d["device"] == "NVIDIA H200" and d["arch"] == [9, 0]
        assert (d["vllm"], d["flashinfer"]) == ("0.33.0", "0.7.2.post1")
        for fam in d["families"].values():
            assert len(fam["rows"]) == 10  # two layer kinds x five paths, none refused, none out of time
            for r in fam["rows"]:
                assert r["cap"]["told_agrees"] and not r["cap"]["nan"], (site, r["layer"], r["path"])
                assert r["keys"]["rows_off_asked"] == 0 and {x["status"] for x in r["keys"]["requests"]} == {"exact"}


def test_xqa_drops_gemma2s_cap_on_every_row_it_runs(docs):
    rows = _rows(docs["shipped"], "gemma2")
    for (kind, path), r in rows.items():
        xqa = [x for x in r["cap"]["requests"] if x["kernel"] == XQA]
        wrapper = [x for x in r["cap"]["requests"] if x["kernel"] != XQA]
        assert all(x["logits_soft_cap"] == 0.0 and x["wrong_rows"] == x["rows"] for x in xqa), (kind, path)
        assert all(x["logits_soft_cap"] == 50.0 and x["wrong_rows"] == 0 for x in wrapper), (kind, path)
        assert bool(xqa) == (path != "prefill")
    assert min(x["max_err_asked"] for r in rows.values() for x in r["cap"]["requests"] if x["kernel"] == XQA) > 1.0
    assert {k: v["wrong_rows"] for k, v in rows[("full", "cuda_graph_decode")]["stages"].items()} == {
        "capture": 3, "replay": 3}


def test_the_fix_leaves_no_wrong_row(docs):
    rows = _rows(docs["fixed"], "gemma2")
    assert all(r["cap"]["wrong_rows"] == 0 for r in rows.values())
    assert all(k["told_logits_soft_cap"] == 50.0 and k["kernel"] != XQA for r in rows.values() for k in r["kernels"])
    assert rows[("sliding", "decode")]["kernels"][0]["kernel"] == "BatchDecodeWithPagedKVCacheWrapper"


def test_cohere2_attends_its_asked_window_one_key_past_transformers_mask(docs):
    rows = _rows(docs["shipped"], "cohere2")
    assert all(r["asked"]["window_left"] == 4096 and r["hf"]["window_left"] == 4095
               for (kind, _), r in rows.items() if kind == "sliding")
    assert all(r["keys"]["rows_off_hf"] == 0 for (kind, _), r in rows.items() if kind == "full")
    off = {path: r["keys"]["rows_off_hf"] for (kind, path), r in rows.items() if kind == "sliding"}
    # rows past position 4095 see key p - 4096, which transformers' mask (4096 keys) leaves out
    assert off == {"decode": 2, "cuda_graph_decode": 2, "spec_decode": 4, "mixed": 301, "prefill": 300}
    assert all(r["cap"]["wrong_rows"] == 0 for r in rows.values())


# ----------------------------------------------------------------------------- the NVFP4 call (a second GPU call)
NVFP4 = CALL.parent / "call-20261206T0002-h100"


@pytest.fixture(scope="module")
def nvfp4_docs():
    from swa_repro.vllm.audit.live_report import load

    return {site: load(NVFP4 / f"live-{site}.json.xz") for site in ("shipped", "fixed")}


def test_the_nvfp4_call_summary_and_provenance():
    from swa_repro.vllm.audit.live_report import summary

    assert (NVFP4 / "SUMMARY.md").read_text() == "\n".join(summary(NVFP4)) + "\n"
    gpu = (NVFP4 / "gpu.txt").read_text()
    for line in ("date -u: 2026-12-06T", "NVIDIA H100", "driver: 580.", "torch: 2.11.0+cu130", "code digest: ",
                 "groups nvfp4_kv_mixed; flashinfer 0.7.2.post1, vllm 0.33.0; exit status 0",
                 "--paths nvfp4_kv_mixed --device cuda", "patch apply --vllm --fix cap-route"):
        assert line in gpu, line


def test_an_nvfp4_cache_on_sm90_keeps_gemma2s_cap_on_the_real_kernels(nvfp4_docs):
    """vLLM 0.33.0 with --kv-cache-dtype nvfp4 on an H100: its own cache write into its own packed
    layout, fa2's wrappers for prefill and decode (no XQA), each told the layer's window and cap, every
    row right against the float64 reference; shipped and fixed alike (the fix changes nothing here)."""
    for site, d in nvfp4_docs.items():
        assert d["kernels"] == "real FlashInfer" and d["arch"] == [9, 0] and "H100" in d["device"]
        assert set(d["families"]) == ({"gemma2", "cohere2"} if site == "shipped" else {"gemma2"})
        for f in d["families"].values():
            assert [(r["layer"], r["path"]) for r in f["rows"]] == [("full", "nvfp4_kv_mixed"),
                                                                    ("sliding", "nvfp4_kv_mixed")]
            for r in f["rows"]:
                assert {k["kernel"] for k in r["kernels"]} == {"BatchPrefillWithPagedKVCacheWrapper",
                                                               "BatchDecodeWithPagedKVCacheWrapper"}
                assert all(k["told_window_left"] == r["asked"]["window_left"]
                           and k["told_logits_soft_cap"] == r["asked"]["logits_soft_cap"] for k in r["kernels"])
                assert r["cap"]["wrong_rows"] == 0 and r["cap"]["told_agrees"] and not r["cap"]["nan"]
                assert sum(x["rows"] for x in r["cap"]["requests"]) == 302 and "not_run" in r["keys"]
    assert {r["asked"]["logits_soft_cap"] for r in nvfp4_docs["shipped"]["families"]["gemma2"]["rows"]} == {50.0}
