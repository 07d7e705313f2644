"""The vLLM audit's serving options (issue #27): quantized KV caches (``--kv-cache-dtype fp8 | nvfp4``)
and ``--block-size 128``. Run in `make test` on hand-made documents and stand-ins; the releases'
own answers are `matrix` (``test_release_034_options``).

Oracles: the rule each helper mirrors, written out here from its source (the worker's
``select_common_block_size``; flashinfer's trtllm-gen wrappers refusing a cap at ``plan``), and the
verdict's definition (a quantized cache's refusal is that option's, not the family's).
"""

from __future__ import annotations

import types

import pytest


def _row(layer, path, differs=(), cache_dtype=None, **extra):
    return {"layer": layer, "path": path, "asked": {"window_left": 4095 if layer == "sliding" else -1},
            "kernels": [{"kernel": "BatchDecodeWithPagedKVCacheWrapper", "differs": list(differs)}],
            **({"cache_dtype": cache_dtype} if cache_dtype else {}), **extra}


def _doc(*rows):
    fam = {"layers": {"sliding": {"hf_window_left": 4095}, "full": {"hf_window_left": -1}}}
    return {"family": fam, "rows": list(rows), "platform": {"flashinfer_valid": True, "flashinfer_reasons": []}}


CAP = "logits_soft_cap 50.0 asked, not passed told"


@pytest.mark.parametrize("option, cell_state, option_state", [
    ({"refused": "validate_configuration: kv_cache_dtype not supported", "kernels": []}, "not affected", "refused"),
    ({"error": "ValueError: --kv-cache-dtype nvfp4 requires sm100f", "kernels": []}, "not affected", "refused"),
    ({"differs": [CAP]}, "not affected", "affected"),
    ({"error": "RuntimeError: the stand-in broke", "kernels": []}, "not affected", "not driven"),
])
def test_a_quantized_caches_answer_is_its_own(option, cell_state, option_state):
    """A release refusing (or mis-serving) an NVFP4 cache says nothing of the default cache: the cell
    keeps the default cache's answer, the option gets its own."""
    from swa_repro.vllm.audit.verdict import cell

    option = dict(option)
    differs = option.pop("differs", ())
    opt = _row("sliding", "nvfp4_kv_mixed", differs, cache_dtype="nvfp4", **option)
    c = cell(_doc(_row("sliding", "decode"), _row("full", "decode"), opt))
    assert c["state"] == cell_state and c["cache_dtypes"]["nvfp4"]["state"] == option_state
    assert not any("nvfp4_kv_mixed" in r for r in c["routes"])


def test_the_default_caches_finding_stays_in_the_cell():
    from swa_repro.vllm.audit.verdict import cell, short

    c = cell(_doc(_row("full", "decode", [CAP]), _row("full", "fp8_kv_mixed", [CAP], cache_dtype="fp8")))
    assert c["state"] == "affected" and short(c["cache_dtypes"]["fp8"]).startswith("**affected**: cap dropped")
    assert [w for w in c["why"] if "fp8" in w] == []


class _Multiple:  # vLLM's MultipleOf: any multiple of ``base``
    def __init__(self, base):
        self.base = base


def _backend(sizes, takes_spec=True):
    def get(spec=None):
        return sizes

    def get_no_spec():
        return sizes

    return types.SimpleNamespace(FlashInferBackend=types.SimpleNamespace(
        get_supported_kernel_block_sizes=get if takes_spec else get_no_spec))


@pytest.mark.parametrize("sizes, block, page", [
    ([16, 32, 64], 128, 64),  # not listed: the largest listed size dividing it
    ([16, 32, 64, 128, 256, 512, 1024], 128, 128),  # listed: the block itself (sm100 trtllm-gen pages)
    ([16, 32, 64], 16, 16),
    ([_Multiple(16)], 128, 128),  # a multiple of a MultipleOf
    ([32, 64], 96, 32),
])
@pytest.mark.parametrize("takes_spec", [True, False], ids=["0.31+", "before 0.31"])
def test_kernel_page_is_the_workers_rule(sizes, block, page, takes_spec):
    """``select_common_block_size`` (vllm/v1/worker/utils.py): the block where the backend lists it,
    else the largest listed size that divides it."""
    from swa_repro.vllm.audit.kvcache import kernel_page

    assert kernel_page(_backend(sizes, takes_spec), object(), block) == page


