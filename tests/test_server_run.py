"""A cell's default path and backend come from the release's own ServerArgs (server_run, serving_server),
for any architecture; the static reading of the same files (serving_path) is the independent oracle."""

from __future__ import annotations

import functools
import sys
import types

import pytest

from swa_repro.sglang import server_run
from swa_repro.sglang import serving_path as sp
from swa_repro.sglang import serving_server as ss
from swa_repro.sglang.audit import family_run
from swa_repro.sglang.audit.family_verdict import answer

R = {"ragged_terms": ["self.enable_deterministic", "is_in_piecewise_cuda_graph()", "self.use_paged"],
     "force_paged": ["self.is_multimodal", "self.enable_mis"], "use_paged_env": "SGLANG_FLASHINFER_USE_PAGED",
     "mm_archs": ["Gemma3ForConditionalGeneration"], "src": {"use_ragged": "fi.py:10"}}


def server(backend="flashinfer", graph="breakable", mm=False, **kw):
    return {"ok": True, "attention_backend": backend, "prefill_attention_backend": None,
            "decode_attention_backend": None, "enable_deterministic_inference": False, "disable_cuda_graph": False,
            "prefill_graph": graph, "legacy_graph_flag": False, "is_multimodal": mm, **kw}


def refused(where="sglang/srt/server_args.py:7"):
    return {"ok": False, "error": "AssertionError: needs fa3", "where": where}


def facts(default, fi, pf=None, df=None):
    return {g: {"default": default, "flashinfer": fi, "prefill_flashinfer": pf or refused(),
                "decode_flashinfer": df or refused()} for g in sp.GPUS}


# ----------------------------------------------------------------------------- the rule, on synthetic servers
def test_graph_read_from_either_shape():
    assert server_run.prefill_graph({"cuda_graph_config": {"prefill": {"backend": "breakable"}}}) == "breakable"
    enum = types.SimpleNamespace(value="TC_PIECEWISE")
    assert server_run.prefill_graph({"cuda_graph_config": types.SimpleNamespace(
        prefill=types.SimpleNamespace(backend=enum))}) == "tc_piecewise"
    assert server_run.prefill_graph({"disable_piecewise_cuda_graph": False}) == "tc_piecewise"
    assert server_run.prefill_graph({"disable_piecewise_cuda_graph": True}) == "disabled"
    assert server_run.prefill_graph({}) is None


def test_piecewise_graph_of_the_resolved_server_is_paged_only():
    fp = ss.from_server("x", "m", "MistralForCausalLM", facts(server("fa3"), server(graph="tc_piecewise")), R)
    assert fp.default_prefill == "paged-only" and fp.to_other == ("--cuda-graph-backend-prefill=disabled",)
    assert fp.default_backend == dict.fromkeys(sp.GPUS, "fa3")
    fp = ss.from_server("x", "m", "MistralForCausalLM", facts(server("fa3"), server()), R)
    assert fp.default_prefill == "ragged" and "SGLANG_FLASHINFER_USE_PAGED=1" in fp.to_other
    mm = ss.from_server("x", "m", "Gemma3ForConditionalGeneration", facts(server(), server(mm=True)), R)
    assert mm.default_prefill == "paged-only" and mm.to_other == ()


def test_split_server_reaches_flashinfer_around_a_refusal():
    split = server("fa3", prefill_attention_backend="flashinfer")
    fp = ss.from_server("x", "m", "Exaone4ForCausalLM", facts(server("fa3"), refused(), pf=split), R)
    assert fp.flashinfer_kept is False and fp.refusal.startswith("sglang/srt/server_args.py:7 ")
    s = fp.by_gpu["sm90"]["split"]
    assert s["prefill"]["kept"] and s["prefill"]["default_prefill"] == "ragged" and not s["decode"]["kept"]
    assert any("around the refusal" in n for n in fp.notes)
    f = {"family": "m", "serving": {**fp.__dict__},
         "paths": [{"path": "extend_ragged_no_prefix", "kind": "sliding", "status": "driven", "verdict": "leak",
                    "cap": "none"}]}
    a = answer(f, "sm90")
    assert a["state"] == "only with flags" and a["flags"] == ["--prefill-attention-backend flashinfer"]
    f["paths"][0]["verdict"] = "exact"  # FlashInfer reached (split) and exact: not affected, said why
    a = answer(f, "sm90")
    assert a["state"] == "not affected" and "--prefill-attention-backend flashinfer" in a["note"]
    f["serving"]["by_gpu"] = {g: {**v, "split": {}} for g, v in fp.by_gpu.items()}
    assert answer(f, "sm90")["state"] == "flashinfer refused"


def test_default_refused_is_said_with_its_line():
    fp = ss.from_server("x", "m", "A", facts(refused("sglang/srt/y.py:3"), refused()), R)
    assert fp.default_backend["sm90"].startswith("refused: sglang/srt/y.py:3: AssertionError")


