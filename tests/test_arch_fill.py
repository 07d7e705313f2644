"""The remaining ``not built`` architecture columns (#41 hC), each rule held to a second route over the
release's own files (regular expressions over the text, transformers' classes imported by name), not
the ``ast`` walk the code under test uses.

* an architecture no ``model_type`` names gets the config class the release's own code gives it: its
  ``__init__``'s ``config`` annotation (0.5.23 gemma3_causal.py ``EmbeddingGemmaModel``: ``Gemma3TextConfig``),
  a sibling of its file's ``EntryClass`` (exaone_moe.py), or its base class's (exaone_moe_mtp.py);
* a key the model file reads at build that the defaults lack is set to the smallest value the file
  accepts: a flag the release's own layer defaults to False (step3p5.py ``use_head_wise_attn_gate: bool =
  False``), a per-layer list where the file indexes it per layer (exaone_moe.py ``is_moe_layer[layer_id]``);
* a sub-config transformers' class leaves None that the release's model file builds unconditionally
  (0.5.23 gemma4_mm.py ``Gemma4VisionEncoder(config=config.vision_config``) gets its class's defaults;
* a window key has no smallest value: not set (a checkpoint's).
"""

from __future__ import annotations

import re

import pytest
from conftest import release_srt, skip_module_unless

skip_module_unless("transformers")


def _models(version: str = "0.5.23"):
    return release_srt(version) / "models"


def _model_type_of_class(name: str) -> str:
    """transformers' class imported by name: its own ``model_type`` (the oracle's route)."""
    import transformers

    return getattr(transformers, name).model_type


def _annotated_config(text: str, cls: str) -> str:
    """The ``config: X`` the class's text names first after ``class cls(``."""
    body = text[text.index(f"class {cls}("):]
    return re.search(r"\bconfig:\s*(\w+)", body).group(1)


def _model_type_of(arch):
    from swa_repro.sglang.audit.arch_cells import model_type_of

    return model_type_of(arch)


def test_an_architecture_with_no_model_type_gets_the_config_class_its_init_names():
    from swa_repro.sglang import config_routes

    models = _models()
    for arch, file in (("EmbeddingGemmaModel", "gemma3_causal.py"), ("LlamaForCausalLMEagle3", "llama_eagle3.py")):
        assert _model_type_of(arch) is None  # the rule's premise: transformers maps no model_type to it
        want = _model_type_of_class(_annotated_config((models / file).read_text(), arch))
        r = config_routes.route(arch, models / file, {}, _model_type_of)
        assert r is not None and (r.source, r.model_type) == ("transformers", want), r
        assert f"models/{file}:" in r.how


def test_a_sibling_or_base_entry_class_gives_its_model_type():
    from swa_repro.sglang import config_routes

    models = _models()
    text = (models / "exaone_moe.py").read_text()
    entry = re.search(r"^EntryClass = \[(.*)\]", text, re.MULTILINE).group(1).replace(" ", "").split(",")
    sibling = next(e for e in entry if _model_type_of(e))
    want = _model_type_of(sibling)
    for arch, file in (("ExaoneMoEForCausalLM", "exaone_moe.py"), ("ExaoneMoEForCausalLMMTP", "exaone_moe_mtp.py")):
        assert _model_type_of(arch) is None
        r = config_routes.route(arch, models / file, {}, _model_type_of)
        assert r is not None and r.model_type == want and sibling in r.how, r
    base = re.search(r"class DeepseekV4ForCausalLMNextN\((\w+)\)", (models / "deepseek_v4_nextn.py").read_text()).group(1)
    r = config_routes.route("DeepseekV4ForCausalLMNextN", models / "deepseek_v4_nextn.py", {}, _model_type_of)
    assert r is not None and r.model_type == _model_type_of(base) and base in r.how


def test_a_flag_is_set_to_the_value_the_releases_own_layer_defaults_it_to():
    from swa_repro.engine.config_reads import config_reads
    from swa_repro.sglang.audit import arch_fill

    models = _models()
    where = config_reads(models / "step3p5.py", "Step3p5ForCausalLM", branches=False,
                         build_only=True)["use_head_wise_attn_gate"]
    default = re.search(r"use_head_wise_attn_gate:\s*bool\s*=\s*(\w+)", (models / "step3p5.py").read_text()).group(1)
    value, why = arch_fill.fill("use_head_wise_attn_gate", where, models, 4, {})
    assert value is {"True": True, "False": False}[default] and where in why


def test_a_per_layer_key_is_a_list_of_the_layer_count():
    from swa_repro.engine.config_reads import config_reads
    from swa_repro.sglang.audit import arch_fill

    models = _models()
    text = (models / "exaone_moe.py").read_text()
    local = re.search(r"(\w+) = config\.is_moe_layer", text).group(1)
    assert re.search(rf"\b{local}\[layer_id\]", text)  # the oracle: the file indexes it per layer
    where = config_reads(models / "exaone_moe.py", "ExaoneMoeForCausalLM", branches=False,
                         build_only=True)["is_moe_layer"]
    value, _ = arch_fill.fill("is_moe_layer", where, models, 7, {})
    assert value == [False] * 7


