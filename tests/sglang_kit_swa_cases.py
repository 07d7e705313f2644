"""sglang's own SWA kit tests for one backend (``SWA_KIT_BACKEND``: flashinfer, triton or fa3), eager and
CUDA graph, for scripts/gpu_kit.sh (#40: the kit for every SWA backend it registers, shipped and fixed).

Re-expresses the SWA cases of sglang's test/registered/attention/unittests/swa/test_flashinfer.py,
test_triton.py and test_fa3.py (not in the wheel): the kit's SWA case lists (with the kit edits, the cases
past the window too), FlashInfer's paged mode, the CUDA-graph decode cases, and the speculative verify
cases (EAGLE chain and tree, Frozen-KV MTP, DFlash, NGRAM; each kind as the backend's file has it),
eager and through the kit's CUDA-graph runner (capture, then replay). Added, for every backend alike:
EAGLE verify past the window (prefixes 6 and 9, window 4), topk 1 and 2, eager and CUDA graph: the
case that fails FlashInfer as shipped (the window dropped from verify plans; under CUDA graphs the one
shared packed-mask buffer) and passes it fixed. Left out: the layout-robustness and split-op cases
(no SWA window past their lengths; the split-op runner needs the piecewise-graph context).

The kit's reference decides each expectation (``kit_edits``: a tree token's window from its depth, but
for the backends the kit declares by index, Triton). Only sglang, torch and the stdlib are imported.
"""

import os
import unittest

from sglang.srt.environ import envs
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (
    DenseAttentionCase,
    make_swa_no_prefix_input_config_cases,
    make_swa_prefix_input_config_cases,
    run_dense_attention_case,
)
from sglang.test.kits.attention_unittest.runner_modes.cuda_graph_decode_runner import (
    run_dense_cuda_graph_decode_case,
)
from sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner import (
    run_dense_spec_verify_case,
    run_dense_spec_verify_cuda_graph_case,
)

BACKEND = os.environ.get("SWA_KIT_BACKEND", "flashinfer")
# as each backend's file calls the runners (test_flashinfer.py / test_fa3.py: 64 and 256; test_triton.py:
# the kit's defaults); FA3's tree verify needs page size 1 (_init_sliding_window_attn_spec_metadata)
DIMS = {"flashinfer": {"head_dim": 64, "hidden_size": 256}, "fa3": {"head_dim": 64, "hidden_size": 256},
        "triton": {}}[BACKEND]
PAGE = 1 if BACKEND == "fa3" else 16


def _case(name, mode, prefix, extend=(), window=4):
    return DenseAttentionCase(name=name, backend=BACKEND, forward_mode=mode, num_heads=4, num_kv_heads=4,
                              page_size=PAGE, prefix_lens=prefix, extend_lens=extend, sliding_window_size=window)


V = ForwardMode.TARGET_VERIFY
CHAIN = (3, 5)
KINDS = {  # each backend file's verify kinds (test_flashinfer.py: DFlash only; test_triton.py: all)
    "flashinfer": ("dflash",), "fa3": (), "triton": ("eagle", "frozen_kv_mtp", "dflash", "ngram")}[BACKEND]
SPEC = [(_case(f"runner_{k}_verify_swa_chain", V, CHAIN, (3, 3)), 1, k) for k in KINDS]
if BACKEND == "triton":
    SPEC.append((_case("runner_eagle_verify_swa_tree", V, CHAIN, (3, 3)), 2, "eagle"))
if BACKEND == "fa3":
    SPEC.append((_case("runner_eagle_verify_swa_tree", V, (3, 9), (3, 3)), 2, "eagle"))
PAST = [(_case(f"runner_eagle_verify_swa_past_window_topk{k}", V, (6, 9), (3, 3)), k, "eagle") for k in (1, 2)]
DECODE = [_case("runner_cuda_graph_swa_decode_within_window", ForwardMode.DECODE, (1, 2, 3)),
          _case("runner_cuda_graph_swa_decode_above_window", ForwardMode.DECODE, (7, 8, 9))]
PAGED_LONG = _case("swa_extend_no_prefix_above_window_long", ForwardMode.EXTEND, (0, 0, 0), (6, 8, 12))


class TestKitSWACases(unittest.TestCase):
    CASES = make_swa_no_prefix_input_config_cases(BACKEND) + make_swa_prefix_input_config_cases(BACKEND)

    def test_projected_swa_attention_cases(self):
        for case in self.CASES:
            with self.subTest(case=case.name, backend=BACKEND):
                run_dense_attention_case(self, case, **DIMS)

    @unittest.skipUnless(BACKEND == "flashinfer", "FlashInfer's paged-only prefill route")
    def test_projected_swa_attention_cases_paged_mode(self):
        for case in (*self.CASES, PAGED_LONG):
            with self.subTest(case=case.name, backend=BACKEND, mode="paged"), \
                    envs.SGLANG_FLASHINFER_USE_PAGED.override(True):
                run_dense_attention_case(self, case, **DIMS)

    @unittest.skipIf(BACKEND == "fa3", "test_fa3.py has no CUDA-graph decode cases")
    def test_runner_mode_cuda_graph_decode_cases(self):
        for case in DECODE:
            with self.subTest(case=case.name, backend=BACKEND):
                run_dense_cuda_graph_decode_case(self, case, **DIMS)

    def _verify(self, cases, graph):
        run = run_dense_spec_verify_cuda_graph_case if graph else run_dense_spec_verify_case
        for case, topk, kind in cases:
            with self.subTest(case=case.name, backend=BACKEND, topk=topk, spec_kind=kind):
                run(self, case, topk=topk, spec_kind=kind, **DIMS)

    def test_runner_mode_spec_verify_cases(self):
        self._verify(SPEC, graph=False)

    def test_runner_mode_spec_verify_cuda_graph_cases(self):
        self._verify(SPEC, graph=True)

    def test_spec_verify_past_window(self):
        self._verify(PAST, graph=False)

    def test_spec_verify_past_window_cuda_graph(self):
        self._verify(PAST, graph=True)


if __name__ == "__main__":  # scripts/gpu_kit.sh runs it per backend and site
    unittest.main()
