"""tests/sglang_kit_swa_cases.py (what scripts/gpu_kit.sh runs per backend) on a CPU for FlashInfer, with the
project's plan-time stand-ins (``upstream_cpu``) and the kit edits: as shipped exactly the cases past the
window fail (extend on the ragged route, DFlash, EAGLE verify past the window topk 1 and 2, eager and CUDA
graph); with every fix they pass. The CUDA-graph decode cases fail on both sites here: the stand-ins do
not model the decode graph runner's replay (a CPU gap, not a finding; the GPU call judges them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swa_repro.sglang.fix import kit_copy
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.fix.upstream_diff import VERSION

CASES = Path(__file__).resolve().parent / "sglang_kit_swa_cases.py"
DECODE_GRAPH = {f"test_runner_mode_cuda_graph_decode_cases[case=runner_cuda_graph_swa_decode_{w}_window]"
                for w in ("within", "above")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from conftest import release_overlay
    from test_upstream_kit import KIT_FILES, _run

    from swa_repro.sglang.fix.overlay import fixed_overlay

    overlay = release_overlay(VERSION)
    tmp = tmp_path_factory.mktemp("kit-swa-cpu")
    fixed = fixed_overlay(VERSION, ORDER, overlay)[0]
    # test_upstream_kit.py's kit runs (the same files: one child per site for both files)
    return {s: _run(kit_copy.kit_overlay(b), list(KIT_FILES), tmp)[CASES.name] for s, b in (("shipped", overlay),
                                                                                         ("fixed", fixed))}


@pytest.mark.slow
def test_flashinfer_kit_cases_fail_shipped_past_the_window_and_pass_fixed(runs):
    bad = {s: {k for k, v in d["subtests"].items() if v != "pass"} for s, d in runs.items()}
    past = {k for k in runs["shipped"]["subtests"] if "past_window" in k and "paged" not in k}
    dflash = {k for k in runs["shipped"]["subtests"] if "dflash" in k}
    assert len(past) == 6 and len(dflash) == 2  # extend x 2; EAGLE topk 1, 2 eager and graph
    assert bad["shipped"] == past | dflash | DECODE_GRAPH
    assert bad["fixed"] == DECODE_GRAPH
