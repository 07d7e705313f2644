"""The kernel model against every committed GPU recording (made by `swa-repro record` on an H200).

Where the model says ``exact`` or ``leak`` the probed intervals must equal the model's, row by row
and head by head, and the real kernel must be deterministic and consistent; where it says
``undefined`` the recording must show it: in-window keys missing, NaN, values that are not a
softmax over one key set, or run-to-run differences.
"""

import pytest

from swa_repro.core.intervals import nan_max
from swa_repro.evidence.recordings import load_recordings
from swa_repro.kernel.model import simulate
from swa_repro.kernel.probe import ProbeRequest

RECORDINGS = load_recordings()
ERR_TOL = 3e-2  # bf16 output vs float64 attention with the same mask


def test_recordings_exist_with_provenance():
    assert RECORDINGS, "no committed recordings: run `bash scripts/gpu_evidence.sh VERSION` on a GPU"
    for rec in RECORDINGS:
        p = rec.provenance
        for key in ("gpu", "driver", "torch", "flashinfer", "sglang", "date_utc", "command"):
            assert p.get(key), f"{rec.path}: provenance lacks {key}"
        assert p["flashinfer"]["version"] == rec.flashinfer_version
        assert p["command"].startswith("swa-repro record")


def test_recordings_cover_the_matrix():
    cases = [r.case for r in RECORDINGS]
    assert {r.flashinfer_version for r in RECORDINGS} >= {"0.6.12", "0.7.2.post1"}
    assert len({c.name for c in cases}) >= 8
    assert {c.group_size for c in cases} >= {1, 2, 4, 8}
    assert {c.head_dim for c in cases} >= {64, 128, 256}
    assert {c.page_size for c in cases} >= {1, 16}
    assert any(max(c.prefix_lens) > 0 for c in cases) and any(max(c.prefix_lens) == 0 for c in cases)
    assert any(c.batch_size == 1 for c in cases) and any(c.batch_size > 1 for c in cases)
    assert {c.resolved_backend for c in cases} >= {"fa2", "fa3"} and any(c.backend == "auto" for c in cases)
    assert any(c.plan_window_left == -1 for c in cases) and any(c.plan_window_left == c.window_left for c in cases)
    split = [simulate(c).plan.split_kv for c in cases if c.resolved_backend == "fa2"]
    assert any(split) and not all(split)
    assert any(c.disable_split_kv for c in cases)


def _missing_keys(req, window_left) -> int:
    return int(req.intervals.diff(window_left)[1].sum())


@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda r: f"{r.flashinfer_version}/{r.name}")
def test_model_equals_probe(rec):
    model = simulate(rec.case)
    assert model.statuses == list(rec.statuses), "model status differs from the status read off the kernel"
    for m, r in zip(model.requests, rec.requests):
        if m.status == "undefined":
            evidence = (_missing_keys(r, rec.case.window_left) + int(r.nan.sum()) + int((~r.consistent).sum())
                        + int((~r.repeat_equal).sum()) + int((~r.random_equal).sum()))
            assert evidence > 0, "model says undefined but the kernel looked well defined"
            continue
        assert r.intervals.equals(m.intervals), "probed intervals differ from the model's"
        assert r.contiguous.all() and r.consistent.all() and not r.nan.any()
        assert r.repeat_equal.all() and r.random_equal.all()
        assert nan_max(r.err_vs_model) <= ERR_TOL  # random data: the model's mask explains the output
        if m.status == "leak":
            assert _missing_keys(r, rec.case.window_left) == 0 and nan_max(r.err_vs_reference) > ERR_TOL


@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda r: f"{r.flashinfer_version}/{r.name}")
def test_status_rule_reproduces_recorded_statuses(rec):
    """The one status rule (core.intervals.status_of via ProbeRequest), applied afresh to the
    recorded arrays, gives the status recorded on the GPU."""
    for r in rec.requests:
        flags = {f: getattr(r, f) for f in ("count", "contiguous", "consistent", "nan", "repeat_equal",
                                            "err_vs_reference", "err_vs_model", "err_vs_probed", "random_equal")}
        assert ProbeRequest(r.intervals, rec.case.window_left, **flags).status == r.status


def test_versions_agree():
    """flashinfer 0.6.12 (sglang 0.5.15.post1's pin) and 0.7.2.post1 read the same masks."""
    by = {}
    for rec in RECORDINGS:
        by.setdefault(rec.name, {})[rec.flashinfer_version] = rec
    both = [v for v in by.values() if len(v) == 2]
    assert both
    for v in both:
        a, b = v["0.6.12"], v["0.7.2.post1"]
        assert a.statuses == b.statuses
        for ra, rb, s in zip(a.requests, b.requests, a.statuses):
            if s != "undefined":
                assert ra.intervals.equals(rb.intervals)
