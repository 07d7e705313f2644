"""sglang 0.5.15.post1's own FlashInfer calls, captured on CPU by the harness and replayed on real
FlashInfer on an H200 (`swa-repro replay ... --out`): the committed reports must agree with the
model's predictions and show the bug unpatched and its absence patched."""

import json
from pathlib import Path

import pytest

REPORTS = sorted((Path(__file__).resolve().parents[1] / "recordings" / "replay").glob("*.json"))
TOL = 3e-2  # bf16 against the float64 reference


def _reaches_past_window(case: dict) -> bool:
    """Some query has a key older than its window: the last query of the longest request."""
    return max(p + e for p, e in zip(case["prefix_lens"], case["extend_lens"])) - 1 > case["window_left"]


def _outputs(doc):
    return [c for c in doc["calls"] if c["method"] in ("forward", "run", "forward_return_lse", "run_return_lse")]


def test_replay_reports_exist_with_provenance():
    assert REPORTS, "no replay reports: run `swa-repro replay TRACE... --out FILE` on a GPU"
    for path in REPORTS:
        prov = json.loads(path.read_text())["provenance"]
        assert prov["gpu"] and prov["driver"] and prov["torch"] and prov["flashinfer"]["version"]
        assert prov["command"].startswith("swa-repro replay")


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.stem)
def test_real_kernel_matches_the_model_and_shows_the_bug(path):
    doc = json.loads(path.read_text())
    for t in doc["traces"]:
        assert t["ok"], f"{t['trace']}: the real kernel disagreed with the model's recorded output"
        outs = _outputs(t)
        assert outs
        worst = max(c["max_abs_vs_reference"] for c in outs)
        if t["meta"]["patched"]:
            assert worst <= TOL, f"{t['trace']}: patched sglang is still wrong on the real kernel"
        elif _reaches_past_window(t["meta"]["case_dict"]):
            assert worst > TOL, f"{t['trace']}: unpatched sglang came out right on the real kernel"
