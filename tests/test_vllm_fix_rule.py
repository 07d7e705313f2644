"""vLLM's cap-route fix, the rule in ``vllm/utils/flashinfer.py`` (issue #40, a vLLM maintainer's asks):
``use_trtllm_attention`` / ``can_use_trtllm_attention`` take ``has_logits_soft_cap`` and with a cap
say no and warn once; the backend passes its cap; the large-page offer and the NVFP4 refusal at
backend selection read the config's cap (no ``static_forward_context``).

Oracles: executing the edited snippets as a package named ``vllm`` (what the edits do, not how they
read), written in the releases' shapes (0.20.0's one-line signature, 0.25.0+'s); vLLM's own unit test
(``fix_pytest``) on a release's overlay, shipped and fixed (matrix: it needs the overlay).
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from swa_repro.vllm.fix import fixes as fix
from swa_repro.vllm.fix import flashinfer_utils as fix_utils


def _vllm_modules() -> dict:
    return {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}


@pytest.fixture(autouse=True)
def _no_stand_in_vllm_left_behind():
    """A test here imports a stand-in ``vllm`` package from its tmp folder; monkeypatch restores only the
    modules it deleted, so the stand-in stayed in ``sys.modules`` and a later test of the same worker
    found it as the installed vLLM (``vllm.patch.cli.installed_backend``: "does not exist")."""
    before = _vllm_modules()
    yield
    for k in _vllm_modules():
        del sys.modules[k]
    sys.modules.update(before)

UTILS_SNIPPET = '''class _Logger:
    def __init__(self):
        self.warned = []

    def warning_once(self, msg, *args):
        self.warned.append(msg)


logger = _Logger()


def supports_trtllm_attention(is_prefill: bool = False) -> bool:
    return True


def force_use_trtllm_attention() -> bool | None:
    return None


def can_use_trtllm_attention(
    num_qo_heads: int, num_kv_heads: int, is_prefill: bool = False
) -> bool:
    """Check if the current configuration supports TRTLLM attention."""
    if force_use_trtllm_attention() is False:
        return False
    return supports_trtllm_attention(is_prefill=is_prefill) and (
        num_qo_heads % num_kv_heads == 0
    )


def use_trtllm_attention(
    num_qo_heads: int,
    num_kv_heads: int,
    is_prefill: bool,
    # None means auto-detection, True means force on, False means force off
    force_use_trtllm: bool | None = None,
    has_sinks: bool = False,
) -> bool:
    """Return `True` if TRTLLM attention is used."""
    # CLI argument is set to 0 - respect it
    if force_use_trtllm is not None and not force_use_trtllm:
        return False

    return supports_trtllm_attention(is_prefill=is_prefill)
'''
# 0.20.0-0.24.0 write the decode twin on one line, without is_prefill
UTILS_020 = UTILS_SNIPPET.replace('''def can_use_trtllm_attention(
    num_qo_heads: int, num_kv_heads: int, is_prefill: bool = False
) -> bool:''', "def can_use_trtllm_attention(num_qo_heads: int, num_kv_heads: int) -> bool:").replace(
    "supports_trtllm_attention(is_prefill=is_prefill) and (", "supports_trtllm_attention() and (")

BACKEND_SNIPPET = '''from vllm.utils.flashinfer import (
    can_use_trtllm_attention,
    use_trtllm_attention,
)


def get_current_vllm_config_or_none():
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


class FlashInferBackend:
    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        use_large_pages = False
        vllm_config = get_current_vllm_config_or_none()
        if vllm_config is not None and vllm_config.model_config is not None:
            use_large_pages = (
                num_kv_heads > 0
                and can_use_trtllm_attention(num_qo_heads, num_kv_heads)
            )
        if not use_large_pages:
            return [16, 32, 64]
        return [16, 32, 64, 128, 256, 512, 1024]

    @classmethod
    def supports_combination(cls, kv_cache_dtype, device_capability):
        return None


class FlashInferMetadataBuilder:
    def __init__(self, nvfp4, per_layer_cap):
        self.nvfp4_trtllm = nvfp4
        can_use_trtllm = can_use_trtllm_attention(self.num_qo_heads, self.num_kv_heads)
        self.use_trtllm_decode_attention = can_use_trtllm

        # Global hyperparameters shared by all attention layers
        self.global_hyperparameters = infer_global_hyperparameters(per_layer_cap)
        self.logits_soft_cap = self.global_hyperparameters.logits_soft_cap

    def build(self):
        prefill_use_trtllm = use_trtllm_attention(
            self.num_qo_heads,
            self.num_kv_heads,
            is_prefill=True,
        )
        return prefill_use_trtllm


num_qo_heads, num_kv_heads, infer_global_hyperparameters = 8, 2, lambda cap: type("H", (), {"logits_soft_cap": cap})
FlashInferMetadataBuilder.num_qo_heads, FlashInferMetadataBuilder.num_kv_heads = 8, 2
'''


def _vllm(tmp_path, monkeypatch, utils: str, backend: str | None, config_cap):
    """A package ``vllm`` on ``sys.path``: the edited utils (and backend), a current config whose text
    config has ``attn_logit_softcapping = config_cap``."""
    root = tmp_path / "site" / "vllm"
    (root / "utils").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "utils" / "__init__.py").write_text("")
    (root / "config.py").write_text(
        "from types import SimpleNamespace as N\n\n"
        f"CFG = N(model_config=N(hf_text_config=N(attn_logit_softcapping={config_cap!r})))\n\n\n"
        "def get_current_vllm_config_or_none():\n    return CFG\n")
    (root / "utils" / "flashinfer.py").write_text(fix_utils.edit(utils, "x"))
    if backend is not None:
        (root / "backend.py").write_text(fix.edit(backend, "x"))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    return types.SimpleNamespace(utils=importlib.import_module("vllm.utils.flashinfer"),
                                 backend=importlib.import_module("vllm.backend") if backend else None)


@pytest.mark.parametrize("utils", [UTILS_SNIPPET, UTILS_020], ids=["0.25.0+", "0.20.0"])
@pytest.mark.parametrize("cap", [False, True])
def test_the_rule_says_no_to_trtllm_with_a_cap_and_warns(tmp_path, monkeypatch, utils, cap):
    fi = _vllm(tmp_path, monkeypatch, utils, None, None).utils
    assert fi.can_use_trtllm_attention(8, 2, has_logits_soft_cap=cap) is not cap
    assert fi.use_trtllm_attention(8, 2, True, has_logits_soft_cap=cap) is not cap
    assert fi.can_use_trtllm_attention(8, 2) and fi.use_trtllm_attention(8, 2, True)  # other callers: as before
    assert len(fi.logger.warned) == 2 * cap and all("soft-capping" in w for w in fi.logger.warned)
    assert fi.use_trtllm_attention(8, 2, True, force_use_trtllm=False, has_logits_soft_cap=cap) is False


@pytest.mark.parametrize("cap", [None, 50.0])
def test_the_builder_passes_its_own_cap_to_both_routes(tmp_path, monkeypatch, cap):
    be = _vllm(tmp_path, monkeypatch, UTILS_SNIPPET, BACKEND_SNIPPET, None).backend
    b = be.FlashInferMetadataBuilder(False, cap)
    assert b.use_trtllm_decode_attention is (cap is None) and b.build() is (cap is None)


@pytest.mark.parametrize("config_cap, pages", [(50.0, [16, 32, 64]), (None, [16, 32, 64, 128, 256, 512, 1024])])
def test_large_pages_are_not_offered_where_the_config_has_a_cap(tmp_path, monkeypatch, config_cap, pages):
    """0.24.0+: pages over 64 run only on trtllm-gen; the offer asks the rule with the config's cap,
    read where the model's config is current (no built layer, no ``static_forward_context``)."""
    be = _vllm(tmp_path, monkeypatch, UTILS_SNIPPET, BACKEND_SNIPPET, config_cap).backend
    assert be.FlashInferBackend.get_supported_kernel_block_sizes() == pages
    assert "static_forward_context" not in fix.edit(BACKEND_SNIPPET, "x")


