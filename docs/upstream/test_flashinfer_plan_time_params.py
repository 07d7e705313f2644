"""FlashInfer compiles a layer's sliding window and logits soft cap into the kernel at plan().

``window_left >= 0`` at plan() selects the module with the per-element window mask, and
``logits_soft_cap > 0`` the one with the tanh cap. The deprecated ``forward()`` only overwrites
``_window_left`` / ``_logits_soft_cap`` on the wrapper: a value it is given that plan() did not
see is ignored by the kernel. These cases drive ``FlashInferAttnBackend`` down each path that
plans a wrapper (ragged extend without and with prefix, paged-only extend, decode) for a
sliding-window layer (window 8) and a soft-capped layer (cap 50) of a hybrid sliding-window model,
with sequences longer than the window, and compare with a float64 reference that applies the
window per element and the cap.

CUDA only. Run: ``python test_flashinfer_plan_time_params.py``.
"""

import math
import unittest

import torch

from sglang.srt.environ import envs
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.test.kits.attention_unittest.attention_methods.dense_attention import (
    DENSE_ATOL,
    DENSE_RTOL,
    DenseAttentionCase,
    MockModelRunner,
    TinyModelConfig,
    _make_forward_batch,
    make_loc_fn,
)

DEVICE = "cuda"
DTYPE = torch.bfloat16  # as swa-repro's live audit: the two share their compiled FlashInfer modules
WINDOW = 8  # window_left: keys i - 8 .. i are visible to the query at position i
CAP = 50.0
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 64
PREFIX, EXTEND = (20, 3), (24, 12)  # every request but one runs past the window
DECODE_PREFIX = (30, 5)
# Queries of a capped layer are scaled so that |q.k| * sm_scale reaches past the cap: with
# unscaled randn inputs the logits stay near 1, where a dropped cap changes nothing measurable.
CAPPED_Q_SCALE = 16.0

LAYERS = {  # name -> (sliding_window_size, logit_cap)
    "swa": (WINDOW, 0.0),
    "swa_cap": (WINDOW, CAP),
    "full_cap": (-1, CAP),
}


