"""The simplest fix a maintainer would suggest first, weighed by the same audit as ours.

``alt_paged_for_swa`` (no ragged prefill for sliding-window models) is exact on the ragged paths,
like ours; ``alt_eagle_gate_only`` (plan the window for EAGLE verify, keep the trimmed keys) is not:
EAGLE's trimmed keys are the sequence's first ones. Both in one overlay: they touch different paths
(``use_paged`` is read only by extend, the gate only by verify)."""

import pytest

from swa_repro.sglang.audit import table as at
from swa_repro.sglang.fix.alternatives import ALTERNATIVES, apply_alternative
from swa_repro.sglang.fix.anchors import Unknown

pytestmark = pytest.mark.network
PATHS = ["extend_ragged_no_prefix", "extend_ragged_prefix", "target_verify_eagle"]


@pytest.fixture(scope="module")
def keys():
    from swa_repro.sglang.audit.release import audit_release

    doc = audit_release("0.5.23", fixes=tuple(ALTERNATIVES), paths=PATHS, note=lambda *a: None)
    assert doc["release"]["fixes"]["fixes"] == list(ALTERNATIVES)
    return {p: at.key_text(c) for p, c in at.key_cells(doc).items()}


@pytest.mark.parametrize("path", ["extend_ragged_no_prefix", "extend_ragged_prefix"])
def test_paged_prefill_for_sliding_window_models_is_exact(keys, path):
    assert keys[path] == "exact"


def test_eagle_gate_alone_is_not_exact(keys):
    assert keys["target_verify_eagle"].startswith("extra") and "missing" in keys["target_verify_eagle"]


@pytest.mark.parametrize("name", list(ALTERNATIVES))
def test_alternative_refuses_a_file_without_its_anchor(name):
    with pytest.raises(Unknown):
        apply_alternative("class Nothing:\n    pass\n", name)
