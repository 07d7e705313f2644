"""``audit --sglang X --model FAMILY [--gpu CLASS]`` (issue #25): families, GPU classes, bad input,
and 0.5.23's own code at a real window.

Oracles: transformers' config classes read directly (the small config keeps the published pattern
and sizes); FlashInfer's backend rules written out from its source (0.7.2 utils.py:616-628,
prefill.py:4815-4816); the keys a plain-causal or windowless run lets a query see, from the batch's
lengths alone (closed forms, no mask). Bad input is one line, exit 2, before any audit: the audit's
child and the installer are stand-ins that fail the test.
"""

from __future__ import annotations

import pytest

from conftest import skip_module_unless

skip_module_unless("transformers")

from swa_repro.cli import main  # noqa: E402
from swa_repro.core.checkpoint_config import layer_kinds  # noqa: E402
from swa_repro.engine import families as efam  # noqa: E402
from swa_repro.engine.families import FAMILIES, GPU_CLASSES, MODELS  # noqa: E402
from swa_repro.sglang import families as fam  # noqa: E402
from conftest import never  # noqa: E402


# ----------------------------------------------------------------------------- families
@pytest.mark.parametrize("family", FAMILIES)
def test_small_config_keeps_the_published_pattern_and_sizes(family):
    import transformers

    cls_name, switches, arch = MODELS[family]
    full = getattr(transformers, cls_name)(**switches)
    s = efam.small_config(family)
    kinds = layer_kinds(full)
    assert s.kinds == kinds[:len(s.kinds)] and set(s.kinds) == set(kinds)  # a prefix holding every kind
    assert len(s.kinds) == max(2, *(kinds.index(k) + 1 for k in set(kinds)))  # and the shortest such
    assert (s.sliding_window, s.num_qo_heads) == (full.sliding_window, full.num_attention_heads)
    assert s.head_dim == (getattr(full, "head_dim", None) or full.hidden_size // full.num_attention_heads)
    assert s.config["num_hidden_layers"] == len(s.kinds) and s.config["architectures"] == [arch]
    assert s.intended_window == full.sliding_window - 1  # HF's inclusive count, as FlashInfer counts it


@pytest.mark.parametrize("gpu, backend, mask, head_dim, runs", [
    ("sm90", "auto", False, 256, "fa3"), ("sm90", "auto", False, 128, "fa3"), ("sm90", "auto", True, 128, "fa2"),
    ("sm90", "auto", False, 96, "fa2"), ("sm80", "auto", False, 128, "fa2"), ("sm100", "auto", False, 128, "fa2"),
    ("sm100", "cutlass", False, 128, "cutlass"), ("sm90", "fa2", False, 256, "fa2"), ("sm80", "fa3", False, 64, "fa3"),
])
def test_gpu_class_resolves_what_flashinfer_runs(gpu, backend, mask, head_dim, runs):
    assert GPU_CLASSES[gpu].resolve(backend, head_dim, mask) == runs


# ----------------------------------------------------------------------------- bad input (conftest.no_work)
@pytest.mark.parametrize("argv, must", [
    (["--sglang", "0.5.23", "--model", "llama9"], "--model 'llama9': unknown family"),
    (["--sglang", "0.5.23", "--model", "gemma2,nope"], "--model 'nope': unknown family"),
    (["--sglang", "0.5.23", "--model", ","], "--model selects no family"),
    (["--sglang", "0.5.23", "--model", "gemma2", "--gpu", "sm75"], "--gpu 'sm75': choose one of sm80, sm90, sm100"),
    (["--sglang", "0.5.23", "--gpu", "sm90"], "--gpu goes with --model"),
    (["--model", "gemma2"], "add --sglang VERSION"),
    (["--sglang", "0.4.0", "--model", "gemma2"], "0.5.10 and later"),
    (["--sglang", "0.5.23;x", "--model", "gemma2"], "give a release number"),
    (["--sglang", "0.5.23", "--model", "gemma2", "--both"], "--model goes without"),
    (["--sglang", "0.5.23", "--model", "gemma2", "--paths", "decode"], "--model goes without"),
    (["--sglang", "0.5.23", "--model", "gemma2", "--fix", "bogus"], "bogus"),
    (["--sglang", "0.5.23", "--model", "cohere2"], "--model cohere2: not in this release: sglang 0.5.23 has no model "
                                                   "file for Cohere2ForCausalLM; it serves gemma2"),
])
def test_bad_input_is_one_line_exit_2_before_any_work(argv, must, no_work, capfd):
    capfd.readouterr()
    rc = main(["audit", *argv])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and must in err[0], (rc, err)


@pytest.mark.parametrize("argv, must", [
    (["--release-table", "--model", "gemma2"], "--release-table --model takes all"),
    (["--release-table", "--model", "all", "--gpu", "sm75"], "--gpu 'sm75'"),
    (["--release-table", "--model", "all", "--releases", "0.5.9"], "0.5.10 and later"),
    (["--release-table", "--model", "all", "--both"], "takes --releases, --gpu, --jobs and --out only"),
])
def test_family_table_input_is_checked_before_any_audit(argv, must, no_work, capfd, monkeypatch):
    from swa_repro.sglang.audit import family_table

    monkeypatch.setattr(family_table, "build", never)
    capfd.readouterr()
    rc = main(["audit", *argv, "--out", str(no_work / "t")])
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and must in err[0], (rc, err)
    assert not (no_work / "t").exists()


def test_the_family_table_markdown_is_its_json_rendered():
    from swa_repro.engine.provenance import TABLE_DIR
    from swa_repro.sglang.audit import family_table, table

    p = TABLE_DIR / "families.json"
    if not p.is_file():
        pytest.skip("docs/audit/families.json not generated yet")
    t = table.committed(p)
    assert (TABLE_DIR / "families.md").read_text() == family_table.markdown(t)
    assert {r["sglang"] for r in t["rows"]} >= {"0.5.14", "0.5.23"} and t["gpus"]


def test_each_gpu_section_holds_every_column_once_in_tables_by_group():
    """The committed table's markdown: per GPU class, every column of the JSON's rows heads exactly one
    state table, and the columns of a table share one worst state (read here from the JSON cells, not
    through ``group_of``), so that no table lays every architecture side by side."""
    from swa_repro.engine.families import FAMILIES
    from swa_repro.engine.provenance import TABLE_DIR
    from swa_repro.sglang.audit import family_table, table

    p = TABLE_DIR / "families.json"
    if not p.is_file():
        pytest.skip("docs/audit/families.json not generated yet")
    t = table.committed(p)
    order = list(family_table.GROUPS)
    worst = {}
    for r in t["rows"]:
        for f, c in r["cells"].items():
            k = order.index(c["state"]) if c["state"] in order else len(order)
            worst[f] = min(worst.get(f, k), k)
    md = family_table.markdown(t).split("\n## Every sliding-window architecture")[0]
    for g in t["gpus"]:
        section = md.split(f"\n## {g}\n")[1].split("\n## ")[0]
        heads = [line for line in section.splitlines() if line.startswith("| sglang | ")][::2]  # state tables
        cols = [h.strip("| ").split(" | ")[1:] for h in heads]
        flat = [c for cs in cols for c in cs]
        assert sorted(flat) == sorted({f for r in t["rows"] if r["gpu"] == g for f in r["cells"]})
        assert len(flat) == len(set(flat)) and len(cols) > 1
        for cs in cols:
            if not set(cs) <= set(FAMILIES):
                assert len({worst[c] for c in cs}) == 1, cs


def test_all_keeps_the_families_the_release_serves(no_work):
    assert fam.check_release_has("0.5.23", no_work / "ov", list(FAMILIES), explicit=False) == ["gemma2"]


# ----------------------------------------------------------------------------- 0.5.23's own code
def _overlay_0_5_23():
    from conftest import release_overlay

    return release_overlay("0.5.23")


@pytest.fixture(scope="module")
def doc_0_5_23():
    """sm90's document of 0.5.23's family audit; the tests read gemma2, cohere2 and mistral of it (the
    whole sweep's child, shared: ``conftest.release_families``)."""
    pytest.importorskip("sglang")
    from conftest import release_families

    return release_families("0.5.23")["sm90"]


def _run(doc, family, path, kind):
    f = next(f for f in doc["families"] if f["family"] == family)
    return f, next(r for r in f["paths"] if r["path"] == path and r["kind"] == kind)


@pytest.mark.slow
def test_0_5_23_gemma2_own_layers_and_runner_window(doc_0_5_23):
    f, r = _run(doc_0_5_23, "gemma2", "extend_ragged_no_prefix", "sliding")
    assert f["build"]["runner_window"] == 4095 and "resolve_sliding_window_size" in f["build"]["runner_rule"]
    assert f["kinds"]["sliding"]["layer_window"] == 4095 and f["kinds"]["full"]["layer_window"] == -1
    assert f["kinds"]["sliding"]["cap"] == 50.0
    # ragged, no prefix: the window never reaches FlashInfer (fa3 on sm90: plain causal); a 4352-token
    # prompt's query at position p sees p - 4095 keys too many (closed form, from the lengths alone)
    ks = r["keys"]["eager"]
    assert (ks["queries_with_extra"], ks["max_extra_per_query"], ks["extra_keys"]) == (256, 256, 256 * 257 // 2)
    assert r["wrappers"] == {"RaggedKVCacheWrapper": ["auto -> fa3"]} and r["cap"].startswith("dropped")
    assert _run(doc_0_5_23, "gemma2", "extend_paged", "sliding")[1]["verdict"] == "exact"  # #31501 is in 0.5.23


@pytest.mark.slow
def test_0_5_23_cohere2_runner_has_no_window_so_decode_sees_everything(doc_0_5_23):
    f, r = _run(doc_0_5_23, "cohere2", "decode", "sliding")
    assert f["build"]["runner_window"] is None  # CohereForCausalLM has no get_attention_sliding_window_size
    assert f["kinds"]["sliding"]["layer_window"] == 4096  # commandr.py passes config.sliding_window unchanged
    ks = r["keys"]["eager"]
    assert ks["max_extra_per_query"] == (4352 + 1) - 4096  # decode at position 4352: every key, 4096 intended
    assert f["answer"]["state"] == "affected on the default path"


@pytest.mark.slow
def test_0_5_23_mistral_is_served_without_a_window(doc_0_5_23):
    f, r = _run(doc_0_5_23, "mistral", "extend_paged", "sliding")
    assert f["kinds"]["sliding"]["layer_window"] == -1 and "full" not in f["kinds"]
    assert r["verdict"] == "extra" and r["verdict_vs_layer"] == "exact"  # the model file, not the backend


# ----------------------------------------------------------------------------- the closed forms the speed-ups use
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [-1, 0, 3, 40])
def test_pairs_outside_window_closed_form_counts_what_a_loop_counts(causal, window):
    """Without a custom mask the count is a closed form per row; a Python loop over every (row, key)
    with FlashInfer's row placement is the oracle (ragged plan: qo / kv lengths from the indptrs)."""
    import torch

    from swa_repro.sglang.audit.core import pairs_outside_window
    from swa_repro.sglang.audit.env import RAGGED

    qo, kv = [5, 0, 33, 7], [5, 4, 90, 7]
    plan = {"qo_indptr": torch.tensor([0, *torch.tensor(qo).cumsum(0).tolist()]),
            "kv_indptr": torch.tensor([0, *torch.tensor(kv).cumsum(0).tolist()])}
    want = 0
    for q, k in zip(qo, kv):
        for i in range(q):
            pos = k - q + i if causal else k + i
            want += sum(1 for j in range(k) if (j <= pos or not causal) and j < pos - window)
    assert pairs_outside_window(RAGGED, plan, causal, window) == want


def test_kv_pools_are_lazy_only_for_floating_point_zeros():
    import torch

    from swa_repro.sglang.audit.family import _LazyPoolTorch

    t = _LazyPoolTorch()
    assert t.zeros(3, dtype=torch.int32).eq(0).all() and t.zeros(2, 2, dtype=torch.int64).sum() == 0
    assert t.zeros(4, dtype=torch.bfloat16).shape == (4,) and t.arange is torch.arange


# ----------------------------------------------------------------------------- live (issue #25's GPU step)
def test_live_cuda_without_a_gpu_is_one_line(monkeypatch):
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang.audit import family_run

    monkeypatch.setattr(family_run, "torch_cuda", lambda: False)
    with pytest.raises(UsageError, match="--live cuda needs a CUDA device"):
        family_run.executor_of("cuda")
    assert family_run.executor_of(None) is None


@pytest.mark.matrix
@pytest.mark.slow
def test_live_replay_of_a_family_agrees_with_its_key_verdict():
    """The family child's ``--live model``: Gemma-3's own layers on 0.5.23 at its real window (4096),
    each driven call run on the kernel model (what ``--live cuda`` runs on FlashInfer) and judged
    against the float64 reference at the window its config intends. The ragged no-prefix extend
    (0.5.23 plans it without the window: its sliding layer's key verdict is extra) has rows off the
    reference; decode (planned with the window) has none; the model's own keys explain every output."""
    pytest.importorskip("sglang")
    from swa_repro.sglang.audit.family_run import MODULE
    from swa_repro.sglang.overlay_run import run_child

    doc, _, _ = run_child(MODULE, _overlay_0_5_23(), ["--families", "gemma3", "--gpus", "sm90", "--paths",
                                                      "decode,extend_ragged_no_prefix", "--live", "model"],
                          "live family audit", cache=False)
    assert doc["live"]["executor"] == "model"
    (f,) = doc["by_gpu"]["sm90"]
    recs = {(r["path"], r["kind"]): r for r in f["paths"]}
    assert len(recs) == 4 and {r["status"] for r in recs.values()} == {"driven"}
    for key, r in recs.items():
        lv = r["live"]
        assert lv["executed"] == lv["calls"] > 0 and not lv["errors"] and lv["model_agrees"] is True, key
        assert lv["nan_rows"] == 0, key
        if r["verdict"] == "exact":
            assert lv["wrong_rows"] == lv["predicted_wrong_rows"] == 0, key
    bad = recs["extend_ragged_no_prefix", "sliding"]
    assert bad["verdict"] == "extra" and bad["live"]["predicted_wrong_rows"] > 0 and bad["live"]["wrong_rows"] > 0


# ----------------------------------------------------------------------------- the hybrid SWA pool
@pytest.mark.parametrize("hybrid", [False, True])
def test_a_model_on_the_hybrid_swa_pool_is_not_given_the_ordinary_pools_verdict(hybrid):
    """A release that serves a model on its hybrid SWA KV pool (ModelConfig.is_hybrid_swa: Gemma-4 from
    0.5.11) runs another path than the audit drives (the ordinary pool): the answer says so, keeps the
    ordinary pool's verdict beside it, and names the flag that takes that pool; the table cell too."""
    from swa_repro.sglang.audit import family_verdict as fr
    from swa_repro.sglang.audit.family_fix import remedy
    from swa_repro.sglang.audit.family_table import main_cell_text

    path = {"kind": "sliding", "path": "extend_paged", "status": "driven", "verdict": "extra", "cap": "none"}
    f = {"family": "gemma4", "paths": [path], "serving": {"default_prefill": "paged", "flashinfer_kept": True},
         "build": {"model_class": "Gemma4ForCausalLM", "model_config": {"is_hybrid_swa": hybrid}}}
    a = fr.answer(f, "sm80")
    plain = fr._answer(f, "sm80")
    assert plain["state"] in ("affected on the default path", "only with flags")
    if not hybrid:
        assert a == plain
        return
    assert a["state"] == fr.HYBRID and a["ordinary_pool"] == plain["state"] and a["why"] == plain["why"]
    assert a["flags"] == "--disable-hybrid-swa-memory" and "hybrid SWA KV pool" in a["note"]
    cell = {"state": a["state"], "why": a["why"], "ordinary_pool": a["ordinary_pool"]}
    r = remedy("gemma4", cell, "sm80")
    assert r["fix"] is None and "--disable-hybrid-swa-memory" in r["instead"] and "patch --fix all" in r["instead"]
    assert main_cell_text(cell).startswith("SWA pool: not driven (ordinary pool: ")
    refused = {**f, "serving": {"flashinfer_kept": False, "refusal": ["sinks"]}}
    assert fr.answer(refused, "sm80")["state"] == "flashinfer refused"  # a refusal stays a refusal
