"""swa-repro audit: sglang's own backend driven down every planning path, findings from the calls."""

from __future__ import annotations

import json

import pytest

from conftest import skip_module_unless
import torch

skip_module_unless("sglang")

from swa_repro.cli import main  # noqa: E402
from swa_repro.sglang import harness  # noqa: E402
from swa_repro.sglang.audit import core as audit  # noqa: E402
from swa_repro.sglang.audit import paths as ap  # noqa: E402
from swa_repro.sglang.audit.env import PAGED  # noqa: E402
from swa_repro.sglang.audit.reports import reports  # noqa: E402
from swa_repro.sglang.patch.files import installed_path  # noqa: E402
from swa_repro.sglang.patch.swap import patched  # noqa: E402
from swa_repro.sglang.trace import Call, Trace, encode  # noqa: E402

SWA_CAP, FULL = ap.LayerConfig(8, 50.0), ap.LayerConfig(-1, 0.0)
PATHS = ["extend_paged", "extend_ragged_no_prefix", "target_verify_dflash", "decode", "cuda_graph_decode"]


@pytest.fixture(scope="module")
def results():
    return {p: audit.run_audit("patched" if p else "unpatched", paths=PATHS, layers=[SWA_CAP, FULL])
            for p in (False, True)}


def _f(result, path, param, layer=SWA_CAP.name):
    return [f for f in result.findings if f.path == path and f.parameter == param and f.layer == layer]


def test_every_path_is_driven(results):
    for r in results.values():
        assert not r.not_driven, r.not_driven
        assert {d["path"] for d in r.driven} == set(PATHS) and all(d["calls"] > 0 for d in r.driven)


def test_unpatched_finds_the_paged_only_window_and_patched_does_not(results):
    (f,) = _f(results[False], "extend_paged", "window_left")
    assert (f.plan_value, f.forward_value, f.kind, f.effect) == (-1, 8, "mismatch", "wrong")
    assert f.wrapper.startswith(PAGED) and "(fa2)" in f.wrapper and "tile-granular leak (fa2" in f.consequence
    assert f.evidence["kernel_model"]["statuses"] and "leak" in f.evidence["kernel_model"]["statuses"]
    assert f.evidence["pairs_outside_window"] > 0
    assert _f(results[True], "extend_paged", "window_left") == []


def test_soft_cap_reaches_only_forward_on_every_path(results):
    for r in results.values():
        for path in PATHS:
            caps = _f(r, path, "logits_soft_cap")
            assert caps and all(c.plan_value in (None, 0.0) and c.forward_value == 50.0 and c.effect == "wrong"
                                and "logits uncapped" in c.consequence for c in caps), path


def test_other_reports_read_off_the_findings(results):
    (rag,) = _f(results[True], "extend_ragged_no_prefix", "window_left")
    assert (rag.kind, rag.plan_value, rag.forward_value, rag.effect) == ("dropped", -1, -1, "wrong")
    assert _f(results[True], "target_verify_dflash", "window_left")[0].effect == "wrong"
    rows = reports(list(results.values()))
    paged = next(r for r in rows if "#31501" in r["report"])
    assert paged["unpatched"]["holds"] is True and paged["patched"]["holds"] is False
    assert paged["unpatched"]["evidence"] and "plan=-1 forward=8" in paged["unpatched"]["evidence"][0]
    assert all(r["patched"]["holds"] for r in rows if "#31501" not in r["report"])


def test_decode_window_is_carried_by_the_kv_trim_and_full_layers_have_no_window_findings(results):
    for path in ("decode", "cuda_graph_decode"):
        (w,) = [f for f in _f(results[False], path, "window_left") if f.stage != "replay"]
        assert (w.kind, w.effect, w.evidence["pairs_outside_window"]) == ("dropped", "none", 0)
        assert max(w.evidence["kv_lens"]) <= 8 + 1
    assert not [f for r in results.values() for f in r.findings if f.layer == FULL.name]


def test_cuda_graph_replay_is_compared_with_the_captured_forward(results):
    stages = {f.stage for f in _f(results[False], "cuda_graph_decode", "logits_soft_cap")}
    assert stages == {"capture", "replay"}