def test_clear_caches_empties_lru_caches_of_sglang_modules():
    mod = types.ModuleType("sglang._swa_test")
    mod.probe = functools.lru_cache(maxsize=1)(lambda: object())
    mod.op = type("Op", (), {"__getattr__": lambda s, n: (_ for _ in ()).throw(RuntimeError(n))})()
    sys.modules[mod.__name__] = mod
    try:
        first = mod.probe()
        assert server_run.clear_caches() >= 1 and mod.probe() is not first
    finally:
        del sys.modules[mod.__name__]


def test_the_caches_found_once_are_the_ones_each_fork_clears():
    """The child lists the lru caches once, before its forks; a fork clears that list without walking
    every module again (what made each of ~230 forks copy the parent's pages)."""
    mod = types.ModuleType("sglang._swa_test_list")
    mod.probe = functools.lru_cache(maxsize=1)(lambda: object())
    other = functools.lru_cache(maxsize=1)(lambda: object())
    sys.modules[mod.__name__] = mod
    try:
        found = server_run.lru_caches()
        assert mod.probe in found and other not in found
        first, kept = mod.probe(), other()
        assert server_run.clear_caches([mod.probe]) == 1 and mod.probe() is not first and other() is kept
    finally:
        del sys.modules[mod.__name__]


def test_each_models_facts_are_cached_on_their_own(tmp_path, monkeypatch):
    """A second set of models sharing one with the first runs the child for the new ones only (the
    table's child resolves every column; a later audit of one family reused none of it)."""
    from swa_repro.sglang import overlay_run

    asked = []

    def child(module, overlay, args, what, cache=True):
        mine = __import__("json").loads(args[args.index("--configs") + 1])
        asked.append(sorted(mine))
        return {"facts": {n: {g: {s: {"ok": True, "of": n} for s in server_run.SCENARIOS} for g in server_run.DEVICES}
                          for n in mine}}, 1.0, {"cache": "off"}

    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path))
    monkeypatch.delenv("SWA_REPRO_NO_CACHE", raising=False)
    monkeypatch.setattr(overlay_run, "run_child", child)
    monkeypatch.setattr(overlay_run, "child_parts", lambda module, overlay: {"module": module, "overlay": "x"})
    cfg = {n: {"architectures": [n], "sliding_window": w} for n, w in (("A", 8), ("B", 16), ("C", 32))}
    first = server_run.server_facts("0.5.23", tmp_path, {"A": cfg["A"], "B": cfg["B"]})
    second = server_run.server_facts("0.5.23", tmp_path, {"B": cfg["B"], "C": cfg["C"]})
    assert asked == [["A", "B"], ["C"]] and second["B"] == first["B"] and second["C"]["sm90"]["default"]["of"] == "C"
    server_run.server_facts("0.5.23", tmp_path, {"B": {**cfg["B"], "sliding_window": 64}})  # a new config: new facts
    assert asked[-1] == ["B"]


# ----------------------------------------------------------------------------- real releases, against the source
NAMES = ["mistral", "qwen2-swa", "gemma2", "gpt-oss", "exaone4"]


@functools.cache
def release_serving(version):
    """One ServerArgs child per release for every test here (its result is cached by content)."""
    from conftest import release_overlay

    return family_run._serving(release_overlay(version), version, NAMES)


def oracle(version, arch):
    """The static reading (serving_path's AST rules) of the same release for ``arch``."""
    from conftest import release_overlay

    pkg = release_overlay(version) / "sglang"
    src, reg = sp._Src(pkg), sp._registered(pkg)
    return sp._family(version, arch, arch, src, sp._release_rules(src), reg)


# 0.5.14 is in the release matrix (a ServerArgs child of its own, ~80 s from nothing): 0.5.10 (kept for the
# piecewise graph below, the same child) and 0.5.23 hold the rule on the oldest and the newest server code.
@pytest.mark.network
@pytest.mark.parametrize("version", ["0.5.10", pytest.param("0.5.14", marks=pytest.mark.matrix), "0.5.23"])
def test_families_without_a_static_rule_get_the_servers_answer(version):
    got = release_serving(version)
    for name, fp in got.items():
        want = oracle(version, fp["architecture"])
        assert fp["default_backend"] == want.default_backend or \
            want.default_backend["sm90"].startswith("refused") and fp["default_backend"]["sm90"].startswith("refused")
        assert fp["flashinfer_kept"] == want.flashinfer_kept, name
        assert fp["default_prefill"] == want.default_prefill, name
        if want.refusal:  # the server raised inside the assert the source reading found
            rel, ln = want.refusal.split(" ")[0].rsplit(":", 1)
            where_rel, where_ln = fp["sources"]["refusal"].rsplit(":", 1)
            assert where_rel == rel and 0 <= int(where_ln) - int(ln) <= 6, (name, want.refusal, fp["sources"])
    assert got["mistral"]["default_backend"] == {"sm90": "fa3", "sm100": "trtllm_mha", "other": "flashinfer"}


