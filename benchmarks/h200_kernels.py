"""The H200 study's measurements (mixed into ``h200_study.Study``): FlashInfer's paged prefill
planned the sglang way, and the torch baselines (compiled FlexAttention with a sliding-window
block mask; SDPA with an explicit boolean mask). The mask is the project's one visibility rule,
``swa_repro.core.reference.visible``.
"""

from __future__ import annotations

import math
import time

from benchmarks.common import min_bytes
from benchmarks.gpu_timing import check_rows, n_input_sets
from benchmarks.h200_plan import FLEX_COMPILE_EST_S, WORKSPACE_BYTES, Job, Shape, module_name
from swa_repro.core.reference import visible


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


_FLEX_WINDOW = None


def _flex_window(torch, device):
    """One 0-d tensor read by the mask at run time: a new window refills it, no recompile."""
    global _FLEX_WINDOW
    if _FLEX_WINDOW is None:
        _FLEX_WINDOW = torch.zeros((), dtype=torch.int64, device=device)
    return _FLEX_WINDOW


def _swa_mask_mod(b, h, q_idx, kv_idx):
    """``visible(q_idx, kv_idx, W)`` with W read from a tensor at run time (``visible`` branches
    on a Python int, which a compiled mask cannot do without recompiling per window)."""
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= _FLEX_WINDOW)


def _plan_info(w, backend: str) -> dict:
    """fa2 plan_info: ``[3]`` CTA_TILE_Q, ``[14]`` split_kv (GUIDE; the PrefillPlanInfo layout)."""
    if backend != "fa2":
        return {}
    try:
        pi = list(w._plan_info)
        return {"plan_cta_tile_q": int(pi[3]), "plan_split_kv": bool(pi[14])}
    except Exception:  # noqa: BLE001 - informational only
        return {}


