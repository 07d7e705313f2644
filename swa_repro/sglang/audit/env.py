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
  kv-indices kernel by its torch port. On a GPU host sglang's own torch and Triton kernel run.
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
    with harness._namespace(fb, names), releases.release_env(fb, use_paged=use_paged, kv_indices_port=on_cpu):
        yield
