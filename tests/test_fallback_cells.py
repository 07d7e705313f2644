"""The architectures a release serves only through its Transformers fallback, audited THROUGH the
fallback (#41 item 2; ``sglang.audit.fallback_cells``).

Oracle (a second route, not the code under test): the release's ``models/transformers.py`` read as
text (regular expressions over its ``_create_attention_instances``: the window goes, unchanged, only to
the layers ``layer_types`` calls sliding; no ``logit_cap``; no ``get_attention_sliding_window_size``, so
the runner's window is None) applied to transformers' config defaults of the architecture. The audit's
child builds the release's own fallback class (its loader picks it) on the meta device; the window each
layer got is held to the oracle's. Before #41 item 2 the table had one ``fallback: not audited`` cell.
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest
from conftest import skip_module_unless

skip_module_unless("transformers")

from conftest import release_srt as _srt

RELEASES = ("0.5.10", "0.5.15.post1", "0.5.23")


def _fallback_rule(srt) -> dict:
    """The fallback's window rule read as text: the ``RadixAttention(`` call of
    ``_create_attention_instances`` and what decides ``per_layer_sliding_window``."""
    text = (srt / "models" / "transformers.py").read_text()
    body = text[text.index("def _create_attention_instances"):]
    body = body[:body.index("\n    def ", 10)]
    call = body[body.index("RadixAttention("):]
    call = call[:call.index("\n            )")]
    return {"window_kw": re.search(r"sliding_window_size=(\w+)", call).group(1),
            "pattern": 'layer_types[idx] == "sliding_attention"' in body,
            "unchanged": re.search(r"per_layer_sliding_window = global_sliding_window\b", body) is not None,
            "cap": "logit_cap" in call, "hook": "def get_attention_sliding_window_size" in text,
            "window_line": text[:text.index("sliding_window_size=per_layer_sliding_window")].count("\n") + 1}


def _oracle_windows(values: dict, rule: dict) -> list[int]:
    """Per layer, what the fallback hands ``RadixAttention`` for ``values`` (a config.json)."""
    lt, w = values.get("layer_types"), values.get("sliding_window")
    assert rule["pattern"] and rule["unchanged"] and rule["window_kw"] == "per_layer_sliding_window"
    return [w if lt and i < len(lt) and lt[i] == "sliding_attention" and w is not None else -1
            for i in range(values["num_hidden_layers"])]


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_fallback_hands_the_window_unchanged_by_layer_types_and_no_runner_hook(version):
    """Item 3: 0.5.10, 0.5.15.post1 and 0.5.23 have the same window code in the fallback; the ast route
    (``fallback_cells.route``) cites the lines the text route finds."""
    from swa_repro.sglang.audit.fallback_cells import route

    srt = _srt(version)
    rule, r = _fallback_rule(srt), route(srt)
    assert rule["pattern"] and rule["unchanged"] and not rule["cap"] and not rule["hook"]
    assert r["window"] == f"models/transformers.py:{rule['window_line']}"
    assert r["cap"] is None and r["hook"] is None and r["pattern"] and r["gate"]
    at = int(r["pattern"].split(":")[1])
    assert "sliding_attention" in "".join((srt / "models" / "transformers.py").read_text().splitlines()[at - 1:at + 6])


def test_a_release_whose_fallback_hands_no_window_says_it_never_reaches_flashinfer(tmp_path):
    from swa_repro.sglang.audit.fallback_cells import note, route

    models = tmp_path / "srt" / "models"
    models.mkdir(parents=True)
    (models / "transformers.py").write_text("def make(i):\n    return RadixAttention(num_heads=8,\n"
                                            "        layer_id=i, sliding_window_size=-1)\n")
    src = route(tmp_path / "srt")
    assert src["window"] is None and src["call"] == "models/transformers.py:2"
    f = {"build": {"model_class": "TransformersForCausalLM", "runner_window": None, "runner_rule": "r",
                   "model_config": {"fallback": src}}, "kinds": {"sliding": {"layer_window": -1,
                                                                              "intended_window": 1023}},
         "config": {"cap": 0.0}}
    text = note(f)
    assert "hands no window to RadixAttention (models/transformers.py:2): the window never reaches FlashInfer" in text


def test_every_fallback_architecture_is_its_own_column_not_one_unaudited_cell():
    """Fails on the old code: one ``Transformers fallback`` cell, ``fallback: not audited``. Now each
    architecture only the fallback serves is planned: driven (transformers' defaults, the window of its
    class) or ``not built`` saying why; no cell is 'fallback: not audited'."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from swa_repro.sglang.audit import arch_cells, fallback_cells

    srt = _srt("0.5.23")
    smalls, static = arch_cells.plan("0.5.23", srt.parent.parent)
    only = fallback_cells.fallback_only(srt)
    assert arch_cells.FALLBACK not in static and not any(d.get("fallback") for d in static.values())
    for arch in only:
        assert (arch in smalls) != (arch in static), arch
        if arch in static:
            assert static[arch]["error"] and static[arch]["discovered"]["fallback"]["window"], arch
            continue
        small = smalls[arch]["small"]
        published = CONFIG_MAPPING[small["config"]["model_type"]]()
        published = published.get_text_config() if hasattr(published, "get_text_config") else published
        if smalls[arch]["discovered"].get("window_from") != "audit":
            assert small["sliding_window"] == published.sliding_window, arch
        assert small["config"]["architectures"] == [arch] and "sliding" in small["kinds"], arch
    assert {"CwmForCausalLM", "MinistralForCausalLM", "VaultGemmaForCausalLM"} <= set(smalls)