class FlashInferRuns:
    """``Study`` methods that build and time FlashInfer's modules."""

    def paged_inputs(self, s: Shape, seed: int):
        torch, dev, ps = self.torch, self.device, self.args.page_size
        pages = math.ceil(s.seq_len / ps)
        n_pages = s.batch * pages
        gen = torch.Generator(device=dev).manual_seed(seed)
        i32 = dict(dtype=torch.int32, device=dev)
        meta = {"qo_indptr": torch.arange(s.batch + 1, **i32) * s.seq_len,
                "kv_indptr": torch.arange(s.batch + 1, **i32) * pages,
                "kv_indices": torch.randperm(n_pages, generator=gen, device=dev).to(torch.int32),  # shuffled pages
                "last_page_len": torch.full((s.batch,), s.seq_len - (pages - 1) * ps, **i32)}
        set_bytes = min_bytes(s.seq_len, s.batch, s.num_qo_heads, s.num_kv_heads, s.head_dim)
        bf = dict(dtype=torch.bfloat16, device=dev, generator=gen)
        sets = [(torch.randn(s.batch * s.seq_len, s.num_qo_heads, s.head_dim, **bf),
                 torch.randn(n_pages, ps, s.num_kv_heads, s.head_dim, **bf),
                 torch.randn(n_pages, ps, s.num_kv_heads, s.head_dim, **bf))
                for _ in range(n_input_sets(set_bytes, self.l2))]
        return meta, sets

    def wrapper(self, backend: str):
        import flashinfer
        if not hasattr(self, "_ws"):
            self._ws = self.torch.empty(WORKSPACE_BYTES, dtype=self.torch.uint8, device=self.device)
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._ws, "NHD", backend=backend)

    def plan_wrapper(self, w, meta, s: Shape, plan_window: int):
        bf16 = self.torch.bfloat16
        w.plan(meta["qo_indptr"], meta["kv_indptr"], meta["kv_indices"], meta["last_page_len"],
               s.num_qo_heads, s.num_kv_heads, s.head_dim, self.args.page_size,
               causal=self.args.plan_causal, window_left=plan_window, q_data_type=bf16, kv_data_type=bf16)

    def build_module(self, backend: str, head_dim: int, swa: bool) -> dict:
        """First plan+run wall time minus the steady-state plan+run: the module's JIT build."""
        s = Shape(512, 1, 32, 4, head_dim)
        meta, sets = self.paged_inputs(s, 1)
        q, kc, vc = sets[0]
        walls = []
        for _ in range(2):
            t = time.perf_counter()
            w = self.wrapper(backend)
            self.plan_wrapper(w, meta, s, 64 if swa else -1)
            w.forward(q, (kc, vc), causal=True, window_left=64)
            self.torch.cuda.synchronize()
            walls.append(time.perf_counter() - t)
        return {"module": module_name(backend, head_dim, swa), "first_s": walls[0], "steady_s": walls[1],
                "jit_s": walls[0] - walls[1]}

    def run_flashinfer(self, jobs: list[Job]):
        torch = self.torch
        by_shape: dict[tuple, list[Job]] = {}
        for j in jobs:
            by_shape.setdefault((j.backend, j.shape), []).append(j)
        for (backend, s), js in by_shape.items():
            if self.left() < min(j.est_measure_s(self.args.target_s) for j in js):
                for j in js:
                    self.skip(j, "budget")
                continue
            meta, sets = self.paged_inputs(s, self.args.seed)
            q0, kc0, vc0 = sets[0]
            k0, v0 = self.dense_kv(meta, kc0, vc0, s)
            for j in js:
                if self.left() < j.est_measure_s(self.args.target_s):
                    self.skip(j, "budget")
                    continue
                if self.jit.get(j.module, {}).get("error"):
                    self.skip(j, f"module {j.module} not built ({self.jit[j.module]['error']})")
                    continue
                try:
                    w = self.wrapper(backend)
                    self.plan_wrapper(w, meta, s, j.window if j.variant == "fixed" else -1)
                    fwd_w = j.window  # causal jobs carry -1

                    def fn(i, w=w, fwd_w=fwd_w):
                        q, kc, vc = sets[i]
                        return w.forward(q, (kc, vc), causal=True, window_left=fwd_w)

                    t = self.clock.time(fn, len(sets), self.args.target_s)
                    out = torch.full_like(q0, float("nan"))  # poisoned: unwritten rows stay NaN
                    w.run(q0, (kc0, vc0), out=out)  # forward() left self._window_left = fwd_w
                    torch.cuda.synchronize()
                    chk = check_rows(torch, out[: s.seq_len], q0[: s.seq_len], k0, v0, j.window)
                    self.record(j, **t, **chk, nan_frac=float(torch.isnan(out).float().mean()),
                                n_input_sets=len(sets), plan_causal=self.args.plan_causal,
                                **_plan_info(w, backend))
                    del out
                except Exception as e:  # noqa: BLE001 - recorded; the study goes on
                    self.record(j, error=_err(e))
                    self._assert_cuda_alive()
            meta = sets = q0 = kc0 = vc0 = k0 = v0 = None  # free before the next shape
            torch.cuda.empty_cache()

    def dense_kv(self, meta, kc, vc, s: Shape):
        """Request 0's K/V back out of the shuffled pages: ``(L, Hk, D)`` each."""
        pages = meta["kv_indices"][: int(meta["kv_indptr"][1])].long()
        k = kc[pages].reshape(-1, s.num_kv_heads, s.head_dim)[: s.seq_len]
        v = vc[pages].reshape(-1, s.num_kv_heads, s.head_dim)[: s.seq_len]
        return k, v


