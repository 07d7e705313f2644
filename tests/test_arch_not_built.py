"""The architecture columns sglang 0.5.23 left ``not built`` (#41 hB), each rule held to a second route over
the release's own files (regular expressions over the text), not the code under test's ``ast`` walk.

* a model that builds fewer attention layers than its config declares (an MTP head) is driven on the
  layers it built, each of the kind the config gives its ``layer_id`` (0.5.23 exaone_moe_mtp.py);
* a release class whose defaults set no window (0.5.23 configs/step3p5.py) is built at a window the audit sets,
  on the window key and the layer-type constant the model file reads, and its verdict says so (``window_from``,
  the table's suffix); a user's checkpoint never gets one;
* a present key in a form the model file cannot take is rewritten as the file reads it (a default tuple it
  splits, a number it indexes per layer, a value an ``assert`` pins), a dict of named values read by name.
"""

from __future__ import annotations

import re
import types

import pytest
from conftest import release_srt, skip_module_unless

skip_module_unless("transformers")


def _models(version: str = "0.5.23"):
    return release_srt(version) / "models"


def _attn(layer_id: int, window: int | None):
    return types.SimpleNamespace(layer_id=layer_id, sliding_window_size=window, logit_cap=0.0, tp_q_head_num=4,
                                 tp_k_head_num=2, head_dim=64)


def test_an_mtp_head_that_builds_one_layer_is_driven_on_that_layer_and_its_kind():
    """0.5.23 ExaoneMoEForCausalLMMTP sets num_hidden_layers to a count below the config's before it builds
    its decoder: the harness indexed the built layers by the config's kinds (IndexError, family.py:251)."""
    from swa_repro.sglang.audit import family

    text = (_models() / "exaone_moe_mtp.py").read_text()
    n = int(re.search(r"config\.num_hidden_layers = (\d+)", text).group(1))  # what the head builds
    kinds = ("sliding", "sliding", "sliding", "full")
    assert n < len(kinds)
    small = types.SimpleNamespace(kinds=kinds, sliding_window=128)
    built = types.SimpleNamespace(small=small, layers=tuple(_attn(i, 127 if kinds[i] == "sliding" else None)
                                                           for i in range(n)))
    got = family.layers_of(built)
    assert [(x.kind, x.attn.layer_id) for x in got] == [(kinds[i], i) for i in range(n)][:1]
    assert got[0].window_left == 127
    # a model that builds every declared layer: each kind's first index, as before
    whole = types.SimpleNamespace(small=small, layers=tuple(_attn(i, 127 if k == "sliding" else None)
                                                           for i, k in enumerate(kinds)))
    assert [(x.kind, x.attn.layer_id, x.window_left) for x in family.layers_of(whole)] == \
        [("sliding", 0, 127), ("full", 3, -1)]


