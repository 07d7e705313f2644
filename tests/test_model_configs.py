"""model_configs: values read from transformers' config classes and sglang's model files."""

from __future__ import annotations

import ast

import pytest

from conftest import skip_module_unless

skip_module_unless("transformers")
skip_module_unless("sglang")

from swa_repro.engine.families import MODELS  # noqa: E402
from swa_repro.sglang import model_configs as mc  # noqa: E402


def _line(rule: str) -> tuple[str, int]:
    """'expr (sglang/srt/models/x.py:53)' -> (path, 53)."""
    loc = rule.rsplit("(", 1)[1].rstrip(")")
    f, n = loc.rsplit(":", 1)
    return f.split("sglang/srt/models/")[1], int(n)


def test_gemma2_values_come_from_its_config_class_and_sglang_source():
    import transformers

    s = mc.model_spec("gemma2")
    cfg = transformers.Gemma2Config()
    assert (s.sliding_window, s.head_dim, s.logit_cap) == (cfg.sliding_window, cfg.head_dim, cfg.attn_logit_softcapping)
    assert (s.num_qo_heads, s.num_kv_heads) == (cfg.num_attention_heads, cfg.num_key_value_heads)
    assert s.window_left == cfg.sliding_window - 1  # HF inclusive count -> FlashInfer's keys-to-the-left
    fname, line = _line(s.window_rule)
    src = (mc.sglang_models_dir() / fname).read_text().splitlines()[line - 1]
    assert "sliding_window - 1" in src and fname == "gemma2.py"
    fname, line = _line(s.cap_rule)
    assert "attn_logit_softcapping" in (mc.sglang_models_dir() / fname).read_text().splitlines()[line - 1]
    assert s.sources["sliding_window"] == "transformers.Gemma2Config().sliding_window"


def test_gpt_oss_and_gemma3_read_by_introspection():
    import transformers

    g = mc.model_spec("gpt-oss")
    cfg = transformers.GptOssConfig()
    assert (g.sliding_window, g.head_dim, g.window_left) == (cfg.sliding_window, cfg.head_dim, cfg.sliding_window - 1)
    assert g.num_sliding_layers == list(cfg.layer_types).count("sliding_attention")
    g3 = mc.model_spec("gemma3")
    assert g3.logit_cap == 0.0 and "logit_cap=0.0" in g3.cap_rule  # sglang passes 0.0 for gemma3


def test_models_sglang_serves_without_a_window_and_the_cohere2_convention():
    import transformers

    for name in ("mistral", "qwen2-swa"):
        s = mc.model_spec(name)
        assert s.sliding_window is not None and s.window_left == -1 and not s.has_window
        assert "never reads sliding_window" in s.window_rule
    c = mc.model_spec("cohere2")
    assert c.window_left == transformers.Cohere2Config().sliding_window  # passed unchanged (commandr.py)
    assert _line(c.window_rule)[0] == "commandr.py"


def test_every_listed_model_is_read_and_absent_ones_are_said():
    specs = mc.model_specs()
    assert {s.name for s in specs} == set(MODELS)
    assert all(s.num_qo_heads % s.num_kv_heads == 0 and s.head_dim > 0 for s in specs)
    absent = mc.absent_models()
    assert all("remote code" in why for why in absent.values())
    rows = mc.table(specs)
    assert len(rows) == len(specs) and {"model", "window_left", "sglang window rule"} <= set(rows[0])


def test_config_expressions_are_evaluated_narrowly():
    import transformers

    cfg = transformers.Gemma2Config()
    e = ast.parse("getattr(config, 'sliding_window', 0) - 1", mode="eval").body
    assert mc.eval_on_config(e, cfg) == cfg.sliding_window - 1
    with pytest.raises(ValueError):
        mc.eval_on_config(ast.parse("__import__('os').getcwd()", mode="eval").body, cfg)