class TorchRuns:
    """``Study`` methods that compile and time the torch baselines."""

    def dense_inputs(self, s: Shape, seed: int):
        torch = self.torch
        gen = torch.Generator(device=self.device).manual_seed(seed)
        bf = dict(dtype=torch.bfloat16, device=self.device, generator=gen)
        set_bytes = min_bytes(s.seq_len, s.batch, s.num_qo_heads, s.num_kv_heads, s.head_dim)
        return [(torch.randn(s.batch, s.num_qo_heads, s.seq_len, s.head_dim, **bf),
                 torch.randn(s.batch, s.num_kv_heads, s.seq_len, s.head_dim, **bf),
                 torch.randn(s.batch, s.num_kv_heads, s.seq_len, s.head_dim, **bf))
                for _ in range(n_input_sets(set_bytes, self.l2))]

    def flex_fn(self):
        if not hasattr(self, "_flex"):
            import torch._dynamo
            from torch.nn.attention.flex_attention import flex_attention
            for name in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, 256)
            self._flex = self.torch.compile(flex_attention, dynamic=False)
        return self._flex

    def flex_block_mask(self, s: Shape, window: int):
        from torch.nn.attention.flex_attention import create_block_mask
        _flex_window(self.torch, self.device).fill_(window)
        return create_block_mask(_swa_mask_mod, None, None, s.seq_len, s.seq_len, device=self.device)

    def compile_flex(self, s: Shape):
        """First call wall time minus a steady call: the compile cost of this shape."""
        torch = self.torch
        sets = self.dense_inputs(s, 1)[:1]
        q, k, v = sets[0]
        bm = self.flex_block_mask(s, self.args.windows[0])
        walls = []
        for _ in range(2):
            t = time.perf_counter()
            self.flex_fn()(q, k, v, block_mask=bm, enable_gqa=s.group > 1)
            self.clock.sync()
            walls.append(time.perf_counter() - t)
        name = Job("torch", "flex", s, 0).module
        self.add_jit({"module": name, "first_s": walls[0], "steady_s": walls[1], "jit_s": walls[0] - walls[1],
                      "contended": not self.args.serial_jit})
        del sets, q, k, v, bm
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def run_torch(self, jobs: list[Job]):
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        by_shape: dict[tuple, list[Job]] = {}
        for j in jobs:
            by_shape.setdefault((j.variant, j.shape), []).append(j)
        for (variant, s), js in by_shape.items():
            if self.left() < min(j.est_measure_s(self.args.target_s) for j in js):
                for j in js:
                    self.skip(j, "budget")
                continue
            try:
                sets = self.dense_inputs(s, self.args.seed)
                if variant == "sdpa":  # repeat K/V to Hq heads outside the timed region
                    sets = [(q, k.repeat_interleave(s.group, 1), v.repeat_interleave(s.group, 1))
                            for q, k, v in sets]
            except Exception as e:  # noqa: BLE001
                for j in js:
                    self.record(j, error=_err(e))
                self._assert_cuda_alive()
                continue
            q0, k0, v0 = sets[0]
            for j in js:
                if self.left() < j.est_measure_s(self.args.target_s):
                    self.skip(j, "budget")
                    continue
                try:
                    extra = {}
                    if variant == "flex":
                        if j.module not in self.jit:
                            if self.left() < FLEX_COMPILE_EST_S[1] + j.est_measure_s(self.args.target_s):
                                self.skip(j, "budget (shape not compiled)")
                                continue
                            self.compile_flex(s)
                        bm = self.flex_block_mask(s, j.window)
                        f = self.flex_fn()

                        def fn(i, bm=bm, f=f):
                            q, k, v = sets[i]
                            return f(q, k, v, block_mask=bm, enable_gqa=s.group > 1)
                        extra["block_sparsity"] = float(bm.sparsity())
                    else:
                        pos = torch.arange(s.seq_len, device=self.device)
                        mask = visible(pos[:, None], pos[None, :], j.window)  # (L, L): p - W <= key <= p

                        kernel = self.sdpa_backend(sdpa_kernel, SDPBackend, sets[0], mask)

                        def fn(i, mask=mask, kernel=kernel):
                            q, k, v = sets[i]
                            with sdpa_kernel([kernel]):
                                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                        extra["sdpa_backend"] = kernel.name
                    t = self.clock.time(fn, len(sets), self.args.target_s)
                    out = fn(0)
                    self.clock.sync()
                    chk = check_rows(torch, out[0].transpose(0, 1), q0[0].transpose(0, 1),
                                     k0[0].transpose(0, 1)[:, ::s.group] if variant == "sdpa" else k0[0].transpose(0, 1),
                                     v0[0].transpose(0, 1)[:, ::s.group] if variant == "sdpa" else v0[0].transpose(0, 1),
                                     j.window)
                    self.record(j, **t, **chk, nan_frac=float(torch.isnan(out).float().mean()),
                                n_input_sets=len(sets), **extra)
                    del out
                except Exception as e:  # noqa: BLE001
                    self.record(j, error=_err(e))
                    self._assert_cuda_alive()
            sets = q0 = k0 = v0 = None
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()

    def sdpa_backend(self, sdpa_kernel, SDPBackend, qkv, mask):
        """First SDPA kernel that takes an explicit mask here: memory-efficient, then cuDNN on
        CUDA; the math kernel only on CPU (on the GPU it would hold (B, H, L, L) scores)."""
        names = ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION") if self.device.startswith("cuda") else ("MATH",)
        last = None
        for name in names:
            kernel = getattr(SDPBackend, name, None)
            if kernel is None:
                continue
            try:
                with sdpa_kernel([kernel]):
                    self.torch.nn.functional.scaled_dot_product_attention(*qkv, attn_mask=mask)
                return kernel
            except RuntimeError as e:
                last = e
        raise RuntimeError(f"no SDPA kernel with an explicit mask among {names}: {last}")

    def _assert_cuda_alive(self):
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()  # a sticky CUDA error raises here and ends the run