def reference(q, k, v, positions, window, cap, sm_scale):
    """float64 attention of one request: ``q`` (n, Hq, D) at ``positions``, ``k``/``v`` (m, Hkv, D)
    for positions 0..m-1; key j visible to query i iff j <= i and (window < 0 or j >= i - window);
    logits capped as ``cap * tanh(logits / cap)``."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q.double(), k) * sm_scale
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    i = positions.view(-1, 1).to(s.device)
    j = torch.arange(k.shape[0], device=s.device).view(1, -1)
    visible = j <= i
    if window >= 0:
        visible &= j >= i - window
    s = s.masked_fill(~visible, -math.inf)
    return torch.einsum("hnm,mhd->nhd", torch.softmax(s, dim=-1), v)


class TestFlashInferPlanTimeParams(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if DEVICE == "cuda" and not torch.cuda.is_available():
            raise unittest.SkipTest("FlashInfer needs CUDA")

    def _run(self, layer_name, mode, prefix_lens, extend_lens, use_paged=False):
        window, cap = LAYERS[layer_name]
        decode = mode == ForwardMode.DECODE
        case = DenseAttentionCase(
            name=f"{layer_name}_{mode.name.lower()}",
            backend="flashinfer",
            forward_mode=mode,
            num_heads=NUM_HEADS,
            num_kv_heads=NUM_KV_HEADS,
            page_size=1,
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            sliding_window_size=WINDOW,  # the model is hybrid: its layers have window 8 or none
        )
        max_ctx = max(case.seq_lens)
        model_config = TinyModelConfig(
            num_heads=NUM_HEADS,
            num_kv_heads=NUM_KV_HEADS,
            head_dim=HEAD_DIM,
            hidden_size=NUM_HEADS * HEAD_DIM,
            context_len=max_ctx,
            sliding_window_size=WINDOW,
        )
        if cap:  # where a model says its layers' cap (gemma2: config.attn_logit_softcapping)
            model_config.hf_text_config.attn_logit_softcapping = cap
        runner = MockModelRunner(
            case=case,
            model_config=model_config,
            dtype=DTYPE,
            device=DEVICE,
            max_context_len=max_ctx,
            head_dim=HEAD_DIM,
        )
        with envs.SGLANG_FLASHINFER_USE_PAGED.override(use_paged):
            backend = FlashInferAttnBackend(runner)
        layer = RadixAttention(
            NUM_HEADS,
            HEAD_DIM,
            HEAD_DIM**-0.5,
            NUM_KV_HEADS,
            layer_id=0,
            logit_cap=cap,
            sliding_window_size=window,
        )

        g = torch.Generator().manual_seed(0)
        loc_fn = make_loc_fn(
            "shuffled_pages",
            batch_size=case.batch_size,
            seq_lens=case.seq_lens,
            prefix_lens=case.prefix_lens,
            page_size=1,
            max_context_len=max_ctx,
        )
        batch = _make_forward_batch(
            case, runner, max_context_len=max_ctx, device=DEVICE, loc_fn=loc_fn
        )
        q_scale = CAPPED_Q_SCALE if cap else 1.0
        qs, ks, vs, new_positions = [], [], [], []
        for r, (p, n) in enumerate(zip(case.prefix_lens, case.input_lens)):
            qs.append(torch.randn(n, NUM_HEADS, HEAD_DIM, generator=g) * q_scale)
            ks.append(torch.randn(p + n, NUM_KV_HEADS, HEAD_DIM, generator=g))
            vs.append(torch.randn(p + n, NUM_KV_HEADS, HEAD_DIM, generator=g))
            new_positions.append(torch.arange(p, p + n))
        locs = [loc_fn(r, i) for r, p in enumerate(case.prefix_lens) for i in range(p)]
        if locs:  # the cached prefix, written where the request's tokens live
            runner.token_to_kv_pool.set_kv_buffer(
                layer,
                torch.tensor(locs, dtype=torch.int64, device=DEVICE),
                torch.cat([k[:p] for k, p in zip(ks, case.prefix_lens)]).to(DEVICE, DTYPE),
                torch.cat([v[:p] for v, p in zip(vs, case.prefix_lens)]).to(DEVICE, DTYPE),
            )

        def new(xs):
            return torch.cat([x[p:] for x, p in zip(xs, case.prefix_lens)]).to(DEVICE, DTYPE)

        q = torch.cat(qs).to(DEVICE, DTYPE)
        with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
            backend.init_forward_metadata(batch)
            out = layer(
                q.view(q.shape[0], -1),
                new(ks).view(q.shape[0], -1),
                new(vs).view(q.shape[0], -1),
                batch,
            )
        out = out.view(-1, NUM_HEADS, HEAD_DIM).float().cpu()
        # the reference sees exactly the bf16/fp16-rounded inputs sglang saw
        expected = torch.cat(
            [
                reference(
                    qq.to(DTYPE),
                    kk.to(DTYPE),
                    vv.to(DTYPE),
                    pos,
                    window,
                    cap,
                    HEAD_DIM**-0.5,
                )
                for qq, kk, vv, pos in zip(qs, ks, vs, new_positions)
            ]
        ).float()
        self.assertFalse(torch.isnan(out).any(), "NaN in the backend's output")
        torch.testing.assert_close(out, expected, atol=DENSE_ATOL, rtol=DENSE_RTOL)

    def _extend(self, layer_name, prefix_lens, use_paged=False):
        self._run(layer_name, ForwardMode.EXTEND, prefix_lens, EXTEND, use_paged)

    # ragged extend, no cached prefix
    def test_ragged_no_prefix_window(self):
        self._extend("swa", (0, 0))

    def test_ragged_no_prefix_window_soft_cap(self):
        self._extend("swa_cap", (0, 0))

    def test_ragged_no_prefix_soft_cap(self):
        self._extend("full_cap", (0, 0))

    # ragged extend over new tokens + paged over the cached prefix, merged
    def test_ragged_prefix_window(self):
        self._extend("swa", PREFIX)

    def test_ragged_prefix_window_soft_cap(self):
        self._extend("swa_cap", PREFIX)

    def test_ragged_prefix_soft_cap(self):
        self._extend("full_cap", PREFIX)

    # paged-only extend (SGLANG_FLASHINFER_USE_PAGED=1)
    def test_paged_window(self):
        self._extend("swa", PREFIX, use_paged=True)

    def test_paged_window_soft_cap(self):
        self._extend("swa_cap", PREFIX, use_paged=True)

    def test_paged_soft_cap(self):
        self._extend("full_cap", PREFIX, use_paged=True)

    # decode
    def test_decode_window(self):
        self._run("swa", ForwardMode.DECODE, DECODE_PREFIX, ())

    def test_decode_window_soft_cap(self):
        self._run("swa_cap", ForwardMode.DECODE, DECODE_PREFIX, ())

    def test_decode_soft_cap(self):
        self._run("full_cap", ForwardMode.DECODE, DECODE_PREFIX, ())


if __name__ == "__main__":
    unittest.main()
