"""What the audit replaces around sglang's backend, inside :func:`audit_env` only (restored on exit):

* the three FlashInfer wrapper classes, by ``engine.standins``' ``PagedStandIn`` / ``RaggedStandIn`` /
  ``DecodeStandIn``: flashinfer 0.6.12's call contract (``kernel.signatures``, the same
  signatures and plan/forward/run state rules as the model wrappers) with zero outputs. The audit
  reads the *calls*, never these outputs;
* flashinfer's ``fast_decode_plan`` (decode.py:2898) and ``merge_state`` (sglang's
  ``_safe_merge_state``, :105), absent without flashinfer;
* the Triton kv-indices kernel, in every sglang module that binds it (``releases.release_env``);
* sglang's ``fast_prefill_plan`` (0.5.14+), like ``fast_decode_plan`` (``releases.fast_prefill_plan``);
* on a CPU host only (``device="cpu"``): ``torch`` *as the backend module sees it*:
  ``device="cuda"`` buffers (decode's kv indices, :1500; ``init_cuda_graph_state``, :860) land on
  the CPU and ``torch.cuda.get_device_properties`` reports an H200's 132 SMs; and the Triton
  kv-indices kernel by its torch port. On a GPU host sglang's own torch and Triton kernel run;
* for a trace that keeps floating-point tensors by shape only (``Trace.values`` False: the family
  audit), the KV pool's copy of k/v into its buffers (``memory_pool._set_kv_buffer_impl``) where it
  provably cannot fail: :func:`unread_kv_writes`.
"""

from __future__ import annotations

import contextlib

from swa_repro.engine.standins import (
    CpuTorch,
    DecodeStandIn,
    PagedStandIn,
    RaggedStandIn,
    fast_decode_plan,
    merge_state,
)
from swa_repro.sglang import harness
from swa_repro.sglang.trace import Trace, record_class

PAGED, RAGGED, DECODE = harness.WRAPPER_NAMES
STAND_INS = {PAGED: PagedStandIn, RAGGED: RaggedStandIn, DECODE: DecodeStandIn}


@contextlib.contextmanager
def audit_env(trace: Trace, fb, *, use_paged: bool, device: str = "cpu"):
    """The stand-ins in the backend module's namespace plus the release's switches
    (``releases.release_env``), restored on exit; the CPU replacements only on ``device="cpu"``."""
    from swa_repro.sglang import releases  # releases imports harness; kept out of import time

    names = {n: record_class(cls, trace, n) for n, cls in STAND_INS.items()}
    # merge_state: 0.5.10 calls flashinfer.cascade.merge_state by name (:58, :862); later, _safe_merge_state
    names.update(fast_decode_plan=fast_decode_plan, _safe_merge_state=merge_state, merge_state=merge_state,
                 global_workspace_buffer=None)
    on_cpu = device == "cpu"
    if on_cpu:
        names.update(torch=CpuTorch(), create_flashinfer_kv_indices_triton=harness.TorchKvIndices())
    if hasattr(fb, "fast_prefill_plan"):
        names["fast_prefill_plan"] = releases.fast_prefill_plan
    with harness._namespace(fb, names), releases.release_env(fb, use_paged=use_paged, kv_indices_port=on_cpu), \
            (contextlib.nullcontext() if trace.values else unread_kv_writes()):
        yield


PLATFORM_FLAGS = ("_is_cuda", "_is_hip", "_is_xpu", "_is_npu", "_is_cpu")  # memory_pool's dispatch at import


@contextlib.contextmanager
def unread_kv_writes():
    """The KV pool's writes of k/v (``memory_pool._set_kv_buffer_impl``: 0.5.10 :89-121, 0.5.23 :159-218)
    skipped where they are the naive copy ``k_cache[indices] = k; v_cache[indices] = v`` of exactly shaped,
    same-dtype rows at in-range int64 indices, which cannot fail; anything else (a GPU or CPU-kernel
    dispatch, a shape, dtype or index the copy would refuse) runs the release's own function. Why: the
    family audit's q/k/v are zeros, its KV buffers uninitialised (``family.untouched_kv_pools``) and its
    trace keeps them by shape only; nothing reads what the copy writes, yet it was the child's largest
    single cost (cProfile of 0.5.23's table child: ~50 s in 1968 copies, the first touch of each page)."""
    import importlib

    mp = importlib.import_module("sglang.srt.mem_cache.memory_pool")
    shipped = getattr(mp, "_set_kv_buffer_impl", None)
    if shipped is None or any(getattr(mp, n, False) for n in PLATFORM_FLAGS):
        yield
        return

    def store(k, v, k_cache, v_cache, indices, *args, **kwargs):
        if not (_plain_copy(k, k_cache, indices) and _plain_copy(v, v_cache, indices)):
            return shipped(k, v, k_cache, v_cache, indices, *args, **kwargs)
        return None

    with harness._namespace(mp, {"_set_kv_buffer_impl": store}):
        yield


def _plain_copy(x, cache, indices) -> bool:
    """``cache[indices] = x`` is an exact row copy on the CPU that cannot raise."""
    import torch

    if not all(torch.is_tensor(t) and t.device.type == "cpu" for t in (x, cache, indices)):
        return False
    if indices.dtype != torch.int64 or indices.dim() != 1 or cache.dim() < 1 or x.dtype != cache.dtype:
        return False
    n, rows = indices.numel(), cache.shape[0]
    if tuple(x.shape) != (n, *cache.shape[1:]):
        return False
    return n == 0 or (int(indices.min()) >= -rows and int(indices.max()) < rows)
