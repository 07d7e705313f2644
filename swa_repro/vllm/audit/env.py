"""Recording FlashInfer stand-ins for vLLM's backend: a ``flashinfer`` package put into
``sys.modules`` before the release imports it (the child only; nothing installed changes).

vLLM 0.34.0 imports from ``flashinfer`` names the venv's flashinfer 0.6.12 lacks (e.g.
``nvfp4_quantize_append_paged_kv_cache_with_slot_mapping``; it pins flashinfer 0.7.3), so the
whole package is a stand-in, not a patch of the installed one:

* the three wrapper classes are the audits' stand-ins (``engine.standins``: flashinfer
  0.6.12's call contract from ``kernel.signatures``, zero outputs, a paged ``run()`` asserts its
  window equals the planned one), subclassed to record every ``plan``/``run`` with its arguments
  bound to flashinfer's parameter names;
* the functions vLLM calls directly (``trtllm_batch_decode_with_kv_cache``,
  ``trtllm_batch_context_with_kv_cache``, ``fast_decode_plan``, ...) record their keyword
  arguments and return zeros shaped like the query;
* any other name resolves to a recorder too, so an unexpected kernel call shows up in the record
  under its own name instead of failing the import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import sys
import types

import torch

from swa_repro.engine.standins import DecodeStandIn, PagedStandIn, RaggedStandIn

class SinkStandIn(PagedStandIn):
    """flashinfer's ``BatchAttentionWithAttentionSinkWrapper`` (``attention/_core.py:218``, a
    subclass of the paged prefill wrapper): its constructor's ``window_left`` picks the compiled
    variant (``use_sliding_window: window_left >= 0``, :276), and ``run`` takes the sinks and the
    softmax scale as extra positional arguments (the ``AttentionSink`` variant's ``sink`` and
    ``sm_scale``)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", pos_encoding_mode="NONE",
                 use_fp16_qk_reduction=False, q_data_type=None, kv_data_type=None, head_dim_qk=128,
                 head_dim_vo=128, window_left=-1):
        self._jit_window_left = window_left
        PagedStandIn.__init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, paged_kv_indptr_buf,
                         paged_kv_indices_buf, paged_kv_last_page_len_buf, custom_mask_buf, mask_indptr_buf, backend)

    def run(self, q, paged_kv_cache, *extra, **kw):
        return PagedStandIn.run(self, q, paged_kv_cache, **kw)


WRAPPERS = {"BatchPrefillWithPagedKVCacheWrapper": PagedStandIn,
            "BatchPrefillWithRaggedKVCacheWrapper": RaggedStandIn,
            "BatchDecodeWithPagedKVCacheWrapper": DecodeStandIn}
# what a recorded call keeps: these arguments by value, tensors by shape
ASKED = ("window_left", "logits_soft_cap", "sm_scale", "sinks", "causal", "bmm1_scale", "bmm2_scale",
         "backend", "q_data_type", "kv_data_type", "o_data_type", "kv_layout", "page_size", "num_qo_heads",
         "num_kv_heads", "head_dim", "head_dim_qk", "max_seq_len", "max_q_len", "use_cuda_graph")


def summarize(v):
    """A value as JSON: tensors as ``{"shape", "dtype"}`` (small int tensors also by value)."""
    if isinstance(v, torch.Tensor):
        d = {"shape": list(v.shape), "dtype": str(v.dtype)}
        if v.dtype in (torch.int32, torch.int64) and v.numel() <= 64:
            d["values"] = v.flatten().tolist()
        return d
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [summarize(x) for x in v[:64]]
    return type(v).__name__


class Recorder:
    """Every stand-in call, in order: ``{"target", "method", "wrapper", "args"}``."""

    def __init__(self):
        self.calls: list[dict] = []
        self.next_id = 0

    def add(self, target: str, method: str, args: dict, wrapper: int | None = None) -> None:
        self.calls.append({"target": target, "method": method, "wrapper": wrapper,
                           "args": {k: summarize(v) for k, v in args.items()}})


