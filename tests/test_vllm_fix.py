"""vLLM's cap-route fix (issue #27): the edits on snippets written as the releases write their anchors
(run in `make test`), the committed fixed table and diff; the fix on a release's own file is `matrix`.

Oracles: executing the edited snippet (what the edit does, not how it reads), ruff format (the
upstream diff is held to vLLM's formatter), and the audit of the fixed release (matrix).
"""

from __future__ import annotations

import json

import pytest

from swa_repro.cli import main

_SNIPPET = '''class FlashInferMetadataBuilder:
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        can_use_trtllm = can_use_trtllm_attention(self.num_qo_heads, self.num_kv_heads)
        self.use_trtllm_decode_attention = can_use_trtllm

        # Global hyperparameters shared by all attention layers
        self.global_hyperparameters = infer_global_hyperparameters(
            get_per_layer_parameters(vllm_config, layer_names, FlashInferImpl)
        )
        self.logits_soft_cap = self.global_hyperparameters.logits_soft_cap

    def build(self):
        prefill_use_trtllm = use_trtllm_attention(
            self.num_qo_heads,
        )
'''


def test_fix_edits_both_routes_and_refuses_an_unknown_structure():
    """Both routes pass the builder's own cap to the rule (``has_logits_soft_cap=self.logits_soft_cap
    is not None``, a vLLM maintainer's ask, issue #40), read once: the hyperparameter block moved
    above the decode route."""
    import ast

    from swa_repro.core.errors import UsageError
    from swa_repro.vllm.fix.fixes import edit

    out = edit(_SNIPPET, "0.20.0")
    tree = ast.parse(out)
    calls = {c.func.id: c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    for name in ("can_use_trtllm_attention", "use_trtllm_attention"):
        kw = {k.arg: ast.unparse(k.value) for k in calls[name].keywords}
        assert kw == {"has_logits_soft_cap": "self.logits_soft_cap is not None"}, name
    assert out.count("infer_global_hyperparameters(") == 1
    assert out.index("self.logits_soft_cap = self.global") < out.index("can_use_trtllm = can_use_trtllm_attention(")
    assert "raise NotImplementedError" not in out  # no NVFP4 attribute in this release's builder
    with pytest.raises(UsageError, match="not a structure this fix knows"):
        edit(_SNIPPET.replace("prefill_use_trtllm", "p"), "0.99.0")
    with pytest.raises(UsageError, match="0 hyperparameter anchors"):
        edit(_SNIPPET.replace("# Global hyperparameters", "# Hyperparameters"), "0.99.0")
    with pytest.raises(UsageError, match="not one argument a line"):
        edit(_SNIPPET.replace("self.num_qo_heads,\n        )", "self.num_qo_heads\n        )"), "0.99.0")


def test_fix_carries_no_tool_tags_into_the_upstream_code():
    """The upstream code says what it does in vLLM's voice: no ``swa-repro`` marker in any edit (a
    vLLM maintainer asked; ``hunks`` reads the structure, never a comment)."""
    from swa_repro.vllm.fix.fixes import edit, hunks

    out = edit(_SNIPPET + _IMPL_020 + _PAGES, "0.24.0")
    assert "swa-repro" not in out.lower() and set(hunks(out)) == {"decode route", "prefill route", "large pages",
                                                                   "quantized query"}
    assert all(hunks(out).values())


_IMPL_020 = '''class FlashInferImpl:
    def __init__(self, logits_soft_cap, vllm_config):
        self.logits_soft_cap = logits_soft_cap
        self.support_trtllm_attn = True
        self.supports_quant_query_input = (
            self.support_trtllm_attn
            and vllm_config is not None
        )
'''


@pytest.mark.parametrize("cap, takes_fp8_query", [(50.0, False), (None, True)])
def test_fix_keeps_a_soft_capped_layer_from_taking_an_fp8_query_where_020_to_024_offer_it(cap, takes_fp8_query):
    """0.20.0-0.24.x's impl offers an fp8 query whenever trtllm-gen could run; the fixed builder keeps a
    soft-capped layer off trtllm-gen and plans a model-dtype query, so the fix also withdraws the offer
    for that layer (the audit's fp8 path found ``Query dtype mismatch`` on sm100 without it); a layer
    without a cap keeps it."""
    from swa_repro.vllm.fix.fixes import NOTE, edit

    out = edit(_SNIPPET + _IMPL_020, "0.20.0")
    scope: dict = {}
    exec(compile(out, "flashinfer.py", "exec"), scope)  # noqa: S102 - the edited snippet, nothing else
    assert scope["FlashInferImpl"](cap, object()).supports_quant_query_input is takes_fp8_query
    assert NOTE["quantized query"] not in edit(_SNIPPET, "0.25.0")


def _ruff_formatted(text: str) -> str:
    """``text`` as ruff format writes it at vLLM's 88 columns (the pinned dev dependency)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff (a dev dependency, pyproject.toml) is not installed"
    return subprocess.run([ruff, "format", "--line-length", "88", "-"], input=text, capture_output=True, text=True,
                          check=True).stdout


_PAGES = '''from vllm.utils.flashinfer import (
    can_use_trtllm_attention,
    use_trtllm_attention,
)


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
'''
def test_fix_edits_are_ruff_formatted():
    """The upstream diff is held to vLLM's formatter: every edit, a long name's included, is already as
    ruff format writes it."""
    from swa_repro.vllm.fix.fixes import edit

    text = (_SNIPPET + _IMPL_020 + _PAGES).replace("can_use_trtllm =", "can_use_xqa_or_trtllm_gen_decode =")
    text = text.replace("= can_use_trtllm\n", "= can_use_xqa_or_trtllm_gen_decode\n")
    text = _ruff_formatted(text)
    out = edit(text, "0.24.0")
    assert out != text and _ruff_formatted(out) == out


@pytest.mark.parametrize("argv, says", [
    (["audit", "--vllm", "0.34.0", "--fix", "window"], "choose cap-route"),
    (["audit", "--diff"], "--diff goes with --vllm"),
])
def test_fix_bad_input_is_one_line(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_committed_fixed_table_renders_from_its_json():
    from swa_repro.engine import families as sf
    from swa_repro.engine.provenance import TABLE_DIR
    from swa_repro.vllm.audit import table

    p = TABLE_DIR / "fixed" / f"{table.NAME}.json"
    t = json.loads(p.read_text())
    md = table.markdown(t, t["families"], [sf.GPU_CLASSES[g] for g in t["gpus"]])
    assert md == p.with_suffix(".md").read_text() and t["fix"] == "cap-route"
    for v, rel in t["releases"].items():  # the fix leaves no dropped cap anywhere, with any cache or page
        for g, row in rel.items():
            for c in row.values():
                for a in (c, *c.get("cache_dtypes", {}).values()):
                    assert not any("logits_soft_cap" in w for w in a["why"]), (v, g)
                if g == "sm100" and c["asked"] and any(k["cap"] for k in c["asked"].values()):
                    assert max(c.get("kernel_page", {}).values() or [0]) <= 64, (v, g)  # no trtllm-gen page


@pytest.mark.matrix
def test_fix_034_keeps_the_cap_and_the_committed_diff_is_the_fix():
    """0.34.0 with --fix cap-route: gemma2's paths reach the planned wrappers with the cap on sm90
    and sm100; gpt-oss (no cap) keeps trtllm-gen; docs/audit/fixed/vllm-cap-route-0.34.0.diff is the edit."""
    from swa_repro.engine.families import GPU_CLASSES
    from swa_repro.engine.provenance import TABLE_DIR
    from swa_repro.vllm.audit.core import run_release
    from swa_repro.vllm.audit.verdict import cell
    from swa_repro.vllm.fix.fixes import upstream_diff
    from swa_repro.vllm.provision import provision

    doc, _, _ = run_release("0.34.0", ["gemma2", "gpt-oss"], [GPU_CLASSES["sm90"], GPU_CLASSES["sm100"]],
                            note=lambda s: None, fix="cap-route")
    for a in ("9.0", "10.0"):
        g = doc["audits"][a]["gemma2"]
        assert cell(g)["state"] == "not affected"
        assert {k["kernel"] for r in g["rows"] for k in r["kernels"]} == {
            "BatchPrefillWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper"}
    assert {k["kernel"] for r in doc["audits"]["10.0"]["gpt-oss"]["rows"] for k in r["kernels"]} == {
        "trtllm_batch_context_with_kv_cache", "trtllm_batch_decode_with_kv_cache"}
    committed = (TABLE_DIR / "fixed" / "vllm-cap-route-0.34.0.diff").read_text()
    assert committed == upstream_diff("0.34.0", provision("0.34.0")[0])