# ----------------------------------------------------------------------------- analyzer, no sglang calls
def _trace(*calls, stage=None):
    t = Trace()
    t.calls = [Call(w, cls, m, encode(list(a)), encode(kw)) for w, cls, m, a, kw in calls]
    return ap.PathRun("synthetic", SWA_CAP, t, 8, 0.0, stage or {})


def _plan_args(qo=(0, 12), kv=(0, 20)):
    i = torch.tensor
    return [i(list(qo)), i(list(kv)), torch.arange(kv[-1]), i([1]), 4, 2, 64, 1]


def test_analyzer_compares_forward_with_the_plan_before_it():
    run = _trace((0, PAGED, "__init__", [torch.empty(1)], {"backend": "fa2"}),
                 (0, PAGED, "begin_forward", _plan_args(), {"causal": True}),
                 (0, PAGED, "forward", [torch.zeros(12, 4, 64), None], {"causal": True, "window_left": 8}),
                 (0, PAGED, "plan", _plan_args(), {"causal": True, "window_left": 8}),
                 (0, PAGED, "run", [torch.zeros(12, 4, 64), None], {}))
    (f,) = audit.analyze(run)
    assert (f.plan_value, f.forward_value, f.stage) == (-1, 8, "eager")
    # 12 queries over 20 keys, window 8: rows at positions 8..19 see keys < pos - 8
    assert f.evidence["pairs_outside_window"] == sum(max(p - 8, 0) for p in range(8, 20))


def test_analyzer_trusts_a_plan_that_carries_the_window():
    run = _trace((0, PAGED, "__init__", [torch.empty(1)], {"backend": "fa2"}),
                 (0, PAGED, "plan", _plan_args(), {"causal": True, "window_left": 8}),
                 (0, PAGED, "forward", [torch.zeros(12, 4, 64), None], {"causal": True, "window_left": 8}))
    assert audit.analyze(run) == []


# ----------------------------------------------------------------------------- CLI
def test_cli_json_what_ifs_are_labelled(capsys):
    assert main(["audit", "--paths", "extend_paged", "--both", "--json"]) == 1  # affected (core.exit_status)
    doc = json.loads(capsys.readouterr().out)
    unp, pat = doc["runs"]
    assert (unp["what_if"], pat["what_if"]) == ("unpatched", "patched")
    assert any(f["parameter"] == "window_left" and f["path"] == "extend_paged" for f in unp["findings"])
    assert not any(f["parameter"] == "window_left" for f in pat["findings"])
    for f in unp["findings"]:
        assert {"path", "parameter", "plan_value", "forward_value", "wrapper", "consequence"} <= set(f)


def test_default_audits_the_installed_release_as_it_is_and_says_so(capsys):
    """Misleading behaviour 2: the default used to remove PR #31501 in-process. Now it states the
    release, its file and its state, and reports what that code does."""
    assert main(["audit", "--paths", "extend_paged"]) == 1  # affected: exit 1 (core.exit_status)
    out = capsys.readouterr().out.splitlines()
    path = str(installed_path())
    assert out[0].startswith("sglang 0.5.15.post1 (installed, ") and path in out[0]
    assert "backend PR #31501 not applied" in out[0] and "WHAT-IF" not in "\n".join(out)
    paged = next(ln for ln in out if ln.strip().startswith("paged-only window"))
    assert paged.split()[3] == "holds" and "begin_forward(window_left not passed) then forward(window_left=8)" in paged
    assert main(["audit", "--paths", "extend_paged", "--patched"]) == 1  # the soft cap still holds
    assert capsys.readouterr().out.startswith("WHAT-IF: sglang 0.5.15.post1")


def test_default_applies_no_transform():
    """The as-is audit of a backend whose loaded methods are the fixed ones reports no paged-only
    window (the old default would have removed the fix and reported it)."""
    with patched(harness.backend_module()):
        r = audit.run_audit(paths=["extend_paged"], layers=[SWA_CAP])
    assert r.what_if is None and not r.not_driven
    assert not _f(r, "extend_paged", "window_left") and _f(r, "extend_paged", "logits_soft_cap")


def test_cli_bad_input_is_one_line(capsys):
    assert main(["audit", "--paths", "nope"]) == 2
    assert main(["audit", "--sglang-source", "anything.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--paths" in err[0]
    assert "--sglang-source was removed" in err[1] and "--sglang VERSION" in err[1]
