"""serving_path: each rule is read from the release's text (synthetic snippets), and real releases."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from swa_repro.core.errors import UsageError
from swa_repro.sglang import serving_path as sp

FI_SRC = '''
class FlashInferAttnBackend:
    def __init__(self, model_runner):
        self.use_paged = envs.SGLANG_FLASHINFER_USE_PAGED.get()

    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_decode_or_idle():
            pass
        else:
            if self.is_multimodal or self.enable_mis:
                use_ragged = False
            else:
                use_ragged = (
                    not self.enable_deterministic
                    and not is_in_piecewise_cuda_graph()
                    and not self.use_paged
                )
'''

SERVER_ARGS = '''
class ServerArgs:
    disable_piecewise_cuda_graph: bool = False

    def __post_init__(self):
        self._handle_model_specific_adjustments()
        self._handle_attention_backend_compatibility()

    def _handle_piecewise_cuda_graph(self):
        if self.get_model_config().is_multimodal:
            self.disable_piecewise_cuda_graph = True

    def _handle_model_specific_adjustments(self):
        if model_arch in ["GptOssForCausalLM"]:
            if self.is_attention_backend_not_set():
                if is_sm100_supported():
                    self.attention_backend = "trtllm_mha"
                else:
                    self.attention_backend = "triton"
            supported_backends = ["triton", "trtllm_mha", "fa3"]
            assert prefill in supported_backends

    def _get_default_attn_backend(self, use_mla_backend, model_config):
        if not use_mla_backend:
            if is_hopper_with_cuda_12_3():
                return "fa3"
            elif is_sm100_supported():
                return "trtllm_mha"
            else:
                return "flashinfer" if is_flashinfer_available() else "triton"
'''

MODEL_CONFIG = '''
class ModelConfig:
    def __init__(self, enable_multimodal=None):
        if enable_multimodal is None:
            mm_disabled_models = [
                "Gemma3ForConditionalGeneration",
            ]
multimodal_model_archs = ["Gemma3ForConditionalGeneration"]
piecewise_cuda_graph_disabled_model_archs = ["DeepseekV32ForCausalLM"]
'''


def make_pkg(tmp_path: Path, fi=FI_SRC, sa=SERVER_ARGS, mc=MODEL_CONFIG) -> Path:
    pkg = tmp_path / "sglang"
    files = {"srt/layers/attention/flashinfer_backend.py": fi, "srt/server_args.py": sa,
             "srt/configs/model_config.py": mc,
             "srt/models/gemma2.py": "EntryClass = Gemma2ForCausalLM\n",
             "srt/models/gemma3_mm.py": "EntryClass = Gemma3ForConditionalGeneration\n",
             "srt/models/gpt_oss.py": "EntryClass = GptOssForCausalLM\n"}
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text))
    return pkg


def by_arch(pkg, release="x") -> dict:
    return {fp.architecture: fp for fp in sp.analyze_release(pkg, release)}


def test_piecewise_default_on_gives_paged_only_and_the_flag_to_leave_it(tmp_path):
    fp = by_arch(make_pkg(tmp_path))["Gemma2ForCausalLM"]
    assert fp.flashinfer_kept and fp.default_prefill == "paged-only"
    assert fp.to_other == ("--disable-piecewise-cuda-graph",)
    assert fp.sources["pcg_default"] == "sglang/srt/server_args.py:3"
    assert fp.sources["use_ragged"].endswith("flashinfer_backend.py:13")


def test_piecewise_default_off_gives_ragged_with_every_switch(tmp_path):
    pkg = make_pkg(tmp_path, sa=SERVER_ARGS.replace("disable_piecewise_cuda_graph: bool = False",
                                                    "disable_piecewise_cuda_graph: bool = True"))
    fp = by_arch(pkg)["Gemma2ForCausalLM"]
    assert fp.default_prefill == "ragged"
    assert fp.to_other == ("--enable-deterministic-inference", "SGLANG_FLASHINFER_USE_PAGED=1", "--enable-mis",
                           "--enforce-piecewise-cuda-graph")


def test_env_switch_is_read_from_the_text(tmp_path):
    sa = SERVER_ARGS.replace("= False", "= True")
    fi = FI_SRC.replace("\n                    and not self.use_paged", "").replace(
        "self.use_paged = envs.SGLANG_FLASHINFER_USE_PAGED.get()", "pass")
    fp = by_arch(make_pkg(tmp_path, fi=fi, sa=sa))["Gemma2ForCausalLM"]
    assert fp.default_prefill == "ragged"
    assert not any("USE_PAGED" in f for f in fp.to_other)
    renamed = FI_SRC.replace("SGLANG_FLASHINFER_USE_PAGED", "SGLANG_OTHER_NAME")
    fp = by_arch(make_pkg(tmp_path / "b", fi=renamed, sa=sa))["Gemma2ForCausalLM"]
    assert "SGLANG_OTHER_NAME=1" in fp.to_other


def test_multimodal_off_by_default_vs_on(tmp_path):
    sa = SERVER_ARGS.replace("= False", "= True")
    fp = by_arch(make_pkg(tmp_path, sa=sa))["Gemma3ForConditionalGeneration"]
    assert fp.default_prefill == "ragged" and "--enable-multimodal" in fp.to_other
    mc = MODEL_CONFIG.replace('"Gemma3ForConditionalGeneration",\n', '"Llama4ForConditionalGeneration",\n')
    fp = by_arch(make_pkg(tmp_path / "b", sa=sa, mc=mc))["Gemma3ForConditionalGeneration"]
    assert fp.default_prefill == "paged-only" and fp.to_other == ()


def test_refusal_is_read_from_the_assert(tmp_path):
    fp = by_arch(make_pkg(tmp_path))["GptOssForCausalLM"]
    assert fp.default_prefill == "refused" and fp.flashinfer_kept is False
    assert fp.refusal.startswith("sglang/srt/server_args.py:21 ")
    assert sp.cell(fp) == "refused (server_args.py:21)"
    sa = SERVER_ARGS.replace('["triton", "trtllm_mha", "fa3"]', '["triton", "flashinfer"]')
    fp = by_arch(make_pkg(tmp_path / "b", sa=sa))["GptOssForCausalLM"]
    assert fp.flashinfer_kept and fp.refusal is None


def test_default_backend_model_rule_then_generic_chooser(tmp_path):
    got = by_arch(make_pkg(tmp_path))
    assert got["GptOssForCausalLM"].default_backend == {"sm90": "triton", "sm100": "trtllm_mha", "other": "triton"}
    assert got["Gemma2ForCausalLM"].default_backend == {"sm90": "fa3", "sm100": "trtllm_mha", "other": "flashinfer"}
    assert got["Gemma2ForCausalLM"].sources["default_backend_other"] == "sglang/srt/server_args.py:30"


def test_absent_and_unknown(tmp_path):
    got = by_arch(make_pkg(tmp_path, fi="class FlashInferAttnBackend:\n    pass\n"))
    assert got["Cohere2ForCausalLM"].default_prefill == "absent"
    assert got["Gemma2ForCausalLM"].default_prefill.startswith("unknown: use_ragged rule not found")


def test_bad_dir_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        sp.analyze_release(tmp_path, "x")


def test_render_markdown(tmp_path):
    md = sp.render_markdown({"x": sp.analyze_release(make_pkg(tmp_path), "x")})
    assert "## Which prefill path a default `--attention-backend flashinfer` server takes" in md
    assert "| x | paged-only (ragged: --disable-piecewise-cuda-graph) |" in md
    assert "refused (server_args.py:21)" in md and "How to read a cell" in md


INSTALLED = Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages/sglang"


def release(version: str) -> dict:
    if version == "0.5.15.post1" and (INSTALLED / "srt/server_args.py").is_file():
        return by_arch(INSTALLED, version)
    from conftest import release_overlay

    root = release_overlay(version)
    return by_arch(root / "sglang", version)


@pytest.mark.network
def test_release_0_5_15_post1():
    got = release("0.5.15.post1")
    g2 = got["Gemma2ForCausalLM"]
    # flashinfer_backend.py:824 `use_ragged = (not self.enable_deterministic and not
    # is_in_tc_piecewise_cuda_graph() and not self.use_paged)`; cuda_graph_config.py:101 breakable on CUDA
    assert g2.default_prefill == "ragged" and g2.sources["use_ragged"].endswith("flashinfer_backend.py:824")
    assert "SGLANG_FLASHINFER_USE_PAGED=1" in g2.to_other and "--enable-deterministic-inference" in g2.to_other
    assert g2.default_backend == {"sm90": "fa3", "sm100": "trtllm_mha", "other": "flashinfer"}
    # server_args.py:4023 asserts GptOss backends in [triton, trtllm_mha, fa3, fa4, ...] (no flashinfer)
    assert got["GptOssForCausalLM"].refusal.startswith("sglang/srt/server_args.py:4023 ")
    # model_config.py mm_disabled_models holds Gemma3ForConditionalGeneration: multimodal off by default
    assert "--enable-multimodal" in got["Gemma3ForConditionalGeneration"].to_other
    assert got["Gemma4ForConditionalGeneration"].default_prefill == "refused"


@pytest.mark.network
def test_release_0_5_10():
    got = release("0.5.10")
    g2 = got["Gemma2ForCausalLM"]
    # server_args.py:637 `disable_piecewise_cuda_graph: bool = False`; flashinfer_backend.py:488 use_ragged
    assert g2.default_prefill == "paged-only" and g2.sources["pcg_default"] == "sglang/srt/server_args.py:637"
    assert g2.to_other == ("--disable-piecewise-cuda-graph",)
    assert g2.sources["use_ragged"].endswith("flashinfer_backend.py:488")
    assert got["GptOssForCausalLM"].refusal.startswith("sglang/srt/server_args.py:1718 ")
    # server_args.py:1886 asserts Exaone4 (sliding_window_pattern) in [fa3, triton, trtllm_mha], before a default
    assert got["Exaone4ForCausalLM"].default_backend["sm90"].startswith("refused: no default")
    assert got["Gemma4ForCausalLM"].default_prefill == "absent"


@pytest.mark.network
def test_release_0_5_23():
    got = release("0.5.23")
    assert got["Gemma2ForCausalLM"].default_prefill == "ragged"
    # arg_groups/model_hook.py:536 (GptOss) and :655 (Gemma4) assert backend lists without flashinfer
    assert got["GptOssForCausalLM"].refusal.startswith("sglang/srt/arg_groups/model_hook.py:536 ")
    assert got["Gemma4ForCausalLM"].refusal.startswith("sglang/srt/arg_groups/model_hook.py:655 ")
    # model_overrides/exaone.py:27 sets fa3 on sm>=80 when no backend is given
    assert got["Exaone4ForCausalLM"].default_backend["sm90"] == "fa3"
