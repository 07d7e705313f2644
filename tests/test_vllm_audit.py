"""vLLM audit (issue #27): argument checks, the stand-in contract, the verdicts and the committed
table's consistency run in `make test` (no wheel, no child); the real-release audits are `matrix`
(they need the vLLM wheels, fetched once into the shared cache)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

from swa_repro.cli import main


@pytest.mark.parametrize("argv, says", [
    (["audit", "--vllm", "latest"], "give a release number"),
    (["audit", "--vllm", "0.19.0"], "0.20.0 and later"),
    (["audit", "--vllm", "0.20.3"], "not a vLLM release"),
    (["audit", "--vllm", "0.34.0", "--gpu", "sm75"], "--gpu"),
    (["audit", "--vllm", "0.34.0", "--gpu", "sm90,sm75"], "--gpu"),
    (["audit", "--vllm", "0.34.0", "--model", "llama"], "unknown family"),
    (["audit", "--vllm", "0.34.0", "--sglang", "0.5.23"], "one project at a time"),
    (["audit", "--release-table", "--vllm", "0.34.0,0.19.1"], "0.20.0 and later"),
    (["audit", "--release-table", "--vllm", "table", "--model", "qwen2-swa"], "unknown family"),
    (["audit", "--vllm", "0.33.0", "--paths", "decode"], "add --mode model"),
    (["audit", "--vllm", "0.33.0", "--mode", "model", "--paths", "decode,extend"], "choose from decode"),
    (["audit", "--vllm", "0.33.0", "--mode", "model", "--live-budget", "0"], "1 to 3600"),
])
def test_bad_input_is_one_line_exit_2(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_input_subprocess_has_no_traceback():
    p = subprocess.run([sys.executable, "-m", "swa_repro.cli", "audit", "--vllm", "x.y"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_standin_wrappers_take_flashinfers_parameters():
    """Every parameter of the installed flashinfer's plan/run is one the recording stand-in binds by
    name; the sink wrapper's constructor takes flashinfer's."""
    flashinfer = pytest.importorskip("flashinfer")
    from swa_repro.vllm.audit.env import WRAPPERS, SinkStandIn

    for name, standin in WRAPPERS.items():
        real = getattr(flashinfer, name)
        for method in ("plan", "run"):
            theirs = set(inspect.signature(getattr(real, method)).parameters) - {"self", "args", "kwargs"}
            ours = inspect.signature(getattr(standin, method)).parameters
            has_var_kw = any(p.kind is p.VAR_KEYWORD for p in ours.values())
            missing = theirs - set(ours)
            assert has_var_kw or not missing, f"{name}.{method}: stand-in lacks {sorted(missing)}"
    real = getattr(flashinfer, "BatchAttentionWithAttentionSinkWrapper", None)
    if real is not None:
        assert set(inspect.signature(real.__init__).parameters) <= set(inspect.signature(SinkStandIn.__init__).parameters)


def test_sink_wrapper_is_a_paged_wrapper_recorded_once():
    """vLLM asserts ``isinstance(wrapper, BatchPrefillWithPagedKVCacheWrapper)`` of the sink wrapper
    (flashinfer subclasses it); its calls are recorded under its own name only."""
    from swa_repro.engine.standins import PagedStandIn
    from swa_repro.vllm.audit.env import Recorder, SinkStandIn, recording_wrapper

    rec = Recorder()
    paged = recording_wrapper("BatchPrefillWithPagedKVCacheWrapper", PagedStandIn, rec)
    sink = recording_wrapper("BatchAttentionWithAttentionSinkWrapper", SinkStandIn, rec, paged)
    import torch

    w = sink(torch.zeros(8), "NHD", window_left=127)
    assert isinstance(w, paged) and w._jit_window_left == 127
    assert [c["target"] for c in rec.calls] == ["BatchAttentionWithAttentionSinkWrapper"]


def test_verdict_flags_a_missing_cap_and_a_wrong_window():
    from swa_repro.vllm.audit.paths import verdict

    asked = {"window_left": 4095, "logits_soft_cap": 50.0, "sm_scale": 0.0625, "sinks": False}
    assert verdict(asked, dict(asked)) == []
    assert verdict(asked, {**asked, "logits_soft_cap": "not passed"}) == ["logits_soft_cap 50.0 asked, not passed told"]
    assert verdict(asked, {**asked, "window_left": -1}) == ["window_left 4095 asked, -1 told"]
    assert verdict({**asked, "logits_soft_cap": None}, {**asked, "logits_soft_cap": "not passed"}) == []


def test_told_sink_wrapper_compiled_without_a_window_attends_without_one():
    from swa_repro.vllm.audit.paths import told

    call = {"method": "run", "args": {"jit_window_left": -1, "planned_window_left": 127, "planned_logits_soft_cap": 0.0,
                                      "planned_sm_scale": 1.0, "sink_sm_scale": 0.125, "sinks": {"shape": [64]}}}
    assert told(call) == {"window_left": -1, "logits_soft_cap": 0.0, "sm_scale": 0.125, "sinks": True}
    call["args"]["jit_window_left"] = 127
    assert told(call)["window_left"] == 127


@pytest.mark.parametrize("capture_window, capture_cap, says", [
    (4095, 50.0, []),
    (-1, 0.0, ["window_left 4095 asked, -1 told", "logits_soft_cap 50.0 asked, 0.0 told"])])
def test_a_cuda_graph_replay_runs_the_module_its_capture_planned(capture_window, capture_cap, says):
    """FlashInfer picks the decode module at ``plan`` (decode.py:1054-1055); ``fast_decode_plan``, which
    re-plans a captured wrapper, sets the window, cap and scale but never re-picks it (flashinfer 0.7.2
    decode.py:4778, :5055-5057). So a replay told 4095 and cap 50 after a capture planned without them
    runs without them; after a capture planned with them, with them."""
    import torch

    from swa_repro.engine.standins import DecodeStandIn
    from swa_repro.vllm.audit.env import Recorder, fast_decode_plan, recording_wrapper
    from swa_repro.vllm.audit.paths import told, verdict

    rec = Recorder()
    w = recording_wrapper("BatchDecodeWithPagedKVCacheWrapper", DecodeStandIn, rec)(torch.zeros(8), "NHD",
                                                                                     use_cuda_graph=True)
    geo = (torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([1]), 8, 2, 64, 16)
    w.plan(*geo, window_left=capture_window, logits_soft_cap=capture_cap)
    fast_decode_plan(rec)(w, *geo, window_left=4095, logits_soft_cap=50.0)
    w.run(torch.zeros(1, 8, 64), (torch.zeros(1, 16, 2, 64), torch.zeros(1, 16, 2, 64)))
    asked = {"window_left": 4095, "logits_soft_cap": 50.0, "sm_scale": 0.125, "sinks": False}
    got = told(rec.calls[-1])
    assert verdict(asked, {**got, "sm_scale": 0.125}) == says
    assert [c["target"] for c in rec.calls] == ["BatchDecodeWithPagedKVCacheWrapper"] * 2 + [
        "fast_decode_plan", "BatchDecodeWithPagedKVCacheWrapper"]


def test_fast_decode_plan_keeps_no_cap_as_zero_as_flashinfers_does():
    """flashinfer 0.7.2 decode.py:4914-4915: ``logits_soft_cap=None`` is stored as 0.0, which vLLM's
    forward asserts (``decode_wrapper._logits_soft_cap == (self.logits_soft_cap or 0.0)``)."""
    import torch

    from swa_repro.engine.standins import DecodeStandIn
    from swa_repro.vllm.audit.env import Recorder, fast_decode_plan

    w = DecodeStandIn(torch.zeros(8), "NHD", use_cuda_graph=True)
    fast_decode_plan(Recorder())(w, torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([1]), 8, 2, 64, 16,
                                 window_left=127, logits_soft_cap=None, sm_scale=0.125)
    assert (w._window_left, w._logits_soft_cap, w._sm_scale) == (127, 0.0, 0.125)


def test_the_fp8_dequant_port_copies_each_prefill_page_scaled():
    """``drive.DequantCopy`` (the release's Triton ``_trtllm_prefill_attn_kvfp8_dequant``, run on CPU):
    page ``table[b, p]`` of the fp8 cache, k times k_scale and v times v_scale, lands at page
    ``1 + b * pages + p`` of the bf16 copy (the release's ``mock_block_table``), checked page by page."""
    import torch

    from swa_repro.vllm.audit.drive import DequantCopy

    g = torch.Generator().manual_seed(0)
    fp8 = torch.randn(6, 2, 2, 4, 8, generator=g).to(torch.float8_e4m3fn)  # (pages, k/v, H, N, D)
    table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32)
    out = torch.zeros(5, 2, 2, 4, 8, dtype=torch.bfloat16)
    DequantCopy()[(2, 2)](fp8.view(torch.uint8), table, 2, out, torch.tensor(0.5), torch.tensor(2.0))
    for b in range(2):
        for p in range(2):
            src = fp8[int(table[b, p])].float()
            assert torch.equal(out[1 + b * 2 + p, 0], (src[0] * 0.5).bfloat16())
            assert torch.equal(out[1 + b * 2 + p, 1], (src[1] * 2.0).bfloat16())
    assert not out[0].any()  # page 0 is the release's padding page, never written


def test_the_fp8_quant_port_is_static_per_tensor_and_saturates():
    """``drive.CustomOpsPort.scaled_fp8_quant``: ``x / scale`` to fp8 e4m3, saturated at +-448 (what
    vLLM's static quant kernel writes), its scale returned; dynamic quantization is refused, not guessed."""
    import torch

    from swa_repro.vllm.audit.drive import CustomOpsPort

    x = torch.tensor([[1.0, -3.0, 1000.0, -1000.0]], dtype=torch.bfloat16)
    out, scale = CustomOpsPort(object()).scaled_fp8_quant(x, scale=torch.tensor(2.0))
    assert out.dtype == torch.float8_e4m3fn and out.float().tolist() == [[0.5, -1.5, 448.0, -448.0]]
    assert float(scale) == 2.0
    with pytest.raises(NotImplementedError):
        CustomOpsPort(object()).scaled_fp8_quant(x)


def _doc(kernels_differs=(), error=None, asked_window=4095, valid=True):
    fam = {"family": "x", "layers": {"sliding": {"hf_window_left": 4095}, "full": {"hf_window_left": -1}}}
    rows = [{"layer": "sliding", "path": "decode", "asked": {"window_left": asked_window},
             "kernels": [{"kernel": "xqa_batch_decode_with_kv_cache", "differs": list(kernels_differs)}],
             **({"error": error} if error else {})},
            {"layer": "full", "path": "decode", "asked": {"window_left": -1},
             "kernels": [{"kernel": "BatchDecodeWithPagedKVCacheWrapper", "differs": []}]}]
    return {"family": fam, "rows": rows, "platform": {"flashinfer_valid": valid, "flashinfer_reasons":
                                                      [] if valid else ["attention sinks not supported"]}}


def test_cell_states():
    from swa_repro.vllm.audit.verdict import cell, short

    assert cell(_doc())["state"] == "not affected"
    c = cell(_doc(["logits_soft_cap 50.0 asked, not passed told"]))
    assert c["state"] == "affected" and short(c) == "**affected**: cap dropped by xqa_batch_decode"
    assert cell(_doc(asked_window=4096))["state"] == "layer != HF"
    assert cell(_doc(error="NotImplementedError: FlashInfer backend on SM90 currently crashes with sliding-window"))[
        "state"] == "refused"
    assert short(cell(_doc(valid=False))) == "refused: sinks"
    assert cell(_doc(error="RuntimeError: no driver"))["state"] == "not driven"


def test_family_sources_follow_the_release_file(tmp_path, monkeypatch):
    """cohere2's window is the config's, or + 1 where the release's commandr.py says so (0.29.0 on).
    (The config is Cohere2Config's defaults as ``small_config`` gives them, without importing transformers.)"""
    from swa_repro.engine import families as sf
    from swa_repro.vllm.families import MODELS, resolve

    monkeypatch.setattr(sf, "small_config", lambda name: sf.SmallConfig(
        name, {}, ("sliding", "sliding", "sliding", "full"), 40, 4096, 128, 64, 64, 0.0))

    f = tmp_path / MODELS / "commandr.py"
    f.parent.mkdir(parents=True)
    f.write_text("        if x:\n            self.sliding_window = config.sliding_window\n"
                 "        self.scaling = self.head_dim**-0.5\n")
    r = resolve("cohere2", tmp_path)
    assert r["layers"]["sliding"]["sliding_window"] == 4096 and r["sources"]["window"].endswith(
        "commandr.py:2: self.sliding_window = config.sliding_window")
    f.write_text("            self.sliding_window = config.sliding_window + 1\n")
    r = resolve("cohere2", tmp_path)
    assert r["layers"]["sliding"]["sliding_window"] == 4097 and r["sources"]["scale"].endswith("not found")


def test_committed_table_renders_from_its_json():
    """docs/audit/vllm-releases.md is what ``table.markdown`` makes of the committed JSON."""
    from swa_repro.engine import families as sf
    from swa_repro.engine.provenance import TABLE_DIR
    from swa_repro.vllm.audit import table

    p = TABLE_DIR / f"{table.NAME}.json"
    t = json.loads(p.read_text())
    md = table.markdown(t, t["families"], [sf.GPU_CLASSES[g] for g in t["gpus"]])
    assert md == (TABLE_DIR / f"{table.NAME}.md").read_text()
    assert list(t["releases"]) == list(table.TABLE_RELEASES) and t["provenance"]["command"].startswith("swa-repro")


# ----------------------------------------------------------------------------- the releases themselves
@pytest.mark.matrix
def test_release_034_gemma2_sm90():
    """vLLM 0.34.0's own backend: the prefill wrapper is planned with the window and the cap; the
    XQA decode kernel is called with the window and without a soft cap."""
    from swa_repro.engine.families import GPU_CLASSES
    from swa_repro.vllm.audit.core import run_audit

    doc, _, _ = run_audit("0.34.0", "gemma2", GPU_CLASSES["sm90"], note=lambda s: None)
    rows = {(r["layer"], r["path"]): r for r in doc["rows"]}
    paths = ("prefill", "decode", "mixed", "cuda_graph_decode", "spec_decode", "fp8_kv_mixed", "nvfp4_kv_mixed",
             "large_page_mixed")
    assert set(rows) == {(k, p) for k in ("full", "sliding") for p in paths}
    pre = rows[("sliding", "prefill")]["kernels"]
    assert [k["kernel"] for k in pre] == ["BatchPrefillWithPagedKVCacheWrapper"] and not pre[0]["differs"]
    assert pre[0]["told"]["window_left"] == 4095 and pre[0]["told"]["logits_soft_cap"] == 50.0
    dec = rows[("sliding", "decode")]["kernels"]
    assert [k["kernel"] for k in dec] == ["xqa_batch_decode_with_kv_cache"]
    assert dec[0]["told"]["window_left"] == 4095
    assert dec[0]["differs"] == ["logits_soft_cap 50.0 asked, not passed told"]
    assert [k["kernel"] for k in rows[("full", "mixed")]["kernels"]] == [
        "BatchPrefillWithPagedKVCacheWrapper", "xqa_batch_decode_with_kv_cache"]
    graph = rows[("sliding", "cuda_graph_decode")]["kernels"]  # XQA under FULL graphs too: no wrapper to re-plan
    assert [(k["kernel"], k["stage"]) for k in graph] == [("xqa_batch_decode_with_kv_cache", "capture"),
                                                          ("xqa_batch_decode_with_kv_cache", "replay")]
    assert all(k["differs"] == dec[0]["differs"] for k in graph)
    fp8 = rows[("sliding", "fp8_kv_mixed")]  # an fp8 cache: the prefill wrapper planned with fp8 KV, XQA decode
    assert [c["args"]["kv_data_type"] for c in fp8["calls"] if c["method"] == "plan"] == ["torch.float8_e4m3fn"]
    assert [(k["kernel"], k["differs"]) for k in fp8["kernels"]] == [
        (k["kernel"], k["differs"]) for k in rows[("sliding", "mixed")]["kernels"]]
    spec = rows[("sliding", "spec_decode")]  # 1 + 2 tokens a request: XQA takes them as decodes (spec-as-decode)
    assert spec["requests"][0][0] == 3 and [k["kernel"] for k in spec["kernels"]] == ["xqa_batch_decode_with_kv_cache"]
    assert spec["kernels"][0]["differs"] == dec[0]["differs"]


@pytest.mark.matrix
def test_release_034_cuda_graph_decode_on_sm80_captures_with_plan_and_replays_with_fast_decode_plan():
    """On sm80 0.34.0 decodes through the wrapper: under FULL CUDA graphs its first plan is a full
    ``plan`` (the capture), the next step ``fast_decode_plan`` (the replay, fast_plan_decode); the
    replay runs the module the capture picked, with the window and cap: told what the layer asks."""
    from swa_repro.engine.families import GPU_CLASSES
    from swa_repro.vllm.audit.core import run_audit

    doc, _, _ = run_audit("0.34.0", "gemma2", GPU_CLASSES["sm80"], note=lambda s: None)
    row = next(r for r in doc["rows"] if (r["layer"], r["path"]) == ("sliding", "cuda_graph_decode"))
    assert [(c["target"], c["method"]) for c in row["calls"] if c["target"] != "get_seq_lens"] == [
        ("BatchDecodeWithPagedKVCacheWrapper", "__init__"), ("BatchDecodeWithPagedKVCacheWrapper", "plan"),
        ("BatchDecodeWithPagedKVCacheWrapper", "run"), ("fast_decode_plan", "call"),
        ("BatchDecodeWithPagedKVCacheWrapper", "run")]
    assert row["calls"][0]["args"]["use_cuda_graph"] is True
    assert [k["stage"] for k in row["kernels"]] == ["capture", "replay"]
    assert all(k["told"]["window_left"] == 4095 and k["told"]["logits_soft_cap"] == 50.0 and not k["differs"]
               for k in row["kernels"])


@pytest.mark.matrix
@pytest.mark.parametrize("version", ["0.20.0", "0.25.0", "0.29.0", "0.30.0", "0.34.0"])
def test_release_table_findings(version):
    """Each structural epoch's release, every family, sm90 and sm100: what the table says."""
    from swa_repro.engine.families import GPU_CLASSES
    from swa_repro.vllm.audit.core import run_release
    from swa_repro.vllm.audit.verdict import cell
    from swa_repro.vllm.families import FAMILIES

    gpus = [GPU_CLASSES["sm90"], GPU_CLASSES["sm100"]]
    doc, seconds, _ = run_release(version, list(FAMILIES), gpus, note=lambda s: None)
    c = {(a, f): cell(d) for a, fams in doc["audits"].items() for f, d in fams.items()}
    assert all(x["state"] != "not driven" for x in c.values()), {k: v for k, v in c.items() if v["state"] == "not driven"}
    assert c[("10.0", "gemma2")]["state"] == "affected"  # trtllm-gen is called without the cap, every release
    assert doc["audits"]["10.0"]["gemma2"]["platform"]["default"] == "FLASHINFER"
    assert doc["audits"]["9.0"]["gemma2"]["platform"]["order"][:2] == ["FLASH_ATTN", "FLASHINFER"]
    sm90 = c[("9.0", "gemma2")]["state"]
    assert sm90 == {"0.20.0": "not affected", "0.25.0": "refused", "0.29.0": "refused", "0.30.0": "affected",
                    "0.34.0": "affected"}[version]
    assert c[("9.0", "gpt-oss")]["state"] == ("not affected" if version >= "0.30.0" else "refused")
    assert c[("10.0", "cohere2")]["state"] == ("layer != HF" if version >= "0.29.0" else "not affected")
    dcp = doc["audits"]["10.0"]["gemma2"]["dcp"]  # the release's own KV-cache sizing, asked for two DCP ranks
    assert dcp["sliding"]["refused"] == "AssertionError: DCP not support sliding window." and dcp["full"] == {"allowed": True}


@pytest.mark.slow
def test_notebook_08_vllm(tmp_path):
    """Notebook 08 (the committed tables, one heatmap, the live recording) runs headless with its checks passing."""
    from swa_repro.notebook.places import NOTEBOOKS_DIR
    from swa_repro.notebook.runner import ensure_kernel, run_one

    r = run_one(NOTEBOOKS_DIR / "08_vllm.py", tmp_path, "model", {}, ensure_kernel(), 300)
    assert r["status"] == "ok", r["error"]
    assert r["checks_failed"] == 0 and r["checks_passed"] == 11  # 4 + 3 on the tables, 3 + 1 on the live recordings
    assert [str(f).rsplit("/", 1)[-1] for f in r["figures"]] == ["08_vllm_states.png"]


def test_dcp_is_asked_of_the_specs_own_sizing():
    """A spec whose sizing asserts under DCP is refused, with the line that asserts; one that sizes is
    allowed; one that reads what the audit's config lacks is said unchecked. The config is not changed."""
    import types

    from swa_repro.vllm.audit.paths import dcp_refusal

    class Sliding:
        def max_memory_usage_bytes(self, vllm_config):
            assert vllm_config.parallel_config.decode_context_parallel_size == 1, "DCP not support sliding window."
            return 1

    class Full:
        def max_memory_usage_bytes(self, vllm_config):
            return vllm_config.parallel_config.decode_context_parallel_size

    class Reads:
        def max_memory_usage_bytes(self, vllm_config):
            return vllm_config.speculative_config.k

    cfg = types.SimpleNamespace(parallel_config=types.SimpleNamespace(decode_context_parallel_size=1))
    got = dcp_refusal(Sliding(), cfg)
    assert got["refused"] == "AssertionError: DCP not support sliding window."
    assert got["source"].endswith(f":{Sliding.max_memory_usage_bytes.__code__.co_firstlineno + 1}")
    assert dcp_refusal(Full(), cfg) == {"allowed": True}
    assert "AttributeError" in dcp_refusal(Reads(), cfg)["not_checked"]
    assert cfg.parallel_config.decode_context_parallel_size == 1


def test_dcp_lines_say_which_families_each_release_refuses():
    from swa_repro.engine.families import GPU_CLASSES
    from swa_repro.vllm.audit.table import dcp_lines

    no = {"sliding": {"refused": "AssertionError: DCP not support sliding window.", "source": "vllm/x.py:9"},
          "full": {"allowed": True}}
    gpus = [GPU_CLASSES["sm90"], GPU_CLASSES["sm100"]]
    both, full = {"sliding": {}, "full": {}}, {"full": {}}  # the layer kinds a family asks for

    def cell(dcp, asked=both):
        return {"dcp": dcp, "asked": asked}

    t = {"releases": {
        "0.1.0": {"sm90": {"a": cell(no), "b": cell({})}, "sm100": {"a": cell({}), "b": cell(no)}},
        "0.2.0": {"sm90": {"a": cell(no), "b": cell({"full": {"allowed": True}}, full)},
                  "sm100": {"a": cell({}), "b": cell({}, full)}},
        "0.3.0": {"sm90": {"a": cell(no), "b": cell({"full": {"allowed": True}})}, "sm100": {"a": cell({}), "b": cell({})}}}}
    text = "\n".join(dcp_lines(t, ["a", "b"], gpus))
    assert "0.1.0: refused for a, b by the release's KV-cache sizing (their sliding layers:" in text  # b: sm100's
    assert "0.2.0: refused for a" in text and "not refused: b" in text  # b has full layers only
    assert "0.3.0: refused for a" in text and "not checked (a layer kind no GPU class builds): b" in text
    assert "No family of this table can be served with DCP" not in text
    for v in ("0.2.0", "0.3.0"):
        t["releases"].pop(v)
    assert "No family of this table can be served with DCP" in "\n".join(dcp_lines(t, ["a", "b"], gpus))
