"""FlashInfer compiles a layer's sliding window and logits soft cap in at plan().

`window_left >= 0` at plan() selects the kernel with the per-element window mask and
`logits_soft_cap > 0` the one with the tanh cap; `forward()` only overwrites
`_window_left` / `_logits_soft_cap` on the wrapper, which a kernel planned without
them ignores. These cases drive every path that plans a wrapper (ragged extend
without and with a prefix, paged-only extend, decode, EAGLE and DFlash target
verify, eager and under CUDA graphs) for a window layer, a window + cap layer and
a full layer with the cap of a sliding-window model, with keys outside the
window, against the kit's references. Under CUDA graphs a verify wrapper reads
its tree mask from the `custom_mask_buf` it was built with, where its plan()
copied it: wrappers sharing one buffer all read the mask planned last.

Needs the attention kit's `logit_cap` (DenseAttentionCase, references, model
config), its SWA case lists with keys outside the window, its DFlash SWA verify
expectation with the per-element window, and its custom-mask reference windowing
a draft token from its position in the tree (EAGLE topk > 1).
"""

import unittest
from dataclasses import replace

import torch

from sglang.srt.environ import envs
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.utils import is_flashinfer_available
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (
    DENSE_ATOL,
    DENSE_RTOL,
    DenseAttentionCase,
    build_dense_attention_fixture,
    expected_dense_fixture_output,
    make_swa_no_prefix_input_config_cases,
    make_swa_prefix_input_config_cases,
    run_dense_attention_case,
    run_dense_fixture_eager,
)
from sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner import (
    _make_flashinfer_dflash_swa_builtin_masks,
    run_dense_spec_verify_case,
    run_dense_spec_verify_cuda_graph_case,
)
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=20, stage="base-b", runner_config="1-gpu-large")

# The kit's projected logits are O(0.3): a cap below them changes the attention
# weights far beyond DENSE_ATOL, so a cap the kernel drops is caught.
LOGIT_CAP = 0.2


def _soft_cap(cases, suffix="soft_cap"):
    return tuple(
        replace(case, name=f"{case.name}_{suffix}", logit_cap=LOGIT_CAP)
        for case in cases
    )


def _keys_outside_window(case, *, within_input=False):
    """Some query's window excludes a key (of its own input, if `within_input`)."""
    window = case.sliding_window_size
    return any(
        (n if within_input else p + n) - 1 > window
        for p, n in zip(case.prefix_lens, case.input_lens)
    )


