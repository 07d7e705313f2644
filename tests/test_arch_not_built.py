"""The architecture columns sglang 0.5.23 left ``not built`` (#41 hB), each rule held to a second route over
the release's own files (regular expressions over the text), not the code under test's ``ast`` walk.

* a model that builds fewer attention layers than its config declares (an MTP head) is driven on the
  layers it built, each of the kind the config gives its ``layer_id`` (0.5.23 exaone_moe_mtp.py);
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
from conftest import skip_module_unless

skip_module_unless("transformers")

from swa_repro.core.cache import cache_root


def _models(version: str = "0.5.23") -> Path:
    m = cache_root() / "sglang" / version / "sglang" / "srt" / "models"
    if not m.is_dir():
        pytest.skip(f"sglang {version}'s overlay is not on this machine")
    return m


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
