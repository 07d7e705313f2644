"""vLLM audit (issue #27, phase 1): argument checks and the stand-in contract run in `make test`;
the real-release audit is `matrix` (it needs the vLLM wheel, fetched once into the shared cache)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from swa_repro.cli import main


@pytest.mark.parametrize("argv, says", [
    (["audit", "--vllm", "latest"], "give a release number"),
    (["audit", "--vllm", "0.19.0"], "0.20.0 and later"),
    (["audit", "--vllm", "0.34.0", "--gpu", "sm75"], "--gpu"),
    (["audit", "--vllm", "0.34.0", "--model", "llama"], "unknown family"),
    (["audit", "--vllm", "0.34.0", "--sglang", "0.5.23"], "one project at a time"),
])
def test_bad_input_is_one_line_exit_2(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_input_subprocess_has_no_traceback():
    p = subprocess.run([sys.executable, "-m", "swa_repro.cli", "audit", "--vllm", "x.y"], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_standin_wrappers_take_flashinfers_parameters():
    """Every parameter of the installed flashinfer's plan/run is one the recording stand-in binds by name."""
    flashinfer = pytest.importorskip("flashinfer")
    from swa_repro.vllm.standins import WRAPPERS

    for name, standin in WRAPPERS.items():
        real = getattr(flashinfer, name)
        for method in ("plan", "run"):
            theirs = set(inspect.signature(getattr(real, method)).parameters) - {"self", "args", "kwargs"}
            ours = inspect.signature(getattr(standin, method)).parameters
            has_var_kw = any(p.kind is p.VAR_KEYWORD for p in ours.values())
            missing = theirs - set(ours)
            assert has_var_kw or not missing, f"{name}.{method}: stand-in lacks {sorted(missing)}"


def test_verdict_flags_a_missing_cap_and_a_wrong_window():
    from swa_repro.vllm.drive import verdict

    asked = {"window_left": 4095, "logits_soft_cap": 50.0, "sm_scale": 0.0625, "sinks": False}
    assert verdict(asked, dict(asked)) == []
    assert verdict(asked, {**asked, "logits_soft_cap": "not passed"}) == ["logits_soft_cap 50.0 asked, not passed told"]
    assert verdict(asked, {**asked, "window_left": -1}) == ["window_left 4095 asked, -1 told"]
    assert verdict({**asked, "logits_soft_cap": None}, {**asked, "logits_soft_cap": "not passed"}) == []


def test_family_params_gemma2():
    from swa_repro.vllm.audit import family_params

    f = family_params("gemma2")
    assert (f["sliding_window"], f["cap"], f["kinds"]) == (4096, 50.0, ["full", "sliding"])


@pytest.mark.matrix
def test_release_034_gemma2_sm90():
    """vLLM 0.34.0's own backend: the prefill wrapper is planned with the window and the cap; the
    XQA decode kernel is called with the window and without a soft cap."""
    from swa_repro.sglang.families import GPU_CLASSES
    from swa_repro.vllm.audit import run_audit

    doc, _, _ = run_audit("0.34.0", "gemma2", GPU_CLASSES["sm90"], note=lambda s: None)
    rows = {(r["layer"], r["path"]): r for r in doc["rows"]}
    assert set(rows) == {(k, p) for k in ("full", "sliding") for p in ("prefill", "decode", "mixed")}
    pre = rows[("sliding", "prefill")]["kernels"]
    assert [k["kernel"] for k in pre] == ["BatchPrefillWithPagedKVCacheWrapper"] and not pre[0]["differs"]
    assert pre[0]["told"]["window_left"] == 4095 and pre[0]["told"]["logits_soft_cap"] == 50.0
    dec = rows[("sliding", "decode")]["kernels"]
    assert [k["kernel"] for k in dec] == ["xqa_batch_decode_with_kv_cache"]
    assert dec[0]["told"]["window_left"] == 4095
    assert dec[0]["differs"] == ["logits_soft_cap 50.0 asked, not passed told"]
    assert [k["kernel"] for k in rows[("full", "mixed")]["kernels"]] == [
        "BatchPrefillWithPagedKVCacheWrapper", "xqa_batch_decode_with_kv_cache"]
