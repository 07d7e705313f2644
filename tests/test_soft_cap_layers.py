"""The soft-cap fixes plan the cap the model's layers use (issue #40, point 3): read once at start-up
from ``model_runner.model``'s attention layers, so a Grok checkpoint whose config has no
``attn_logit_softcapping`` (grok.py:425 falls back to 30) is planned with 30, not refused at its
first forward. Oracles: grok.py's and gemma2.py's own expressions for a layer's ``logit_cap``,
evaluated on configs with and without the key, and the helper executed from the fixed 0.5.23 source."""

from __future__ import annotations

import ast
import types

import pytest
import torch

from swa_repro.sglang import fix
from swa_repro.sglang.fix.anchors import CAP_HELPER

pytestmark = pytest.mark.network


def _release(rel: str) -> str:
    from conftest import release_overlay

    return (release_overlay("0.5.23") / "sglang" / rel).read_text()


def _helper():
    """``_plan_logits_soft_cap`` of the fixed 0.5.23 backend, executed alone."""
    text = fix.apply_fixes(_release(fix.BACKEND), ("soft_cap_prefill",))
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == CAP_HELPER)
    env: dict = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "<fixed>", "exec"), env)  # noqa: S102
    return env[CAP_HELPER]


def _grok_layer_cap(config) -> float:
    """grok.py's own ``logit_cap = ...`` (0.5.23 :425), evaluated on ``config``."""
    tree = ast.parse(_release("srt/models/grok.py"))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "logit_cap")
    return eval(compile(ast.Expression(node.value), "<grok>", "eval"), {"config": config, "max": max, "getattr": getattr})


class _Attn(torch.nn.Module):
    """A stand-in for RadixAttention: what the helper reads of one is its ``logit_cap``."""

    def __init__(self, cap: float):
        super().__init__()
        self.logit_cap = cap


def _runner(layer_caps, config) -> types.SimpleNamespace:
    model = torch.nn.ModuleList([torch.nn.Sequential(_Attn(c)) for c in layer_caps])
    return types.SimpleNamespace(model=model, model_config=types.SimpleNamespace(hf_text_config=config))


def test_grok_without_the_config_key_is_planned_with_its_layers_cap_of_30():
    config = types.SimpleNamespace(num_hidden_layers=2)  # no attn_logit_softcapping
    cap = _grok_layer_cap(config)
    assert cap == 30.0  # grok.py's fallback
    assert _helper()(_runner([cap, cap], config)) == 30.0


def test_gemma2_is_planned_with_its_config_cap_as_its_layers_have_it():
    config = types.SimpleNamespace(attn_logit_softcapping=50.0)
    assert _helper()(_runner([50.0, 50.0], config)) == 50.0
    assert _helper()(_runner([0.0, 0.0], types.SimpleNamespace(attn_logit_softcapping=None))) == 0.0


def test_a_runner_whose_model_holds_no_layer_reads_the_config():
    """The attention test kit's runner (``self.model = nn.Module()``, dense_attention.py:338) builds its
    layers apart from the model and names the cap in its config."""
    config = types.SimpleNamespace(attn_logit_softcapping=50.0)
    kit = types.SimpleNamespace(model=torch.nn.Module(), model_config=types.SimpleNamespace(hf_text_config=config))
    assert _helper()(kit) == 50.0
    assert _helper()(types.SimpleNamespace(model_config=types.SimpleNamespace(hf_text_config=None))) == 0.0


def test_layers_of_different_caps_are_refused_at_start_up():
    with pytest.raises(ValueError, match=r"soft caps \[0.0, 30.0\]"):
        _helper()(_runner([30.0, 0.0], types.SimpleNamespace()))