@unittest.skipIf(
    not torch.cuda.is_available() or not is_flashinfer_available(),
    "CUDA + flashinfer are required",
)
class TestFlashInferPlanTimeParams(CustomTestCase):
    # FlashInfer SM90 prefill kernels require value head dim in {64, 128, 256}.
    HEAD_DIM = 64
    HIDDEN_SIZE = 256

    NO_PREFIX_CASES = make_swa_no_prefix_input_config_cases("flashinfer")
    PREFIX_CASES = make_swa_prefix_input_config_cases("flashinfer")
    DECODE_CASES = (
        DenseAttentionCase(
            name="swa_decode_past_window",
            backend="flashinfer",
            forward_mode=ForwardMode.DECODE,
            num_heads=4,
            num_kv_heads=4,
            page_size=16,
            prefix_lens=(2, 4, 9, 17),
            sliding_window_size=4,
        ),
    )
    EAGLE_VERIFY_CASES = tuple(
        DenseAttentionCase(
            name=f"eagle_verify_swa_{'_'.join(map(str, prefix_lens))}",
            backend="flashinfer",
            forward_mode=ForwardMode.TARGET_VERIFY,
            num_heads=4,
            num_kv_heads=4,
            page_size=16,
            prefix_lens=prefix_lens,
            extend_lens=(3,) * len(prefix_lens),
            sliding_window_size=4,
        )
        for prefix_lens in ((2, 9), (17, 7))
    )
    DFLASH_VERIFY_CASES = (
        DenseAttentionCase(
            name="dflash_verify_swa_past_window",
            backend="flashinfer",
            forward_mode=ForwardMode.TARGET_VERIFY,
            num_heads=4,
            num_kv_heads=4,
            page_size=16,
            prefix_lens=(1, 4, 9, 17),
            extend_lens=(3, 3, 3, 3),
            sliding_window_size=4,
        ),
    )

    def _run_cases(self, cases, *, paged=False, full_layer=False):
        for case in cases:
            mode = "paged" if paged else "default"
            with self.subTest(case=case.name, backend=case.backend, mode=mode):
                with envs.SGLANG_FLASHINFER_USE_PAGED.override(paged):
                    if full_layer:
                        self._run_full_layer_case(case)
                    else:
                        run_dense_attention_case(
                            self,
                            case,
                            head_dim=self.HEAD_DIM,
                            hidden_size=self.HIDDEN_SIZE,
                        )

    def _run_full_layer_case(self, case):
        # A full-attention layer of the sliding-window model (gemma2's global
        # layers): the model and its metadata keep the case's window, the layer
        # has none, and neither has the reference.
        fixture = build_dense_attention_fixture(
            self, case, head_dim=self.HEAD_DIM, hidden_size=self.HIDDEN_SIZE
        )
        fixture.actual_module.attn.sliding_window_size = -1
        actual = run_dense_fixture_eager(fixture)
        full = replace(fixture, case=replace(case, sliding_window_size=None))
        expected = expected_dense_fixture_output(full)
        torch.testing.assert_close(actual, expected, atol=DENSE_ATOL, rtol=DENSE_RTOL)

    def _run_verify_cases(self, cases, spec_kind, topks):
        for case in cases:
            for topk in topks:
                with self.subTest(case=case.name, topk=topk, spec_kind=spec_kind):
                    run_dense_spec_verify_case(
                        self,
                        case,
                        topk=topk,
                        spec_kind=spec_kind,
                        head_dim=self.HEAD_DIM,
                        hidden_size=self.HIDDEN_SIZE,
                    )

    def _run_verify_cuda_graph_cases(self, cases, spec_kind, topks):
        for case in cases:
            for topk in topks:
                with self.subTest(case=case.name, topk=topk, spec_kind=spec_kind):
                    run_dense_spec_verify_cuda_graph_case(
                        self,
                        case,
                        topk=topk,
                        spec_kind=spec_kind,
                        head_dim=self.HEAD_DIM,
                        hidden_size=self.HIDDEN_SIZE,
                    )

    def test_kit_cases_and_expectations(self):
        # Window 4 makes keys i-4 .. i visible to the query at i: a case whose
        # keys are all visible passes with the window dropped.
        for name, cases, within_input in (
            ("no_prefix", self.NO_PREFIX_CASES, True),
            ("prefix", self.PREFIX_CASES, False),
            ("prefix_extend", self.PREFIX_CASES, True),
            ("decode", self.DECODE_CASES, False),
            ("eagle_verify", self.EAGLE_VERIFY_CASES, False),
            ("dflash_verify", self.DFLASH_VERIFY_CASES, False),
        ):
            with self.subTest(cases=name):
                self.assertTrue(
                    any(
                        _keys_outside_window(c, within_input=within_input)
                        for c in cases
                    ),
                    f"no case of {[c.name for c in cases]} has keys outside the window",
                )
        # DFlash verify: the query at prefix + j attends keys prefix + j - window ..
        # prefix + j, not the block's shared start prefix - window.
        case = self.DFLASH_VERIFY_CASES[0]
        masks = _make_flashinfer_dflash_swa_builtin_masks(case, device="cpu")
        window = case.sliding_window_size
        for prefix_len, mask in zip(case.prefix_lens, masks):
            with self.subTest(dflash_expectation=prefix_len):
                q_pos = torch.arange(mask.shape[0]).unsqueeze(1) + prefix_len
                k_idx = torch.arange(mask.shape[1]).unsqueeze(0)
                expected = (k_idx >= q_pos - window) & (k_idx <= q_pos)
                self.assertTrue(torch.equal(mask.cpu(), expected))

    # Each path for three layers of a sliding-window model: a window layer, a
    # window + cap layer (gemma2's local layers) and a full layer with the cap
    # (its global layers).

    # Ragged extend without a cached prefix.
    def test_ragged_no_prefix_window(self):
        self._run_cases(self.NO_PREFIX_CASES)

    def test_ragged_no_prefix_window_soft_cap(self):
        self._run_cases(_soft_cap(self.NO_PREFIX_CASES))

    def test_ragged_no_prefix_soft_cap(self):
        cases = _soft_cap(self.NO_PREFIX_CASES, "full_layer")
        self._run_cases(cases, full_layer=True)

    # Ragged extend over the new tokens + paged over the cached prefix, merged.
    def test_ragged_prefix_window(self):
        self._run_cases(self.PREFIX_CASES)

    def test_ragged_prefix_window_soft_cap(self):
        self._run_cases(_soft_cap(self.PREFIX_CASES))

    def test_ragged_prefix_soft_cap(self):
        cases = _soft_cap(self.PREFIX_CASES, "full_layer")
        self._run_cases(cases, full_layer=True)

    # Paged-only extend (SGLANG_FLASHINFER_USE_PAGED=1).
    def test_paged_window(self):
        self._run_cases(self.NO_PREFIX_CASES + self.PREFIX_CASES, paged=True)

    def test_paged_window_soft_cap(self):
        cases = _soft_cap(self.NO_PREFIX_CASES + self.PREFIX_CASES)
        self._run_cases(cases, paged=True)

    def test_paged_soft_cap(self):
        cases = _soft_cap(self.NO_PREFIX_CASES + self.PREFIX_CASES, "full_layer")
        self._run_cases(cases, paged=True, full_layer=True)

    # Decode.
    def test_decode_window(self):
        self._run_cases(self.DECODE_CASES)

    def test_decode_window_soft_cap(self):
        self._run_cases(_soft_cap(self.DECODE_CASES))

    def test_decode_soft_cap(self):
        cases = _soft_cap(self.DECODE_CASES, "full_layer")
        self._run_cases(cases, full_layer=True)

    # Target verify of a window layer: EAGLE chain and tree, DFlash chain.
    def test_eagle_verify_window(self):
        self._run_verify_cases(self.EAGLE_VERIFY_CASES, "eagle", (1, 2))

    def test_dflash_verify_window(self):
        self._run_verify_cases(self.DFLASH_VERIFY_CASES, "dflash", (1,))

    # The other tree verifies (NGRAM, Frozen-KV MTP) share EAGLE's path and cases.
    def test_ngram_verify_window(self):
        self._run_verify_cases(self.EAGLE_VERIFY_CASES, "ngram", (1, 2))

    def test_frozen_kv_mtp_verify_window(self):
        self._run_verify_cases(self.EAGLE_VERIFY_CASES, "frozen_kv_mtp", (1, 2))

    # Target verify under CUDA graphs: capture, then replay on the captured
    # wrappers, whose tree masks the replay plans refill.
    def test_eagle_verify_window_cuda_graph(self):
        self._run_verify_cuda_graph_cases(self.EAGLE_VERIFY_CASES, "eagle", (1, 2))

    def test_ngram_verify_window_cuda_graph(self):
        self._run_verify_cuda_graph_cases(self.EAGLE_VERIFY_CASES, "ngram", (1, 2))

    def test_frozen_kv_mtp_verify_window_cuda_graph(self):
        self._run_verify_cuda_graph_cases(
            self.EAGLE_VERIFY_CASES, "frozen_kv_mtp", (1, 2)
        )


if __name__ == "__main__":
    unittest.main()
