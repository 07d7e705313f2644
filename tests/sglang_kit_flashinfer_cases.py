"""sglang's own FlashInfer kit tests, as far as they run one case at a time, for the CPU run of
tests/test_upstream_kit.py (``upstream_cpu``: plan-time stand-ins for FlashInfer's wrappers).

Mirrors sglang's test/registered/attention/unittests/dense/test_flashinfer.py
``test_projected_dense_attention_cases`` and swa/test_flashinfer.py
``test_projected_swa_attention_cases``, ``..._paged_mode`` and the DFlash SWA chain of
``test_runner_mode_spec_verify_cases`` (those files are not in the wheel): the kit's case makers
and runners, ``HEAD_DIM = 64``, ``HIDDEN_SIZE = 256``. Only sglang, torch and the stdlib are
imported, so it runs against whichever kit the overlay holds (shipped or edited).
"""

import unittest

from sglang.srt.environ import envs
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (
    DenseAttentionCase,
    make_dense_cases,
    make_swa_no_prefix_input_config_cases,
    make_swa_prefix_input_config_cases,
    run_dense_attention_case,
)
from sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner import (
    run_dense_spec_verify_case,
)

DFLASH_SWA_CHAIN = DenseAttentionCase(
    name="runner_dflash_verify_swa_chain",
    backend="flashinfer",
    forward_mode=ForwardMode.TARGET_VERIFY,
    num_heads=4,
    num_kv_heads=4,
    page_size=16,
    prefix_lens=(3, 5),
    extend_lens=(3, 3),
    sliding_window_size=4,
)


class TestKitFlashInferCases(unittest.TestCase):
    HEAD_DIM = 64
    HIDDEN_SIZE = 256

    def _run(self, cases, paged):
        for case in cases:
            with self.subTest(case=case.name, mode="paged" if paged else "default"):
                with envs.SGLANG_FLASHINFER_USE_PAGED.override(paged):
                    run_dense_attention_case(self, case, head_dim=self.HEAD_DIM, hidden_size=self.HIDDEN_SIZE)

    def test_projected_dense_attention_cases(self):
        self._run(make_dense_cases("flashinfer"), paged=False)

    def test_projected_swa_attention_cases(self):
        self._run(make_swa_no_prefix_input_config_cases("flashinfer")
                  + make_swa_prefix_input_config_cases("flashinfer"), paged=False)

    def test_projected_swa_attention_cases_paged_mode(self):
        self._run(make_swa_no_prefix_input_config_cases("flashinfer")
                  + make_swa_prefix_input_config_cases("flashinfer"), paged=True)

    def test_runner_mode_spec_verify_cases(self):
        with self.subTest(case=DFLASH_SWA_CHAIN.name, topk=1, spec_kind="dflash"):
            run_dense_spec_verify_case(self, DFLASH_SWA_CHAIN, topk=1, spec_kind="dflash",
                                       head_dim=self.HEAD_DIM, hidden_size=self.HIDDEN_SIZE)


if __name__ == "__main__":  # scripts/gpu_fix.sh's regress step runs it on each site
    unittest.main()
