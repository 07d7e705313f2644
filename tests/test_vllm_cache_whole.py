"""``vllm.audit.core.whole``: which cached child documents the vLLM audit reuses. A fork the machine
killed (status 9 under memory pressure, seen while regenerating the table on a loaded 2-core host)
is no answer of the release's and must be recomputed, not served from the cache into every later
table; an error the release itself raised is its answer and is kept."""

from __future__ import annotations

import pytest

from swa_repro.engine.families import GPU_CLASSES
from swa_repro.vllm.audit.core import arch, whole
from swa_repro.vllm.audit.drive import FORK_DIED, in_fork

SM90 = GPU_CLASSES["sm90"]


def _doc(cell) -> dict:
    return {"document": {"audits": {arch(SM90): {"cohere2": cell}}}, "seconds": 1.0}


@pytest.mark.parametrize("cell, kept", [
    ({"rows": [1]}, True),
    ({"error": "AssertionError: DCP not support sliding window."}, True),  # the release's own answer
    ({"error": f"{FORK_DIED} (status 9)"}, False),  # the machine's event
    ({}, False),
], ids=["audited", "release-error", "fork-killed", "empty"])
def test_a_killed_fork_is_recomputed_a_release_error_is_kept(cell, kept):
    assert whole(_doc(cell), ["cohere2"], [SM90]) is kept


def test_a_fork_that_dies_reports_the_words_whole_looks_for():
    import os
    import signal

    doc = in_fork(lambda: os.kill(os.getpid(), signal.SIGKILL))
    assert doc["error"].startswith(FORK_DIED) and "status 9" in doc["error"]
    assert not whole(_doc(doc), ["cohere2"], [SM90])