def test_a_window_key_is_never_invented():
    from swa_repro.sglang.audit import arch_fill

    models = _models()
    assert arch_fill.fill("sliding_window", "gemma4_mtp.py:1", models, 4, {}) is None
    got = arch_fill.fill("sliding_window", "gemma4_mtp.py:1", models, 4, {"text_config": {"sliding_window": 512}})
    assert got[0] == 512


def test_a_none_sub_config_the_model_builds_gets_its_class_defaults():
    import transformers

    from swa_repro.sglang.audit import arch_fill

    models = _models()
    assert re.search(r"Gemma4VisionEncoder\(\s*config=config\.vision_config", (models / "gemma4_mm.py").read_text())
    assert transformers.Gemma4Config().vision_config is None
    subs = arch_fill.sub_config_defaults("gemma4")
    assert subs["vision_config"]["model_type"] == transformers.Gemma4VisionConfig.model_type
    assert subs["vision_config"]["pooling_kernel_size"] == transformers.Gemma4VisionConfig().pooling_kernel_size


def _release_class(version: str, file: str, name: str):
    """A release config class loaded from its file alone (it imports only transformers)."""
    import importlib.util

    path = _models(version).parent / "configs" / file
    spec = importlib.util.spec_from_file_location(f"_hc_{file[:-3]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)


def test_a_pattern_the_class_composes_is_cut_with_the_layers():
    """0.5.23 configs/iquest_q1.py composes layer_types from its parts and refused the 3-layer cut."""
    from swa_repro.sglang import checkpoint as ckpt

    cls = _release_class("0.5.23", "iquest_q1.py", "IQuestQ1Config")
    values = {k: v for k, v in cls().to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    cut = values["layer_types"][:3]
    with pytest.raises(ValueError, match="pattern has length"):
        cls(**{**values, "num_hidden_layers": 3, "layer_types": cut})
    built = cls(**{**values, "num_hidden_layers": 3, "layer_types": cut, **ckpt.pattern_cut(values, cut)})
    assert built.layer_types == cut


def test_a_legacy_per_layer_key_round_trips_through_transformers_own_class():
    """transformers folds DeepSeek-V4's compress_ratios into layer_types; the one written back gives
    the class's layer_types again when the class reads it (its own conversion, not ours)."""
    from transformers import DeepseekV4Config

    from swa_repro.sglang.audit import arch_fill

    lt = DeepseekV4Config().layer_types
    got = arch_fill.legacy_keys("deepseek_v4", {"layer_types": lt})
    ratios = got["compress_ratios"][0]
    assert DeepseekV4Config(compress_ratios=ratios, layer_types=None).layer_types == lt


def test_a_layer_count_left_unset_is_the_length_of_the_pattern_the_class_counts():
    """0.5.23 NemotronHConfig: num_hidden_layers deprecated, counted from layers_block_type, whose
    default is its hybrid_override_pattern (one character a layer, the signature's default string)."""
    from swa_repro.sglang.audit import arch_fill

    text = (_models().parent / "configs" / "nemotron_h.py").read_text()
    pattern = re.search(r'hybrid_override_pattern="([^"]+)"', text).group(1)
    blocks = [{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}[c] for c in pattern]
    got = arch_fill.layer_count({"layers_block_type": blocks, "num_hidden_layers": None})
    assert got["num_hidden_layers"][0] == len(pattern)
    nested = arch_fill.layer_count({"llm_config": {"layers_block_type": blocks}})
    assert nested["llm_config"][0]["num_hidden_layers"] == len(pattern)


def test_a_column_with_no_route_says_what_its_class_takes():
    """UnlimitedOCRForCausalLM takes a config class of the release's configs/ that no registry lists: the
    line names it and its model_type (read here with a regex from the class's own file)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from swa_repro.sglang import config_routes

    models = _models()
    ann = _annotated_config((models / "unlimited_ocr.py").read_text(), "UnlimitedOCRForCausalLM")
    cfg = (models.parent / "configs" / "unlimited_ocr.py").read_text()
    mt = re.search(r'model_type = "([^"]+)"', cfg[cfg.index(f"class {ann}("):]).group(1)
    assert mt not in CONFIG_MAPPING_NAMES
    line = config_routes.unnamed("UnlimitedOCRForCausalLM", models / "unlimited_ocr.py")
    assert f"config: {ann}" in line and repr(mt) in line
    generic = config_routes.unnamed("IQuestLoopCoderForCausalLM", models / "iquest_loopcoder.py")
    assert "no class of its own" in generic