# transformers' defaults of these have no layer the fallback would hand a window (0.5.23 sm90's table before)
NO_DEFAULT_WINDOW = ("SmolLM3ForCausalLM", "PhimoeForCausalLM", "Dots1ForCausalLM", "MiniMaxForCausalLM",
                     "DogeForCausalLM", "DeepseekOcr2ForConditionalGeneration", "GotOcr2ForConditionalGeneration",
                     "LightOnOcrForConditionalGeneration", "MoonshineStreamingForConditionalGeneration",
                     "Phi4MultimodalForCausalLM", "Qwen2_5OmniForConditionalGeneration",
                     "Qwen2_5OmniThinkerForConditionalGeneration")


def _published_text(arch: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from swa_repro.core.checkpoint_config import auto_model_types

    published = CONFIG_MAPPING[auto_model_types()[arch]]()
    return published.get_text_config() if hasattr(published, "get_text_config") else published


def test_a_fallback_column_with_no_default_window_is_built_at_the_audit_window_and_a_checkpoint_is_not(tmp_path):
    """Fails on the old code (each was ``not built: no sliding layer at transformers defaults``): a column
    whose defaults give the fallback no sliding layer (the text route's rule on transformers' defaults:
    every layer -1) is built at ``arch_fill.AUDIT_WINDOW`` with a pattern whose cut holds a sliding and a full
    layer (the text route then hands the window to the sliding one only), each set key in ``set_by_audit``,
    ``window_from: audit``. A user's ``config.json`` of the same architecture with ``sliding_window`` null
    is cut with no window and no sliding layer: the user's file decides."""
    from swa_repro.sglang import checkpoint as ckpt
    from swa_repro.sglang.audit import arch_cells, arch_fill

    srt = _srt("0.5.23")
    rule = _fallback_rule(srt)
    smalls, static = arch_cells.plan("0.5.23", srt.parent.parent)
    for arch in NO_DEFAULT_WINDOW:
        text = _published_text(arch)
        values = {"layer_types": getattr(text, "layer_types", None), "sliding_window": text.sliding_window
                  if hasattr(text, "sliding_window") else None, "num_hidden_layers": text.num_hidden_layers}
        assert set(_oracle_windows(values, rule)) == {-1}, arch
        assert arch in smalls and arch not in static, (arch, static.get(arch))
        col = smalls[arch]
        small, found = col["small"], col["discovered"]
        assert found["window_from"] == "audit" and small["sliding_window"] == arch_fill.AUDIT_WINDOW, arch
        assert {"sliding", "full"} <= set(small["kinds"]), (arch, small["kinds"])
        keys = {k.rpartition(".")[2] for k in found["set_by_audit"]}
        assert {"sliding_window", "layer_types"} <= keys, (arch, found["set_by_audit"])
        assert all(w.startswith(arch_fill.SET_WINDOW) for w in found["set_by_audit"].values()), arch
    smol = smalls["SmolLM3ForCausalLM"]["small"]["config"]
    assert _oracle_windows(smol, rule) == [arch_fill.AUDIT_WINDOW, -1]
    assert smalls["MiniMaxForCausalLM"]["small"]["config"]["layer_types"][:3] == [
        "sliding_attention", "linear_attention", "full_attention"]  # its linear layers kept
    # a checkpoint: the same architecture, its file's sliding_window null: no window is set for it
    user = {**arch_cells.transformers_defaults("smollm3"), "architectures": ["SmolLM3ForCausalLM"],
            "sliding_window": None}
    (tmp_path / "config.json").write_text(json.dumps(user))
    cut = ckpt.small_config(ckpt.read(str(tmp_path)))
    assert cut.sliding_window is None and "sliding" not in cut.kinds
    assert set(_oracle_windows({**user, **cut.config}, rule)) == {-1}


CWM = {"architectures": ["CwmForCausalLM"], "model_type": "cwm", "num_hidden_layers": 4, "hidden_size": 1024,
       "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
       "sliding_window": 2048, "vocab_size": 1000,
       "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]}


@pytest.fixture(scope="module")
def cwm(tmp_path_factory):
    """``swa-repro audit --sglang 0.5.23 --model FOLDER --json`` of a Cwm config.json (no EntryClass
    lists CwmForCausalLM in 0.5.23: the fallback serves it)."""
    from conftest import release_overlay

    from swa_repro.cli import main

    release_overlay("0.5.23")
    d = tmp_path_factory.mktemp("ck") / "cwm"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CWM))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["audit", "--sglang", "0.5.23", "--model", str(d), "--gpu", "sm90", "--json"])
    assert out.getvalue(), (rc, err.getvalue()[-400:])  # before #41 item 2: "not in sglang 0.5.23's models/", exit 2
    (f,) = json.loads(out.getvalue())["families"]
    return rc, f


