"""The cap-route fix's unit test, in vLLM's style, for the upstream diff (a vLLM maintainer asked: issue #40).

vLLM keeps the tests of ``vllm/utils/flashinfer.py`` in ``tests/utils_/`` (``test_flashinfer.py``,
``test_flashinfer_utils.py``: ``import vllm.utils.flashinfer as fi``, ``monkeypatch`` on the module's
functions, no GPU); this is a new file there, so the diff adds it whole. It tests the selection
rule, not a kernel: with trtllm-gen available (``supports_trtllm_attention`` patched), a soft cap
turns both routes off and warns once, and ``model_has_logits_soft_cap`` reads the config key. One
axis per ``parametrize``. :func:`run` runs it on a release's overlay (CPU), as
``tests/test_vllm_fix_pytest.py`` does on the shipped and the fixed one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TEST_PATH = "tests/utils_/test_flashinfer_logits_soft_cap.py"
TEST_TEXT = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""trtllm-gen and XQA take no logits soft cap: FlashInfer's selection rule keeps
soft-capped layers on the FlashInfer wrappers, which apply it."""

from types import SimpleNamespace

import pytest
import torch

import vllm.config
import vllm.utils.flashinfer as fi


@pytest.fixture
def warnings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A platform where trtllm-gen would be used; the warnings logged."""
    monkeypatch.setattr(fi, "supports_trtllm_attention", lambda *args, **kw: True)
    monkeypatch.setattr(fi, "force_use_trtllm_attention", lambda: None)
    logged: list[str] = []
    monkeypatch.setattr(
        fi.logger, "warning_once", lambda msg, *a, **kw: logged.append(msg)
    )
    return logged


@pytest.mark.parametrize("is_prefill", [True, False])
@pytest.mark.parametrize("has_logits_soft_cap", [False, True])
def test_use_trtllm_attention_logits_soft_cap(
    warnings: list[str], is_prefill: bool, has_logits_soft_cap: bool
):
    use_trtllm = fi.use_trtllm_attention(
        num_qo_heads=8,
        num_kv_heads=2,
        num_tokens=16,
        max_seq_len=1024,
        dcp_world_size=1,
        kv_cache_dtype="auto",
        q_dtype=torch.bfloat16,
        is_prefill=is_prefill,
        force_use_trtllm=True,
        has_logits_soft_cap=has_logits_soft_cap,
    )
    assert use_trtllm is not has_logits_soft_cap
    assert any("soft-capping" in w for w in warnings) is has_logits_soft_cap


@pytest.mark.parametrize("has_logits_soft_cap", [False, True])
def test_can_use_trtllm_attention_logits_soft_cap(
    warnings: list[str], has_logits_soft_cap: bool
):
    can_use = fi.can_use_trtllm_attention(8, 2, has_logits_soft_cap=has_logits_soft_cap)
    assert can_use is not has_logits_soft_cap
    assert any("soft-capping" in w for w in warnings) is has_logits_soft_cap


@pytest.mark.parametrize("attn_logit_softcapping", [None, 50.0])
def test_model_has_logits_soft_cap(
    monkeypatch: pytest.MonkeyPatch, attn_logit_softcapping: float | None
):
    text_config = SimpleNamespace(attn_logit_softcapping=attn_logit_softcapping)
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_text_config=text_config)
    )
    monkeypatch.setattr(
        vllm.config, "get_current_vllm_config_or_none", lambda: vllm_config
    )
    assert fi.model_has_logits_soft_cap() is (attn_logit_softcapping is not None)


def test_model_has_logits_soft_cap_without_config(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: None)
    assert not fi.model_has_logits_soft_cap()
'''


def run(overlay: Path, folder: Path) -> subprocess.CompletedProcess:
    """The test, written into ``folder``, run by pytest on ``overlay``'s vLLM (its Python files and
    ``.deps``, first on the path; no compiled extension, no GPU)."""
    test = folder / Path(TEST_PATH).name
    test.write_text(TEST_TEXT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(overlay), str(overlay / ".deps")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)], check=False,
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
