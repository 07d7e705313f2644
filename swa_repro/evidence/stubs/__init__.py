"""Stubs that ``swa-repro bundle --sglang`` carries instead of wheels too large to travel (64 MiB a call).

One stub: ``sgl_kernel/`` (the source is copied into the bundle as the top-level package ``sgl_kernel``,
with ``_stub.json`` beside it naming what it replaces). :data:`STUBS` is what the bundle's MANIFEST.json
says about it: the reason, and the import sites measured for sglang 0.5.15.post1 with
``torch.cuda.is_available()`` faked True (/work/scratch/sglbundle/REPORT.md "Stubs", cuda_sim.py).
"""

from __future__ import annotations

from pathlib import Path

SGL_KERNEL_DIR = Path(__file__).resolve().parent / "sgl_kernel"
# the replaced wheel as measured when the stub was made (its size is not fetched: that is a 587 MiB download)
MEASURED_WHEELS = {"sglang-kernel==0.4.4": "sglang_kernel-0.4.4-cp310-abi3-manylinux2014_x86_64.whl, 586.6 MiB"}

# file:line in the installed sglang 0.5.15.post1 tree -> the names it takes from sgl_kernel at import
SGL_KERNEL_SITES = {
    "sglang/srt/layers/quantization/fp8_kernel.py:58": ["sgl_per_token_quant_fp8"],
    "sglang/srt/layers/quantization/fp8_kernel.py:66": ["sgl_per_token_group_quant_8bit"],
    "sglang/srt/layers/quantization/fp8_utils.py:160": ["fp8_blockwise_scaled_mm", "fp8_scaled_mm"],
    "sglang/srt/layers/quantization/int8_kernel.py:19": ["sgl_per_token_group_quant_8bit"],
    "sglang/srt/layers/quantization/w8a8_int8.py:46": ["int8_scaled_mm"],
    "sglang/srt/layers/quantization/compressed_tensors/schemes/compressed_tensors_w8a8_int8.py:30": ["int8_scaled_mm"],
    "sglang/srt/layers/quantization/qoq.py:23": ["qserve_w4a8_per_chn_gemm", "qserve_w4a8_per_group_gemm"],
    "sglang/srt/layers/quantization/utils.py:27": ["scalar_type.ScalarType", "scalar_type.scalar_types"],
    "sglang/srt/layers/quantization/gguf.py:39": ["moe_align_block_size", "moe_sum"],
    "sglang/srt/layers/quantization/gguf.py:40": ["quantization.ggml_*"],
    "sglang/srt/hardware_backend/gpu/quantization/gptq_kernels.py:48": ["gptq_gemm", "gptq_shuffle"],
    "sglang/srt/layers/moe/topk.py:182": ["topk_softmax"],
    "sglang/srt/layers/moe/topk.py:185": ["topk_sigmoid"],
    "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py:56": ["moe_sum_reduce"],
    "sglang/srt/layers/moe/moe_runner/triton_utils/moe_align_block_size.py:19": ["moe_align_block_size"],
    "sglang/srt/layers/sampler.py:34": ["top_k_renorm_prob", "top_p_renorm_prob"],
    "sglang/srt/speculative/spec_utils.py:66": ["fast_topk"],
    "sglang/srt/speculative/eagle_utils.py:53": ["build_tree_kernel_efficient"],
    "sglang/srt/mem_cache/hisparse_memory_pool.py:18": ["kvcacheio.transfer_kv_all_layer_mla"],
    "sglang/srt/utils/common.py:303": ["(import in try/except, then hasattr(torch.ops.sgl_kernel, ...))"],
}

STUBS = {
    "sgl_kernel": {
        "reason": "sglang imports quantization / MoE / sampling / speculative-decoding / hisparse kernels from "
                  "sgl_kernel at import time on CUDA; FlashInferAttnBackend's paged-prefill path calls none of "
                  "them: flashinfer_backend.py, radix_attention.py, forward_batch_info.py, forward_context.py, "
                  "base_attn_backend.py, memory_pool.py's CUDA store (sglang.jit_kernel.kvcache, "
                  "memory_pool.py:146) and the kit's dense_attention.py name none; memory_pool.py:158 "
                  "torch.ops.sgl_kernel.store_cache_cpu needs SGLANG_USE_CPU_ENGINE=1 (utils/common.py:207)",
        "behaviour": "every attribute lookup and sgl_kernel.* submodule import is recorded and gives a "
                     "placeholder; calling one records it and raises RuntimeError; provenance() reports both "
                     "and sglang-check fails a run in which anything was called; except the questions a "
                     "backend asks at construction, answered as sglang-kernel does (ANSWERED: "
                     "utils.is_arch_support_pdl, Triton's backend, triton_backend.py:70-71/:340 in 0.5.23), "
                     "recorded under 'answered'",
        "import_sites_measured": {"sglang": "0.5.15.post1", "sites": SGL_KERNEL_SITES},
    },
}