def test_a_checkpoint_only_the_fallback_serves_is_built_by_the_fallback_at_the_oracles_windows(cwm):
    """Item 1/7 through the fallback: no 'not in sglang's models/' refusal; the release's loader builds
    TransformersForCausalLM; each layer's window is what the text route says the fallback hands it, the
    runner's window is None (no hook), and the keys past the window make it affected."""
    rc, f = cwm
    rule = _fallback_rule(_srt("0.5.23"))
    want = _oracle_windows(CWM, rule)[:len(f["build"]["layers"])]
    got = [int(re.search(r"sliding_window_size=(-?\d+)", x).group(1)) for x in f["build"]["layers"]]
    assert f["build"]["model_class"] == "TransformersForCausalLM" and "transformers.py" in f["build"]["model_file"]
    assert got == want and 2048 in got, (got, want)
    assert f["build"]["runner_window"] is None and not rule["hook"]
    assert f["kinds"]["sliding"]["intended_window"] == CWM["sliding_window"] - 1
    assert rc == 1 and f["answer"]["state"] == "affected on the default path", f["answer"]
    assert "Transformers fallback" in f["answer"]["note"] and f"transformers.py:{rule['window_line']}" in f["answer"]["note"]
    assert f["remedy"]["fix"] is None and "--context-length 2048" in f["remedy"]["instead"]


def test_a_config_cap_the_layer_does_not_carry_is_said():
    from swa_repro.sglang.audit.family_verdict import layer_off

    f = {"config": {"cap": 50.0}, "paths": [], "kinds": {"sliding": {"layer_window": 4095, "intended_window": 4095,
                                                                     "cap": 0.0}}}
    assert layer_off(f) == ["sliding layer carries cap 0, the config's attn_logit_softcapping 50"]
    assert layer_off({**f, "kinds": {"sliding": {**f["kinds"]["sliding"], "cap": 50.0}}}) == []


def test_an_architecture_neither_a_model_file_nor_transformers_has_is_one_line(tmp_path):
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang import checkpoint as ckpt

    models = tmp_path / "0.5.23" / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    (models / "transformers.py").write_text("EntryClass = []\n")
    assert ckpt.fallback_serves("CwmForCausalLM", models)
    assert not ckpt.fallback_serves("NoSuchForCausalLM", models)
    ck = ckpt.Checkpoint("x", "x/config.json", {"architectures": ["NoSuchForCausalLM"]}, "NoSuchForCausalLM",
                         "PretrainedConfig", None)
    with pytest.raises(UsageError, match="transformers has no class of that name for its Transformers fallback"):
        ckpt.check_release(ck, "0.5.23", models.parents[2])