@pytest.mark.parametrize("kv, major, config_cap, refused", [
    ("nvfp4", 10, 50.0, True), ("nvfp4", 10, None, False), ("nvfp4", 9, 50.0, False), ("auto", 10, 50.0, False)])
def test_nvfp4_with_a_cap_is_refused_at_backend_selection(tmp_path, monkeypatch, kv, major, config_cap, refused):
    """0.32.0+: ``supports_combination`` (the selector's question) returns the reason where only
    trtllm-gen reads the NVFP4 cache (not sm80/90/120, ``_nvfp4_kv_on_fa2``); the builder no longer
    refuses it after load."""
    be = _vllm(tmp_path, monkeypatch, UTILS_SNIPPET, BACKEND_SNIPPET, config_cap).backend
    why = be.FlashInferBackend.supports_combination(kv, types.SimpleNamespace(major=major))
    assert (why is not None) is refused and (not refused or "soft cap" in why)
    be.FlashInferMetadataBuilder(True, config_cap)  # no refusal after load where selection has one


@pytest.mark.parametrize("nvfp4, cap, refused", [(True, 50.0, True), (True, None, False), (False, 50.0, False)])
def test_before_032_the_builder_refuses_nvfp4_with_a_cap(tmp_path, monkeypatch, nvfp4, cap, refused):
    """Releases without ``supports_combination`` keep the refusal at the builder's construction."""
    old = BACKEND_SNIPPET.replace('''    @classmethod
    def supports_combination(cls, kv_cache_dtype, device_capability):
        return None
''', "")
    be = _vllm(tmp_path, monkeypatch, UTILS_SNIPPET, old, None).backend
    if refused:
        with pytest.raises(NotImplementedError, match="nvfp4 runs on trtllm-gen only"):
            be.FlashInferMetadataBuilder(nvfp4, cap)
    else:
        be.FlashInferMetadataBuilder(nvfp4, cap)