def _release_class(file: str, name: str):
    """A release config class loaded from its file alone (it imports only transformers)."""
    import importlib.util

    path = _models().parent / "configs" / file
    spec = importlib.util.spec_from_file_location(f"_hb_{file[:-3]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def _defaults(cls) -> dict:
    return {k: v for k, v in cls().to_dict().items() if not k.startswith("_") and k != "transformers_version"}


def test_a_class_without_a_window_is_built_at_one_the_audit_sets_on_the_keys_its_model_reads():
    from swa_repro.sglang.audit import arch_fill, family

    models = _models()
    text = (models / "step3p5.py").read_text()
    key = re.search(r"self\.sliding_window = config\.(\w+)", text).group(1)
    slide = re.search(r'layer_types\[layer_id\] == "(\w+)"', text).group(1)
    values = _defaults(_release_class("step3p5.py", "Step3p5Config"))
    assert values.get(key) is None and not values.get("layer_types")  # the premise: the defaults give no window
    new, why = arch_fill.audit_window(values, models / "step3p5.py", "Step3p5ForCausalLM")
    assert new[key] == arch_fill.AUDIT_WINDOW and why[key].startswith(arch_fill.SET_WINDOW)
    assert len(new["layer_types"]) == values["num_hidden_layers"] and slide in new["layer_types"]
    assert any(t != slide for t in new["layer_types"]) and why["layer_types"].startswith(arch_fill.SET_WINDOW)
    # the driven prompts pass it: extends and committed lengths past the window, within the context built
    shape = family.family_shape(_attn(0, arch_fill.AUDIT_WINDOW), arch_fill.AUDIT_WINDOW)
    assert min(shape.extend[0], shape.committed[0]) > arch_fill.AUDIT_WINDOW
    assert family.context_length(arch_fill.AUDIT_WINDOW) > shape.extend[0] + shape.prefix[0]


def test_the_window_key_of_a_text_model_built_from_a_nested_config_is_read_at_the_window_site():
    """0.5.23 NemotronH_Nano_VL_V2 builds its text model from ``config.llm_config``: the outer class's reads do
    not reach nemotron_h.py's ``sliding_window_size=config.sliding_window``; the window site does."""
    from swa_repro.sglang.audit import arch_fill

    models = _models()
    lines = (models / "nemotron_h.py").read_text().splitlines()
    i = next(i for i, x in enumerate(lines, 1) if re.search(r"sliding_window_size=config\.\w+", x))
    key = re.search(r"sliding_window_size=config\.(\w+)", lines[i - 1]).group(1)
    assert arch_fill.site_keys(models, [f"nemotron_h.py:{i}"]) == {key: f"nemotron_h.py:{i}"}
    values = {"llm_config": {"num_hidden_layers": 4, key: None}, "vision_config": {}}
    new, why = arch_fill.audit_window(values, models / "nano_nemotron_vl.py", "NemotronH_Nano_VL_V2",
                                      [f"nemotron_h.py:{i}"])
    assert new["llm_config"][key] == arch_fill.AUDIT_WINDOW and f"llm_config.{key}" in why


def test_a_key_in_a_form_the_model_cannot_take_is_rewritten_as_the_file_reads_it():
    from swa_repro.sglang.audit import arch_fill

    models = _models()
    text = (models / "step3p5.py").read_text()
    split_key, sep = re.search(r'config\.(\w+)\.split\("(.)"\)', text).groups()
    assert re.search(r"\brope_theta = config\.rope_theta", text) and "rope_theta[layer_id]" in text
    values = _defaults(_release_class("step3p5.py", "Step3p5Config"))
    assert isinstance(values[split_key], (list, tuple)) and isinstance(values["rope_theta"], (int, float))
    got = arch_fill.read_forms(values, [models / "step3p5.py"])
    assert got[split_key][0] == sep.join(map(str, values[split_key]))
    assert got["rope_theta"][0] == [values["rope_theta"]] * values["num_hidden_layers"]
    # an assert pins the one value: nemotron_h_mtp.py's num_mtp_layers
    mtp = (models / "nemotron_h_mtp.py").read_text()
    attr, want = re.search(r"assert self\.(\w+) == (\d+)", mtp).groups()
    key = re.search(rf'self\.{attr} = getattr\(config, "(\w+)"', mtp).group(1)
    assert arch_fill.read_forms({key: int(want) + 1}, [models / "nemotron_h_mtp.py"])[key][0] == int(want)
    assert arch_fill.read_forms({key: int(want)}, [models / "nemotron_h_mtp.py"]) == {}
    # a number the file takes either way (isinstance(config.K, list)) is left as it is: nemotron_h.py
    nem = (models / "nemotron_h.py").read_text()
    assert re.search(r"isinstance\(config\.intermediate_size, list\)", nem)
    assert "intermediate_size" not in arch_fill.read_forms({"intermediate_size": 8, "num_hidden_layers": 4},
                                                            [models / "nemotron_h.py"])


def test_a_dict_read_by_name_gets_the_configs_own_values_and_a_tested_key_indexed_later_is_per_layer():
    from swa_repro.engine.config_reads import config_reads
    from swa_repro.sglang.audit import arch_fill

    models = _models()
    text = (models / "step3p5.py").read_text()
    names = list(dict.fromkeys(re.findall(r'config\.attention_other_setting\[\s*"(\w+)"', text)))
    assert re.search(r"config\.swiglu_limits_shared\[layer_id\]", text)
    reads = config_reads(models / "step3p5.py", "Step3p5ForCausalLM", build_only=True)
    values = {"num_attention_heads": 64, "num_attention_groups": 8, "num_hidden_layers": 4}
    got, _ = arch_fill.fill("attention_other_setting", reads["attention_other_setting"], models, 4, values)
    assert got == {n: values.get(n, 1) for n in names} and set(names) <= set(values)
    got, _ = arch_fill.fill("swiglu_limits_shared", reads["swiglu_limits_shared"], models, 4, values)
    assert got == [1] * 4


def test_the_answer_and_the_table_say_a_window_the_audit_set_and_a_checkpoint_never_gets_one(monkeypatch, tmp_path):
    import json

    from swa_repro.sglang import checkpoint as ckpt
    from swa_repro.sglang.audit import family_table, family_verdict

    plain = {"state": "affected on the default path", "why": ["sliding decode: extra"], "note": None}
    monkeypatch.setattr(family_verdict, "pooled_answer", lambda f, g: dict(plain))
    col = {"family": "Step3p5ForCausalLM", "config": {"sliding_window": 128},
           "discovered": {"window_from": "audit", "set_by_audit": {}}}
    a = family_verdict.answer(col, "sm90")
    assert a["state"] == plain["state"] and a["window_from"] == "audit" and "--model PATH" in a["note"]
    assert family_table.main_cell_text({**plain, "window_from": "audit"}).endswith(family_table.AUDIT_WINDOW)
    assert not family_table.main_cell_text(plain).endswith(family_table.AUDIT_WINDOW)
    user = {"family": "Step3p5ForCausalLM", "config": {"sliding_window": None}, "checkpoint": {"path": "x"}}
    assert "window_from" not in family_verdict.answer(user, "sm90")
    # the user's file decides: a Step3p5 config.json with no window is cut with none
    values = {**_defaults(_release_class("step3p5.py", "Step3p5Config")), "architectures": ["Step3p5ForCausalLM"],
              "model_type": "step3p5"}
    (tmp_path / "config.json").write_text(json.dumps(values))
    small = ckpt.small_config(ckpt.read(str(tmp_path)))
    assert small.sliding_window is None and "sliding" not in small.kinds


def test_a_config_property_the_releases_pinned_transformers_defines_is_given_as_it_defines_it():
    """0.5.23 reads ``text_config.is_heterogeneous`` for each Gemma 4 config; its pin (METADATA) defines it on
    every config, the venv's transformers does not: the child gives it as the pin does (``hasattr(self,
    '_heterogeneity_spec')``), False for a config read without a per-layer spec."""
    import transformers
    from transformers import PretrainedConfig

    from swa_repro.sglang.audit import family_build

    srt = _models().parent
    assert re.search(r"text_config\.is_heterogeneous", (srt / "utils" / "hf_transformers" / "config.py").read_text())
    meta = next(srt.parents[1].glob("sglang-*.dist-info")) / "METADATA"
    pin = re.search(r"^Requires-Dist: transformers==([\d.]+)", meta.read_text(), re.MULTILINE).group(1)
    if hasattr(PretrainedConfig, "is_heterogeneous"):
        pytest.skip(f"transformers {transformers.__version__} defines is_heterogeneous itself")
    assert pin != transformers.__version__
    try:
        said = family_build.pinned_config_api()
        assert said and pin in said and family_build.pinned_config_api() is None  # once
        assert transformers.Gemma4TextConfig().is_heterogeneous is False
        spec = transformers.Gemma4TextConfig()
        spec._heterogeneity_spec = object()
        assert spec.is_heterogeneous is True
    finally:
        if "is_heterogeneous" in vars(PretrainedConfig):
            del PretrainedConfig.is_heterogeneous


def test_a_class_with_no_sizes_names_every_key_a_checkpoint_must_supply():
    """0.5.23 JetNemotronConfig declares its sizes None (class annotations ``= None``); the line names each one
    the model file reads (read here with regular expressions over both files), the window's dict among them."""
    from swa_repro.sglang.audit import arch_fill

    models = _models()
    cfg = (models.parent / "configs" / "jet_nemotron.py").read_text()
    body = cfg[cfg.index("class JetNemotronConfig("):]
    nones = dict.fromkeys(re.findall(r"^    (\w+): [^=\n]+ = None$", body, re.MULTILINE))
    model = (models / "jet_nemotron.py").read_text()
    read = set(re.findall(r"config\.(\w+)", model))
    got = [x.split(" ")[0] for x in arch_fill.none_reads(dict.fromkeys(nones), models / "jet_nemotron.py",
                                                          "JetNemotronForCausalLM")]
    assert got and set(got) <= set(nones) & read
    assert {"layer_types", "efficient_attention_config"} <= set(got)  # the window: efficient_attention_config["swa"]
    assert re.search(r'efficient_attention_config\["swa"\]\[\s*"window_size"', model)


def test_a_key_tested_for_membership_is_an_empty_list():
    """0.5.10 step3p5.py reads ``yarn_only_types`` and tests ``layer_types[i] not in`` it; its Step3p5Config
    defines no such key (the count rule's 1 raised "argument of type 'int' is not iterable")."""
    from swa_repro.engine.config_reads import config_reads
    from swa_repro.sglang.audit import arch_fill

    models = _models("0.5.10")
    text = (models / "step3p5.py").read_text()
    local = re.search(r"(\w+) = config\.yarn_only_types", text).group(1)
    assert re.search(rf"not in {local}\b", text)
    assert "yarn_only_types" not in (models.parent / "configs" / "step3p5.py").read_text()
    where = config_reads(models / "step3p5.py", "Step3p5ForCausalLM", build_only=True)["yarn_only_types"]
    value, why = arch_fill.fill("yarn_only_types", where, models, 4, {})
    assert value == [] and where in why


def test_a_config_that_raises_a_runtime_error_is_its_columns_reason_not_the_plans_end(monkeypatch, tmp_path):
    """transformers 5.19.0 (``--transformers release``) raises ``AmbiguousGlobalPerLayerAttributeError``, a
    ``RuntimeError``, where a model reads a per-layer ``head_dim`` off a heterogeneous config globally: it
    stopped 0.5.23's whole column plan. That column is not built, with the error; the next one still is."""
    from swa_repro.sglang import checkpoint as ckpt
    from swa_repro.sglang import swa_archs
    from swa_repro.sglang.audit import arch_cells, fallback_cells

    def arch(name):
        return types.SimpleNamespace(architecture=name, model_file=f"{name.lower()}.py", windows={"w": 1},
                                     hybrid=False, sinks=(), fallback=False)

    class AmbiguousGlobalPerLayerAttributeError(RuntimeError):  # transformers 5.19.0's, by its base class
        pass

    def filled(a, version, overlay):
        if a.architecture == "Heterogeneous":
            raise AmbiguousGlobalPerLayerAttributeError("head_dim is per layer")
        return types.SimpleNamespace(path="c.json"), {}

    monkeypatch.setattr(swa_archs, "discover", lambda srt: [arch("Heterogeneous"), arch("Plain")])
    monkeypatch.setattr(swa_archs, "crash_on_flashinfer", lambda srt, a: None)
    monkeypatch.setattr(arch_cells, "filled_config", filled)
    monkeypatch.setattr(ckpt, "check_release", lambda ck, version, overlay: None)
    monkeypatch.setattr(ckpt, "small_config", lambda ck: types.SimpleNamespace())
    monkeypatch.setattr(arch_cells, "asdict", lambda small: {"small": True})
    monkeypatch.setattr(fallback_cells, "plan", lambda version, overlay, column_config, no_config: ({}, {}))
    smalls, static = arch_cells.plan("0.5.23", tmp_path)
    assert list(smalls) == ["Plain"]
    assert "head_dim is per layer" in static["Heterogeneous"]["error"] and \
        static["Heterogeneous"]["error"].startswith("not buildable from")
