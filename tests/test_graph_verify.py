"""The audit finds issue #40's point 1: EAGLE / NGRAM verify under CUDA graphs with the fix that planned
wrapper 0's windowed tree mask and wrapper 1's unwindowed one into sglang's one ``cuda_graph_custom_mask``.

Driven through sglang 0.5.23's own capture and replay (``audit.paths._graph``: ``init_cuda_graph_state``,
the capture and replay metadata calls, the captured forward and the graph's replay of it) with the
stand-ins keeping FlashInfer's graph-mode buffer rules (``kernel.graph_buffers``), and judged by the key
oracle (``audit.keys``: each draft token's window on its tree position, from the parent links alone).
One child audit per fix state: as shipped and the fix (the release's whole audits, which notebook 04
makes too), and the fix before #40 (``prior_eagle_shared_mask_buf``) on the
CUDA-graph verify paths and their eager twins.
"""

from __future__ import annotations

import pytest

from swa_repro.sglang.audit import table as at

pytestmark = pytest.mark.slow

GRAPH = list(at.GRAPH_VERIFY[:2]) + [at.GRAPH_VERIFY[-1]]  # EAGLE topk 1, topk 2 (k2s3n6), NGRAM
EAGER = {"cuda_graph_verify": "target_verify_eagle", "cuda_graph_verify_eagle_k2s3n6": "target_verify_eagle_k2s3n6",
         "cuda_graph_verify_ngram": "target_verify_ngram"}
FIXES = ("shipped", "prior", "fixed")


def test_the_paths_are_topk_1_and_2_and_ngram():
    from swa_repro.sglang.audit.paths import PATHS

    assert GRAPH == list(EAGER) and set(GRAPH) | set(EAGER.values()) <= set(PATHS)
    assert "k2" in GRAPH[1]


@pytest.fixture(scope="module")
def audits():
    pytest.importorskip("sglang")
    from conftest import release_audits, release_overlay

    from swa_repro.sglang.audit.release import audit_release
    from swa_repro.sglang.fix.fixes import ORDER

    release_overlay("0.5.23")
    # as shipped and fixed: the whole audits (every path, these among them), one cache key each, read here,
    # not a child more on a subset: notebook 04 and test_audit_spec make both (conftest.release_audits);
    # the prior fix's audit is this file's alone
    whole = release_audits("0.5.23")
    prior = audit_release("0.5.23", paths=GRAPH + list(EAGER.values()), fixes=(*ORDER, "prior_eagle_shared_mask_buf"),
                          note=lambda *a: None)
    return {**whole, "prior": prior}


def _swa(doc, path):
    (d,) = [d for d in doc["driven"] if d["path"] == path and d["layer"] == "swa8"]
    return d["key_verdict"], {stage: s["extra_keys"] for stage, s in d["keys"].items()}


@pytest.mark.parametrize("fix", FIXES)
@pytest.mark.parametrize("path", GRAPH)
def test_cuda_graph_verify_past_the_window(audits, path, fix):
    doc = audits[fix]
    assert not doc["not_driven"]
    verdict, extra = _swa(doc, path)
    assert set(extra) == {"capture", "replay"}
    if fix == "fixed":
        assert (verdict, set(extra.values())) == ("exact", {0})
    else:  # shipped: no window planned; prior: wrapper 1's unwindowed mask read by wrapper 0
        assert verdict == "extra" and extra["capture"] > 0 and extra["replay"] > 0
    eager_verdict, _ = _swa(doc, EAGER[path])
    assert eager_verdict == ("extra" if fix == "shipped" else "exact")  # the prior fix is right eager