def _bound(fn, args, kwargs) -> dict:
    try:
        b = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError:
        return {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
    out = dict(b.arguments)
    out.pop("self", None)
    out.update(out.pop("newer", {}) or {})
    return out


def trtllm_gen_refuses_cap(name: str):
    """A wrapper whose backend is ``trtllm-gen`` refuses a soft cap at ``plan``, as flashinfer's do
    (the paged prefill wrapper raises, 0.6.12 prefill.py:2047-2048, 0.7.2.post1 :3710-3712; the decode
    wrapper asserts, 0.6.12 decode.py:1016, 0.7.2.post1 :2316): vLLM uses that backend inside its
    wrappers for an NVFP4 cache on sm100."""
    if "Decode" in name:
        raise AssertionError("logits_soft_cap == 0.0 (flashinfer's trtllm-gen decode wrapper)")
    raise ValueError("logits_soft_cap must be 0.0 for trtllm-gen paged KV cache")


def recording_wrapper(name: str, base: type, rec: Recorder, parent: type | None = None) -> type:
    """``base`` whose constructor, ``plan`` and ``run`` are recorded into ``rec`` (a real class:
    vLLM annotates and ``isinstance``-checks its wrappers); ``parent``: the class it derives from
    instead of ``base`` (the sink wrapper is flashinfer's paged prefill wrapper's subclass), whose
    methods it does not call."""

    class Recording(parent or base):
        def __init__(self, *a, **kw):
            self._wid = rec.next_id
            rec.next_id += 1
            rec.add(name, "__init__", _bound(base.__init__, (self, *a), kw), self._wid)
            base.__init__(self, *a, **kw)

        def plan(self, *a, **kw):
            rec.add(name, "plan", _bound(base.plan, (self, *a), kw), self._wid)
            out = base.plan(self, *a, **kw)
            if self._logits_soft_cap is None:  # flashinfer 0.6.12 prefill.py:1877-1878 (plan stores 0.0)
                self._logits_soft_cap = 0.0
            if getattr(self, "_backend", None) == "trtllm-gen" and self._logits_soft_cap:
                trtllm_gen_refuses_cap(name)
            # the module, picked here only (prefill.py:2035, decode.py:1054-1055): a later
            # fast_decode_plan sets the window and cap but never re-picks it (0.7.2 decode.py:5055-5057)
            self._module = (self._window_left >= 0, self._logits_soft_cap > 0)
            return out

        def run(self, *a, **kw):
            extra = {"jit_window_left": self._jit_window_left, "sinks": a[2], "sink_sm_scale": a[3]} \
                if hasattr(self, "_jit_window_left") and len(a) >= 4 else {}
            window, cap = getattr(self, "_module", (True, True))
            rec.add(name, "run", {**_bound(base.run, (self, *a), kw), **extra,
                                  "planned_window_left": self._window_left,
                                  "planned_logits_soft_cap": self._logits_soft_cap,
                                  "planned_sm_scale": self._sm_scale,
                                  "module_window": window, "module_cap": cap}, self._wid)
            return base.run(self, *a, **kw)

    Recording.__name__ = Recording.__qualname__ = name
    return Recording


def recording_function(name: str, rec: Recorder, impl=None):
    """A kernel function called directly: records its arguments; returns ``impl``'s output (a
    model of the kernel: ``live_kernels``), else writes zeros into ``out``."""

    def fn(*a, **kw):
        rec.add(name, "call", {**{f"arg{i}": x for i, x in enumerate(a)}, **kw})
        if impl is not None:
            return impl(*a, **kw)
        out = kw.get("out")
        if isinstance(out, torch.Tensor):
            out.zero_()
            return out
        q = kw.get("query", a[0] if a and isinstance(a[0], torch.Tensor) else None)
        return torch.zeros_like(q) if isinstance(q, torch.Tensor) else None

    fn.__name__ = name
    return fn


def fast_decode_plan(rec: Recorder):
    """flashinfer's ``fast_decode_plan(wrapper, ...)``: re-plans a CUDA-graph decode wrapper; the
    stand-in stores the window, cap (``None`` as 0.0) and scale it is given, as flashinfer's does
    (0.7.2 decode.py:4914-4915, :5055-5057), and keeps the module the wrapper's ``plan`` picked."""

    def fn(self, *a, **kw):
        args = _bound(DecodeStandIn.plan, (self, *a), kw)
        rec.add("fast_decode_plan", "call", args, getattr(self, "_wid", None))
        if args.get("logits_soft_cap") is None:
            args["logits_soft_cap"] = 0.0
        for n in ("window_left", "logits_soft_cap", "sm_scale"):
            if n in args:
                setattr(self, f"_{n}", args[n])
        self._planned = True

    return fn


class StandInModule(types.ModuleType):
    """A ``flashinfer`` (sub)module: known names as given, any other a recorder by that name
    (classes with a capitalised name, so ``isinstance`` and annotations keep working)."""

    def __init__(self, name: str, rec: Recorder, names: dict):
        super().__init__(name)
        self.__path__ = []  # a package: ``flashinfer.x.y`` imports resolve through the finder
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        self.__version__ = "0.0.0+swa-repro-standin"
        self._rec = rec
        self.__dict__.update(names)

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr[:1].isupper():
            val = type(attr, (), {"__init__": lambda s, *a, **k: self._rec.add(attr, "__init__", k)})
        else:
            val = recording_function(attr, self._rec)
        setattr(self, attr, val)
        return val


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, rec: Recorder):
        self.rec = rec

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "flashinfer" or fullname.startswith("flashinfer."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return sys.modules.get(spec.name) or StandInModule(spec.name, self.rec, {})

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


def install(rec: Recorder, wrappers: dict | None = None, functions: dict | None = None) -> dict:
    """Put the stand-in ``flashinfer`` first (any installed one is dropped from ``sys.modules``):
    -> the names of the stand-ins vLLM's backend binds. ``wrappers`` (name -> base class) and
    ``functions`` (name -> implementation) replace the zero-output ones (``live_kernels``' model)."""
    for k in [k for k in sys.modules if k == "flashinfer" or k.startswith("flashinfer.")]:
        del sys.modules[k]
    bases = {**WRAPPERS, **(wrappers or {})}
    wrappers = {n: recording_wrapper(n, base, rec) for n, base in bases.items()}
    sink = "BatchAttentionWithAttentionSinkWrapper"
    wrappers[sink] = recording_wrapper(sink, SinkStandIn, rec, wrappers["BatchPrefillWithPagedKVCacheWrapper"])
    root = StandInModule("flashinfer", rec, dict(wrappers))
    sys.modules["flashinfer"] = root
    for sub in ("decode", "prefill", "utils", "cascade"):
        m = StandInModule(f"flashinfer.{sub}", rec, dict(wrappers))
        sys.modules[m.__name__] = m
        setattr(root, sub, m)
    sys.modules["flashinfer.decode"].fast_decode_plan = fast_decode_plan(rec)
    for n, impl in (functions or {}).items():  # every submodule that could bind it
        for m in (root, *(sys.modules[f"flashinfer.{s}"] for s in ("decode", "prefill"))):
            setattr(m, n, recording_function(n, rec, impl))
    utils = sys.modules["flashinfer.utils"]
    utils.get_device_sm_count = lambda device=None: 132  # an H200's SMs, as the sglang audit reports
    utils.get_trtllm_gen_multi_ctas_kv_counter_bytes = lambda *a, **k: 4096  # a buffer size, not a kernel
    sys.meta_path.insert(0, _Finder(rec))
    return wrappers