def test_hunks_read_both_files_structure_not_comments():
    """Each edit is read from the code: a fixed file with one edit's code removed is partly applied."""
    from swa_repro.vllm.patch import cli as patch
    from swa_repro.vllm.provision import BACKEND

    texts = {patch.UTILS: fix_utils.edit(UTILS_SNIPPET, "x"), BACKEND: fix.edit(BACKEND_SNIPPET, "x")}
    assert patch.state(texts, "x") == "applied"
    half = {**texts, patch.UTILS: texts[patch.UTILS].replace("    if has_logits_soft_cap:\n", "    if False:\n", 1)}
    assert patch.state(half, "x").startswith("partly applied (missing: can_use_trtllm_attention argument")
    assert patch.state({patch.UTILS: UTILS_SNIPPET, BACKEND: BACKEND_SNIPPET}, "x") == "needed"


@pytest.mark.matrix
@pytest.mark.parametrize("version", ["0.20.0", "0.34.0"])
def test_vllms_unit_test_fails_shipped_and_passes_fixed(tmp_path, version):
    """The upstream diff's test (``fix_pytest``) on the release's own files, CPU: it fails on the
    shipped overlay (no ``has_logits_soft_cap``) and passes on the fixed one."""
    from swa_repro.vllm.fix.unit_test import run
    from swa_repro.vllm.provision import provision

    overlay = provision(version)[0]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shipped, fixed = run(overlay, tmp_path / "a"), run(fix.fixed_overlay(version, overlay), tmp_path / "b")
    assert shipped.returncode == 1 and " failed" in shipped.stdout, shipped.stdout[-2000:]
    assert fixed.returncode == 0 and " passed" in fixed.stdout and "failed" not in fixed.stdout, fixed.stdout[-2000:]


@pytest.mark.parametrize("utils", [UTILS_SNIPPET, UTILS_020], ids=["0.25.0+", "0.20.0"])
def test_the_rule_is_written_as_ruff_formats_it(utils):
    """The upstream diff is held to vLLM's formatter (88 columns) in both signature shapes, and the
    backend's new calls too."""
    from tests.test_vllm_fix import _ruff_formatted

    for text, edit in ((utils, fix_utils.edit), (BACKEND_SNIPPET, fix.edit)):
        text = _ruff_formatted(text)
        out = edit(text, "x")
        assert out != text and _ruff_formatted(out) == out