def test_kernel_page_none_divides_is_the_rows_error():
    from swa_repro.vllm.audit.kvcache import kernel_page

    with pytest.raises(ValueError, match="divides --block-size 100"):
        kernel_page(_backend([64]), object(), 100)


@pytest.mark.parametrize("name, backend, cap, raises", [
    ("BatchPrefillWithPagedKVCacheWrapper", "trtllm-gen", 50.0, ValueError),
    ("BatchDecodeWithPagedKVCacheWrapper", "trtllm-gen", 50.0, AssertionError),
    ("BatchPrefillWithPagedKVCacheWrapper", "trtllm-gen", None, None),
    ("BatchPrefillWithPagedKVCacheWrapper", "auto", 50.0, None),
])
def test_a_trtllm_gen_wrapper_refuses_a_cap_at_plan_as_flashinfers_do(name, backend, cap, raises):
    """flashinfer's wrappers with ``backend="trtllm-gen"`` refuse a soft cap at ``plan`` (0.7.2.post1
    prefill.py:3710, decode.py:2316): the stand-ins do too, and record the plan first."""
    import torch

    from swa_repro.vllm.audit import env as standins

    rec = standins.Recorder()
    cls = standins.recording_wrapper(name, standins.WRAPPERS[name], rec)
    w = cls(torch.zeros(8, dtype=torch.uint8), "HND", backend=backend)
    ip = torch.tensor([0, 1], dtype=torch.int32)
    kw = {"logits_soft_cap": cap, "window_left": -1, "q_data_type": torch.bfloat16}
    plan = (lambda: w.plan(ip, ip, torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 8, 4, 64, 16,
                           causal=True, **kw)) if "Prefill" in name else \
        (lambda: w.plan(ip, torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 8, 4, 64, 16, **kw))
    if raises:
        with pytest.raises(raises):
            plan()
    else:
        plan()
    assert [c["method"] for c in rec.calls] == ["__init__", "plan"]


def _table(cache_dtypes, pages):
    row = {"gemma2": {"cache_dtypes": cache_dtypes, "kernel_page": pages}}
    return {"releases": {"0.34.0": {"sm100": row}}}


def test_the_tables_option_sections():
    from swa_repro.engine.families import GPU_CLASSES
    from swa_repro.vllm.audit.table import cache_dtype_lines, page_lines

    t = _table({"nvfp4": {"state": "refused", "why": ["full: ValueError: requires sm100f"], "routes": []},
                "fp8": {"state": "not affected", "why": [], "routes": []}}, {"full": 128, "sliding": 128})
    lines = cache_dtype_lines(t, ["gemma2"], [GPU_CLASSES["sm100"]])
    assert lines[0] == "## Quantized KV caches (`--kv-cache-dtype fp8 | nvfp4`)"
    assert "| 0.34.0 | fp8: not affected<br>nvfp4: refused: ValueError: requires sm100f |" in lines
    assert "- sm100, 0.34.0: gemma2 128 (trtllm-gen)" in page_lines(t, ["gemma2"], [GPU_CLASSES["sm100"]])
    assert cache_dtype_lines(_table({}, {}), ["gemma2"], [GPU_CLASSES["sm100"]]) == []
    assert page_lines(_table({}, {"full": 64}), ["gemma2"], [GPU_CLASSES["sm100"]])[-2] == "- sm100, 0.34.0: gemma2 64"


@pytest.mark.parametrize("why, says", [
    ("sliding: NotImplementedError: FlashInfer backend on SM90 currently crashes with sliding-window attention",
     "refused: sliding window"),
    ("validate_configuration: attention sinks not supported", "refused: sinks"),
    ("sliding: validate_configuration: kv_cache_dtype not supported",  # the layer kind's name is not the reason
     "refused: validate_configuration: kv_cache_dtype not supported"),
    ("full: ValueError: --kv-cache-dtype nvfp4 requires sm100f, please try a different dtype",
     "refused: ValueError: --kv-cache-dtype nvfp4 requires sm100f, please ..."),
])
def test_a_refusal_reads_as_the_releases_reason(why, says):
    from swa_repro.vllm.audit.verdict import short

    assert short({"state": "refused", "why": [why], "routes": []}) == says