@pytest.mark.network
def test_a_default_piecewise_prefill_graph_is_not_ragged():
    """0.5.10's ServerArgs keeps ``disable_piecewise_cuda_graph = False`` for Mistral: its EXTEND
    batches replay the piecewise graph and take paged-only (the old answer took it as ragged)."""
    mistral = release_serving("0.5.10")["mistral"]
    assert mistral["default_prefill"] == "paged-only"
    assert mistral["to_other"] == ["--disable-piecewise-cuda-graph"]
    f = {"family": "mistral", "serving": mistral,
         "paths": [{"path": "extend_paged", "kind": "sliding", "status": "driven", "verdict": "leak", "cap": "none"},
                   {"path": "extend_ragged_no_prefix", "kind": "sliding", "status": "driven", "verdict": "exact",
                    "cap": "none"}]}
    a = answer(f, "sm80")
    assert a["state"] == "affected on the default path" and "no server rule" not in str(a.get("note"))


@pytest.mark.network
def test_exaone4_0_5_23_prefill_flag_reaches_flashinfer_around_the_refusal():
    ex = release_serving("0.5.23")["exaone4"]
    assert ex["flashinfer_kept"] is False and ex["sources"]["refusal"].startswith("sglang/srt/arg_groups/model_hook.py:")
    for g in sp.GPUS:
        assert ex["by_gpu"][g]["split"]["prefill"]["kept"], g


def checkpoint() -> dict:
    """The config.json of the checkpoint below: test_checkpoint_config's null-window Mistral."""
    from test_checkpoint_config import MISTRAL

    return MISTRAL


@pytest.mark.network
def test_a_checkpoints_own_config_is_resolved(tmp_path):
    """``--model PATH``: the user's config.json is what the release's ServerArgs reads (a Mistral
    checkpoint: no static rule names MistralForCausalLM; the server's answer on every GPU class). The
    checkpoint is test_checkpoint_config's Mistral (:func:`checkpoint`): the same ServerArgs cell (its
    name and small config) that its audit resolves, so the suite runs one ServerArgs child for both."""
    import json

    from conftest import release_overlay

    from swa_repro.sglang import checkpoint as ckpt

    (tmp_path / "config.json").write_text(json.dumps(checkpoint()))
    ck = ckpt.read(str(tmp_path))
    got = family_run._serving(release_overlay("0.5.23"), "0.5.23", [], ck)[ck.family]
    assert got["architecture"] == "MistralForCausalLM" and got["flashinfer_kept"] is True
    assert got["default_backend"] == {"sm90": "fa3", "sm100": "trtllm_mha", "other": "flashinfer"}
    assert got["default_prefill"] == "ragged" and set(got["by_gpu"]) == set(sp.GPUS)


def test_a_failure_outside_the_servers_rules_is_no_answer_and_the_source_reading_answers(tmp_path, monkeypatch):
    """A server that fails in the release's config code (not an assert of server_args / arg_groups) is
    not a refusal: that model's cell is read from the source (serving_path), said so."""
    broken = {"ok": False, "error": "KeyError: 'rope_theta'", "where": "sglang/srt/configs/model_config.py:9"}
    assert ss.is_refusal(refused("sglang/srt/arg_groups/model_hook.py:5")) and not ss.is_refusal(broken)
    assert ss.unresolved(facts(server("fa3"), broken)) == "sglang/srt/configs/model_config.py:9: KeyError: 'rope_theta'"
    assert ss.unresolved(facts(server("fa3"), refused("sglang/srt/server_args.py:3"))) is None
    from test_serving_path import make_pkg

    pkg = make_pkg(tmp_path)
    got = {"Gemma2ForCausalLM": facts(server("fa3"), broken), "GptOssForCausalLM": facts(server("fa3"), server())}
    monkeypatch.setattr(server_run, "server_facts", lambda release, overlay, models: {
        n: got[c["architectures"][0]] for n, c in models.items()})
    out = ss.serving(pkg.parent, "x", {"g": {"architectures": ["Gemma2ForCausalLM"]},
                                       "o": {"architectures": ["GptOssForCausalLM"]}})
    assert any("ServerArgs did not resolve here (sglang/srt/configs/model_config.py:9" in n for n in out["g"].notes)
    assert out["g"].default_backend["sm90"] == "fa3"  # the static chooser of make_pkg's server_args.py
    assert out["o"].flashinfer_kept is True and not any("did not resolve" in n for n in out["o"].notes)
