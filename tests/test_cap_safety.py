"""A layer whose soft cap differs from the one a fixed plan compiles in is refused, not computed.

sglang 0.5.23 as shipped plans no cap and runs every such layer without complaint (uncapped, or
with a forward()-only cap the kernel ignores); with ``soft_cap_prefill`` + ``soft_cap_decode`` the
backend raises, naming the layer and the two caps, on each path that plans a cap."""

import pytest

from swa_repro.sglang.fix import cap_safety

pytestmark = pytest.mark.network
FIXES = ("soft_cap_prefill", "soft_cap_decode")


@pytest.fixture(scope="module")
def shipped():
    return cap_safety.cap_safety("0.5.23", note=lambda *a: None)["runs"]


@pytest.fixture(scope="module")
def fixed():
    return cap_safety.cap_safety("0.5.23", FIXES, note=lambda *a: None)["runs"]


def _cells(runs):
    return {(r["path"], r["mismatch"]): r for r in runs}


def test_every_mismatch_is_driven_on_every_path(shipped, fixed):
    want = {(p, m.name) for p in cap_safety.PATHS for m in cap_safety.MISMATCHES}
    assert set(_cells(shipped)) == want == set(_cells(fixed))


def test_shipped_computes_every_mismatch_silently(shipped):
    assert {r["status"] for r in shipped} == {"driven"}, [r for r in shipped if r["status"] != "driven"]


@pytest.mark.parametrize("mismatch", cap_safety.MISMATCHES, ids=lambda m: m.name)
@pytest.mark.parametrize("path", cap_safety.PATHS)
def test_fixed_refuses(fixed, path, mismatch):
    run = _cells(fixed)[(path, mismatch.name)]
    assert run["status"] == "sglang raised", run
    assert "ValueError" in run["error"] and "flashinfer_backend.py" in run["error"], run["error"]
    if mismatch.method != "tanh":
        assert "tanh only" in run["error"], run["error"]
    else:
        assert f"logits_soft_cap={mismatch.layer_cap}" in run["error"], run["error"]
        assert f"planned with {mismatch.config_cap}" in run["error"], run["error"]