@pytest.mark.matrix
def test_release_034_options():
    """0.34.0's own answers. sm90: an NVFP4 cache decodes on the wrapper, told the cap (no XQA), and is
    refused for gpt-oss (head_size 64, the release's own reason); pages stay at 64. sm100: a GQA model
    gets pages of 128 on trtllm-gen (the cap dropped for gemma2), cohere2 (MHA) 64. Fixed: gemma2 gets
    64 and is refused an NVFP4 cache by the selector (the fix's supports_combination reason)."""
    from swa_repro.engine.families import GPU_CLASSES
    from swa_repro.vllm.audit.core import run_release
    from swa_repro.vllm.audit.verdict import cell

    gpus = [GPU_CLASSES["sm90"], GPU_CLASSES["sm100"]]
    doc, _, _ = run_release("0.34.0", ["gemma2", "gpt-oss", "cohere2"], gpus, note=lambda s: None)
    fixed, _, _ = run_release("0.34.0", ["gemma2"], gpus, note=lambda s: None, fix="cap-route")

    def rows(d, arch, fam, path):
        return {r["layer"]: r for r in d["audits"][arch][fam]["rows"] if r["path"] == path}

    nv = rows(doc, "9.0", "gemma2", "nvfp4_kv_mixed")
    assert {k: [(x["kernel"], x["differs"]) for x in r["kernels"]] for k, r in nv.items()} == {
        k: [("BatchPrefillWithPagedKVCacheWrapper", []), ("BatchDecodeWithPagedKVCacheWrapper", [])]
        for k in ("full", "sliding")}
    g90 = cell(doc["audits"]["9.0"]["gemma2"])
    assert g90["state"] == "affected" and g90["cache_dtypes"]["nvfp4"]["state"] == "not affected"
    assert g90["cache_dtypes"]["fp8"]["state"] == "affected"
    oss = cell(doc["audits"]["9.0"]["gpt-oss"])
    assert oss["state"] == "not affected" and oss["cache_dtypes"]["nvfp4"]["state"] == "refused"
    assert "head_size 64" in oss["cache_dtypes"]["nvfp4"]["why"][0]
    assert {r["kernel_page"] for r in rows(doc, "9.0", "gemma2", "large_page_mixed").values()} == {64}

    big = rows(doc, "10.0", "gemma2", "large_page_mixed")
    assert {r["kernel_page"] for r in big.values()} == {128}
    assert {(x["kernel"], tuple(x["differs"])) for r in big.values() for x in r["kernels"]} == {
        (k, ("logits_soft_cap 50.0 asked, not passed told",))
        for k in ("trtllm_batch_context_with_kv_cache", "trtllm_batch_decode_with_kv_cache")}
    assert {r["kernel_page"] for r in rows(doc, "10.0", "cohere2", "large_page_mixed").values()} == {64}

    assert {r["kernel_page"] for r in rows(fixed, "10.0", "gemma2", "large_page_mixed").values()} == {64}
    f100 = cell(fixed["audits"]["10.0"]["gemma2"])
    assert f100["state"] == "not affected" and f100["cache_dtypes"]["nvfp4"]["state"] == "refused"
    why = f100["cache_dtypes"]["nvfp4"]["why"][0]  # at backend selection (supports_combination), not after load
    assert why.startswith("full: validate_configuration: ") and "takes no soft cap" in why
    assert cell(fixed["audits"]["9.0"]["gemma2"])["cache_dtypes"]["nvfp4"]["state"] == "not affected"


