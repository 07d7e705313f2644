"""pyproject's pytest filters hide exactly the third-party warnings that ended `make test` (each by
its message, category and module), and nothing else: the same message from another module, or
another message from the same module, still shows."""

from __future__ import annotations

import warnings

import pytest

# (message, category, module it is attributed to): as `pytest -rw` reported them (sglang 0.5.15.post1,
# torch 2.11.0, flashinfer 0.6.12 on a machine without CUDA)
SEEN = [
    ("Triton is not supported on current platform, roll back to CPU.", UserWarning,
     "sglang.srt.layers.attention.fla.utils"),
    ("Only CUDA, HIP and XPU support AWQ currently.", UserWarning, "sglang.srt.layers.quantization.awq.awq"),
    ("Only CUDA, MUSA and NPU support GGUF quantization currently.", UserWarning,
     "sglang.srt.layers.quantization.gguf"),
    ("`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`.",
     DeprecationWarning, "torch.jit._script"),
    ("tcgen05.OperandMajorMode is deprecated, use cute.nvgpu.OperandMajorMode instead", DeprecationWarning,
     "flashinfer.gemm.kernels.grouped_gemm_masked_blackwell"),
]


def _shown(message: str, category, module: str) -> bool:
    with warnings.catch_warnings(record=True) as got:  # keeps the filters pytest applied for this test
        warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)
    return bool(got)


@pytest.mark.parametrize("message, category, module", SEEN, ids=[s[2] for s in SEEN])
def test_third_party_warning_is_filtered(message, category, module):
    assert not _shown(message, category, module)


@pytest.mark.parametrize("message, category, module", SEEN, ids=[s[2] for s in SEEN])
def test_filters_are_precise(message, category, module):
    assert _shown(message, category, "swa_repro.core.cache")  # the same text from our own code
    assert _shown("something else went wrong", category, module)  # another warning of that module
