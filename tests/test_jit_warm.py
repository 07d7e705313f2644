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
    assert err.count("\n") == 1 and "choose from kit, cascade, quantization, fa2-full" in err


def test_kit_builds_every_attention_module_the_kit_plans_with_plans_arguments(monkeypatch, capsys):
    """``kit``: fp16, head dim 64, int32 indices, no posenc; fa2 and fa3 prefill with and without the
    window and the cap, decode with and without the cap; and the helpers; each once, as plan() asks
    (prefill.py:2981-2996, decode.py:2441-2451 in flashinfer 0.7.2)."""
    import sys
    import types

    import torch

    asked = []
    prefill = types.SimpleNamespace(get_batch_prefill_module=lambda *a: asked.append(("prefill", a)))
    decode = types.SimpleNamespace(get_batch_decode_module=lambda *a: asked.append(("decode", a)))
    fi = types.ModuleType("flashinfer")
    fi.prefill, fi.decode = prefill, decode
    monkeypatch.setitem(sys.modules, "flashinfer", fi)
    monkeypatch.setitem(sys.modules, "flashinfer.prefill", prefill)
    monkeypatch.setitem(sys.modules, "flashinfer.decode", decode)
    helpers = []
    orig = jit_warm.getter
    monkeypatch.setattr(jit_warm, "getter",
                        lambda n: (lambda: helpers.append(n)) if n in jit_warm.HELPERS else orig(n))
    assert jit_warm.main(["kit"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == set(jit_warm.KIT) | set(jit_warm.HELPERS) and len(jit_warm.KIT) == 10
    assert sorted(helpers) == ["cascade", "quantization"]
    f16, head = torch.float16, (torch.float16,) * 3 + (torch.int32, 64, 64, 0)
    want = {("prefill", (b, *head, swa, cap, False)) for b in ("fa2", "fa3") for swa in (0, 1) for cap in (0, 1)}
    want |= {("decode", (*head, False, cap)) for cap in (0, 1)}
    assert {(k, tuple(a)) for k, a in asked} == want and len(asked) == 10 and head[0] is f16
