"""Every kind of overlay run gives the same document forked from a warm server (``engine.forkserver``)
as from a plain ``python -m`` child: one server serves them in turn, so each later run forks from
what the earlier ones taught it to preload (where a wrongly preloaded library would show)."""

from __future__ import annotations

import threading

import pytest

TIMINGS = {"seconds", "audit_seconds", "child_seconds", "import_seconds", "result_cache", "overlay_info", "elapsed_s"}


def _strip(d):
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in TIMINGS}
    if isinstance(d, list):
        return [_strip(x) for x in d]
    return d


def _runs() -> list:
    """Each run kind, in one server: a family as shipped then fixed (notebook 07's order: the second
    forks with what the first imported; a tilelang preloaded there broke it), an audit, the cap
    check, the kit."""
    from swa_repro.sglang.audit.family_run import audit_families
    from swa_repro.sglang.audit.release import audit_release
    from swa_repro.sglang.fix.cap_safety import cap_safety
    from swa_repro.sglang.fix.fixes import ORDER
    from swa_repro.sglang.overlay_run import overlay_for, run_child

    quiet = lambda *a, **k: None  # noqa: E731
    kit_overlay = overlay_for("0.5.23", list(ORDER), note=quiet)[0]
    return [
        audit_families("0.5.15.post1", "gemma2", "sm90", note=quiet),
        audit_families("0.5.15.post1", "gemma2", "sm90", fixes=list(ORDER), note=quiet),
        audit_release("0.5.23", note=quiet),
        cap_safety("0.5.23", list(ORDER), note=quiet),
        run_child("swa_repro.sglang.kit", kit_overlay, ["--mode", "model", "--mode-reason", "test"], "kit", cache=False)[0],
    ]


@pytest.mark.matrix
@pytest.mark.slow
def test_forked_runs_equal_plain_runs(monkeypatch):
    from swa_repro.engine import forkserver

    monkeypatch.setenv("SWA_REPRO_NO_CACHE", "1")
    monkeypatch.setenv("SWA_REPRO_FORKSERVER", "1")
    forkserver.close_all()  # an earlier test in this worker may have left a server with runs of its own
    calls, threads = [], []
    real_run = forkserver.run
    monkeypatch.setattr(forkserver, "run", lambda *a: calls.append(a[0]) or threads.append(threading.get_ident())
                        or real_run(*a))
    forked = _runs()
    # every child the five runs asked for (a family audit also asks for its ServerArgs child, on the
    # process's one helper thread: engine.child.beside) was forked, from one server for every asking
    # thread: the parent's environment gains TORCHINDUCTOR_CACHE_DIR on the way (forkserver.SELF_SET),
    # which once started a second server
    runs = [s.runs for s in forkserver._SERVERS.values()]
    assert len(calls) >= 5 and "swa_repro.sglang.server_run" in calls and len(set(threads)) == 2, calls
    assert runs == [len(calls)], (runs, calls)
    forkserver.close_all()
    monkeypatch.setenv("SWA_REPRO_FORKSERVER", "0")
    plain = _runs()
    for f, p in zip(forked, plain):
        assert _strip(f) == _strip(p)
    assert all("error" not in fam for run in forked[:2] for fam in run["families"])
