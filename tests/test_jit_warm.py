"""``swa_repro.kernel.jit_warm``: the getters (flashinfer's imports) run one after another in the
caller's thread, only the builds side by side; a failure is reported per helper, not raised."""

from __future__ import annotations

import json
import threading

import pytest

from swa_repro.kernel import jit_warm


@pytest.fixture
def fake(monkeypatch):
    seen = {"getter": [], "build": []}

    def getter(name):
        seen["getter"].append((name, threading.current_thread() is threading.main_thread()))
        if name == "quantization":
            raise ImportError("no such module")
        return lambda: seen["build"].append((name, threading.current_thread() is threading.main_thread()))

    monkeypatch.setattr(jit_warm, "getter", getter)
    return seen


def test_imports_in_the_callers_thread_builds_in_workers(fake):
    res = jit_warm.build(["cascade", "quantization", "cascade"])
    assert fake["getter"] == [("cascade", True), ("quantization", True)]  # once each, in order, main thread
    assert fake["build"] == [("cascade", False)]
    assert isinstance(res["cascade"], float)
    assert res["quantization"] == "error: ImportError: no such module"


def test_main_reports_each_helper_and_exits_1_on_a_failure(fake, capsys):
    assert jit_warm.main(["cascade"]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"cascade"}
    assert jit_warm.main([]) == 1  # default: every helper; quantization fails here
    assert set(json.loads(capsys.readouterr().out)) == set(jit_warm.HELPERS)


def test_an_unknown_helper_is_one_line_exit_2(capsys):
    assert jit_warm.main(["bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "choose from cascade, quantization" in err
