"""Every sliding-window architecture of a release (issue #41 part 2): ``swa_archs`` (ast) held against a
second route over the same files (regular expressions over the text, nothing shared), and every one of
0.5.23's given a cell by the family table (``audit.arch_cells``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import release_srt as _srt

from swa_repro.sglang import swa_archs


def oracle(srt: Path) -> tuple[set, set]:
    """``(direct, reachable)`` by text alone: architectures whose EntryClass file passes a window keyword
    (black's ``sliding_window_size=X``, X not -1/None/0) or that ``is_hybrid_swa_model``'s set names;
    and every architecture whose file imports, transitively, a file that passes one (a superset)."""
    models = srt / "models"
    text = {p: p.read_text(encoding="utf-8-sig") for p in models.glob("*.py")}
    win = {p for p, t in text.items() if re.search(r"\bsliding_window_size=(?!\s*(-1|None|0)\b)", t)
           or "def get_attention_sliding_window_size" in t}
    imp = {p: {models / f"{m}.py" for m in re.findall(r"^from sglang\.srt\.models\.(\w+) import", t, re.MULTILINE)}
           for p, t in text.items()}

    def reach(p):
        seen, todo = set(), [p]
        while todo:
            q = todo.pop()
            if q not in seen and q in text:
                seen.add(q)
                todo += imp[q]
        return seen
    mc = (srt / "configs" / "model_config.py").read_text()
    m = re.search(r"def is_hybrid_swa_model\(.*?\n    \}", mc, re.DOTALL)
    body = m.group(0) if m else ""
    hyb = set(re.findall(r'"(\w+)"', body))
    for star in re.findall(r"\*(\w+)", body):
        c = re.search(rf"^{star} = .*?\n\)", mc, re.DOTALL | re.MULTILINE)
        hyb |= set(re.findall(r'"(\w+)"', c.group(0))) if c else set()
    direct, over = set(), set()
    for p, t in text.items():
        e = re.search(r"^EntryClass\s*=\s*(\[.*?\]|\w+)", t, re.DOTALL | re.MULTILINE)
        for n in set(re.findall(r"\b([A-Za-z_]\w*)\b", e.group(1))) if e else ():
            if p in win or n in hyb:
                direct.add(n)
            if reach(p) & win or n in hyb:
                over.add(n)
    return direct, over


# 0.5.14 is in the release matrix (its model files parsed by both routes, 20 s from nothing under load): 0.5.23
# and 0.5.10 hold the two routes equal on the newest and the oldest release the audit drives.
@pytest.mark.parametrize("version", ["0.5.23", pytest.param("0.5.14", marks=pytest.mark.matrix), "0.5.10"])
def test_discovery_agrees_with_a_text_route(version):
    srt = _srt(version)
    found = {a.architecture for a in swa_archs.discover(srt)}
    direct, over = oracle(srt)
    assert direct <= found, sorted(direct - found)  # every file that passes a window: each of its archs
    assert found <= over, sorted(found - over)  # nothing the files cannot reach
    if version == "0.5.23":
        assert len(found - {a for a in found if a.startswith("Transformers")}) >= 40
        assert "gemma2.py:181" in {a.architecture: a for a in swa_archs.discover(srt)}["Gemma2ForCausalLM"].windows
        for a in ("Gemma2ForCausalLM", "Cohere2ForCausalLM", "GptOssForCausalLM", "MiMoV2ForCausalLM",
                  "NemotronHForCausalLM", "Step3p5ForCausalLM"):  # a module constant: nemotron_h.py:797
            assert a in found


def test_sinks_are_found_and_the_backend_is_read():
    srt = _srt("0.5.23")
    by = {a.architecture: a for a in swa_archs.discover(srt)}
    models = srt / "models"
    for arch in ("GraniteForCausalLM", "MiMoV2ForCausalLM", "GptOssForCausalLM"):
        for site in by[arch].sinks:
            f, line = site.split(":")
            assert "sinks=" in (models / f).read_text().splitlines()[int(line) - 1]
    assert not by["Gemma2ForCausalLM"].sinks
    where = swa_archs.backend_takes_sinks(srt)
    f, line = where.split(":")
    assert "def forward_extend" in (srt.parent.parent / "sglang" / "srt" / f).read_text().splitlines()[int(line) - 1]
    assert "crashes on FlashInfer" in swa_archs.crash_on_flashinfer(srt, by["GraniteForCausalLM"])
    assert swa_archs.crash_on_flashinfer(srt, by["Gemma2ForCausalLM"]) is None


def _release(tmp_path, backend_sig: str) -> Path:
    srt = tmp_path / "sglang" / "srt"
    (srt / "models").mkdir(parents=True)
    (srt / "layers" / "attention").mkdir(parents=True)
    (srt / "configs").mkdir()
    (srt / "configs" / "model_config.py").write_text(
        "X_ARCHS = ('HybOnly',)\ndef is_hybrid_swa_model(a, c=None):\n    s = {\n        *X_ARCHS,\n    }\n")
    (srt / "layers" / "attention" / "flashinfer_backend.py").write_text(
        f"class FlashInferAttnBackend:\n    def forward_extend({backend_sig}):\n        pass\n")
    (srt / "models" / "base.py").write_text(
        "class Attn:\n    def __init__(self, c):\n        self.attn = RadixAttention(1, sliding_window_size=c.w - 1)\n"
        "    def forward(self, q):\n        return self.attn(q, sinks=self.sinks)\n"
        "class NoWin:\n    def __init__(self):\n        self.attn = RadixAttention(1, sliding_window_size=-1)\n")
    (srt / "models" / "a.py").write_text(
        "from sglang.srt.models.base import Attn, NoWin\nLAYERS = {'A': Attn}\n"
        "class WinModel:\n    def __init__(self):\n        self.l = LAYERS['A']\n"
        "class Plain:\n    def __init__(self):\n        self.l = NoWin()\n"
        "class HybOnly:\n    pass\nEntryClass = [WinModel, Plain, HybOnly]\n")
    return srt


def test_discovery_follows_constants_imports_and_the_hybrid_set(tmp_path):
    srt = _release(tmp_path, "self, q, layer, fb, save_kv_cache=True")
    got = {a.architecture: a for a in swa_archs.discover(srt)}
    assert set(got) == {"WinModel", "HybOnly"}  # Plain's window is -1: no window
    assert got["WinModel"].windows == ("base.py:3",) and got["WinModel"].sinks == ("base.py:5",)
    assert got["HybOnly"].hybrid == "configs/model_config.py:4" and not got["HybOnly"].windows
    crash = swa_archs.crash_on_flashinfer(srt, got["WinModel"])
    assert "models/base.py:5" in crash and "flashinfer_backend.py:2" in crash
    srt2 = _release(tmp_path / "k", "self, q, layer, fb, **kwargs")
    assert swa_archs.crash_on_flashinfer(srt2, swa_archs.discover(srt2)[-1]) is None


def test_every_sliding_window_architecture_of_0523_has_a_cell():
    """The table's columns for 0.5.23: the 8 families and a planned cell (driven or decided) for every
    other architecture discovery finds; the Transformers fallback's classes none (each architecture only
    the fallback serves is a column of its own: tests/test_fallback_cells.py)."""
    from swa_repro.engine.families import MODELS
    from swa_repro.sglang.audit import arch_cells, fallback_cells

    srt = _srt("0.5.23")
    smalls, static = arch_cells.plan("0.5.23", srt.parent.parent)
    fams = {a for _, _, a in MODELS.values()}
    found = swa_archs.discover(srt)
    for a in found:
        if a.fallback:
            assert a.architecture not in smalls and a.architecture not in static
        else:
            assert a.architecture in fams | set(smalls) | set(static), a.architecture
    assert set(fallback_cells.fallback_only(srt)) <= set(smalls) | set(static)
    assert not set(smalls) & set(static)
    assert static["GraniteForCausalLM"]["crash"].startswith("the release crashes on FlashInfer: models/granite.py")
    for a, x in smalls.items():  # driven at the class's own defaults, as transformers publishes them
        assert x["small"]["config"]["architectures"] == [a]
    assert "Gemma3nForCausalLM" in smalls  # a published config class the release builds


def test_a_crash_cell_is_answered_as_such_and_refusal_comes_first():
    """A decided cell (arch_cells: no ``kinds``) through the same answer, cell and remedy as a driven one."""
    from swa_repro.sglang.audit.family_fix import remedy
    from swa_repro.sglang.audit.family_verdict import answer, cell_of

    crash = {"family": "GraniteForCausalLM", "crash": "the release crashes on FlashInfer: models/granite.py:221 ...",
             "serving": {"flashinfer_kept": True, "default_backend": {"sm90": "fa3"}}}
    a = answer(crash, "sm90")
    assert a["state"] == "crashes on FlashInfer" and a["why"] == [crash["crash"]] and a["default_backend"] == "fa3"
    c = cell_of({**crash, "answer": a})
    assert c["state"] == "crashes on FlashInfer" and "granite.py:221" in c["why"][0]
    assert "--attention-backend fa3" in remedy("GraniteForCausalLM", c, "sm90")["instead"]
    refused = {**crash, "serving": {"flashinfer_kept": False, "refusal": "model_hook.py:536"}}
    assert answer(refused, "sm90")["state"] == "flashinfer refused"
    fb = {"family": "Transformers fallback", "fallback": "served through sglang's Transformers fallback ..."}
    assert answer(fb, "sm90")["state"] == "fallback: not audited"


def test_the_table_groups_architecture_columns_by_what_is_wrong():
    from swa_repro.sglang.audit import family_table as ft

    def cell(state):
        return {"state": state, "why": []}
    rows = [{"sglang": "0.5.22", "gpu": "sm90", "cells": {"gemma2": cell("not affected"), "B": cell("not affected"),
                                                          "A": cell("crashes on FlashInfer"), "C": cell("not built")}},
            {"sglang": "0.5.23", "gpu": "sm90", "cells": {"gemma2": cell("not affected"),
                                                          "B": cell("affected on the default path"),
                                                          "A": cell("crashes on FlashInfer"), "C": cell("not built")}}]
    table = {"rows": rows}
    assert ft._families(table) == ["gemma2", "B", "A", "C"]  # the families first, then the worst state's group
    text = "\n".join(ft.grouped(table))
    assert "- **affected** (1): B" in text and "- **crashes (sinks)** (1): A" in text
    assert "- **not affected** (1): gemma2" in text and "- **not built** (1): C" in text


def test_the_fallback_column_names_what_only_the_fallback_serves():
    """Olmo3 (issue #41's `--model olmo3`): a window in transformers' Olmo3Config, no model file of 0.5.23
    names it (the release's own configs/olmo3.py:59-64 renames it Olmo2ForCausalLM, which the audit's
    build then finds: ``fallback_cells.served_as``); Gemma2 has its own file."""
    from swa_repro.sglang.audit import fallback_cells

    srt = _srt("0.5.23")
    only = fallback_cells.fallback_only(srt)
    assert "Olmo3ForCausalLM" in only and "Gemma2ForCausalLM" not in only and "MistralForCausalLM" not in only
    text = "\n".join(p.read_text(encoding="utf-8-sig") for p in (srt / "models").glob("*.py"))
    assert not [a for a in only if a in text]