# ----------------------------------------------------------------------------- NVFP4 on the live step
def test_nvfp4_model_round_trips_the_grid_and_loses_off_it():
    """The model's NVFP4 (e2m1 codes, two to a byte; an e4m3 scale per 16 over a global scale): values
    the live step draws on the grid come back exactly, random ones do not (so the round trip can fail)."""
    import torch

    from swa_repro.vllm.audit.live import V_TOP, on_nvfp4_grid
    from swa_repro.vllm.audit.live_kernels import nvfp4_dequantize, nvfp4_quantize

    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    for top, g in ((6.0, 1.0), (V_TOP, 1.0), (6.0, 2.0)):
        on = on_nvfp4_grid(x, top) * g
        codes, sf = nvfp4_quantize(on, g)
        assert codes.dtype == torch.uint8 and codes.shape == (5, 3, 32) and sf.shape == (5, 3, 4)
        assert torch.equal(nvfp4_dequantize(codes, sf, g), on.double())
    assert not torch.equal(nvfp4_dequantize(*nvfp4_quantize(x)), x.double())
    assert on_nvfp4_grid(x).abs().reshape(5, 3, 4, 16).amax(-1).eq(6).all()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_nvfp4_append_writes_each_token_at_its_slot(layout):
    """flashinfer's slot-mapping append, modelled: token t's K and V at ``slot // page, slot % page``
    of the release's data and scale views (padding slots, negative, skipped)."""
    import torch

    from swa_repro.vllm.audit.live import on_nvfp4_grid
    from swa_repro.vllm.audit.live_kernels import nvfp4_append, nvfp4_dequantize

    pages, page, heads, d = 4, 16, 2, 32
    shape = (pages, page, heads) if layout == "NHD" else (pages, heads, page)
    data = [torch.zeros(*shape, d // 2, dtype=torch.uint8) for _ in range(2)]
    sf = [torch.zeros(*shape, d // 16, dtype=torch.float8_e4m3fn) for _ in range(2)]
    k, v = (on_nvfp4_grid(torch.randn(3, heads, d, generator=torch.Generator().manual_seed(i))) for i in (1, 2))
    nvfp4_append(k, v, torch.tensor([37, 5, -1]), data, sf, torch.ones(()), torch.ones(()), kv_layout=layout)

    def at(t, p, s):
        return t[p, s] if layout == "NHD" else t[p, :, s]

    for side, x in ((0, k), (1, v)):
        assert torch.equal(nvfp4_dequantize(at(data[side], 2, 5), at(sf[side], 2, 5)), x[0].double())
        assert torch.equal(nvfp4_dequantize(at(data[side], 0, 5), at(sf[side], 0, 5)), x[1].double())
    assert int(sum(t.count_nonzero() for t in data)) == sum(int(at(t, p, s).count_nonzero())
                                                          for t in data for p, s in ((2, 5), (0, 5)))


@pytest.mark.matrix
def test_release_033_nvfp4_on_sm90_keeps_gemma2s_cap_on_the_cpu_model(tmp_path):
    """vLLM 0.33.0 on sm90 with an NVFP4 cache, its own cache write into its own packed layout and its
    forward on the CPU model: Gemma-2's decode runs on the decode wrapper told the cap, every row
    right against the float64 reference, the keys not read (the probe's values are off the grid)."""
    import json
    import subprocess
    import sys

    from swa_repro.vllm.provision import provision

    overlay, _ = provision("0.33.0")
    out = tmp_path / "live.json"
    subprocess.run([sys.executable, "-m", "swa_repro.vllm.audit.live", "--overlay", str(overlay), "--out", str(out),
                    "--families", "gemma2", "--paths", "nvfp4_kv_mixed", "--device", "cpu", "--arch", "9.0"],
                   check=True, capture_output=True)
    rows = json.loads(out.read_text())["families"]["gemma2"]["rows"]
    assert [r["layer"] for r in rows] == ["full", "sliding"]
    for r in rows:
        assert {(k["kernel"], k["told_logits_soft_cap"]) for k in r["kernels"]} == {
            ("BatchPrefillWithPagedKVCacheWrapper", 50.0), ("BatchDecodeWithPagedKVCacheWrapper", 50.0)}
        assert r["cap"]["wrong_rows"] == 0 and r["cap"]["told_agrees"] and "not_run" in r["keys"]
