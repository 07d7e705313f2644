"""What differs between sglang releases 0.5.10-0.5.23, in one place: how to drive a release's *own*
modules (never another release's file spliced into the installed package).

Feature probes say which audit path a release lacks (:func:`absent_reason`); adapters absorb what
moved or was renamed (line numbers are in that release's own files):

* ``runtime_context.get_parallel`` exists from 0.5.14; before it the backend calls
  ``dp_attention.get_attention_tp_size()`` (0.5.10 flashinfer_backend.py:28, :145), set to 1 as
  0.5.13's kit does (dense_attention.py:24); ``attn_dcp_size`` joins in 0.5.19 (runtime_context.py:117);
* ``SGLANG_FLASHINFER_USE_PAGED`` is absent in 0.5.10 (environ.py): the paged-only prefill is
  reached by deterministic inference there (``use_ragged = not enable_deterministic``, :488-490);
* ``forward_context`` is absent <= 0.5.12: ``RadixAttention.forward`` reads
  ``forward_batch.attn_backend`` (:func:`attach`);
* ``sgl_kernel`` cannot load without libcuda; 0.5.10 imports it on the KV write
  (memory_pool_host.py:47): a placeholder package (:func:`ensure_sgl_kernel`);
* the Triton kv-indices kernel is bound by name in several modules, and 0.5.23 moved it and changed
  its signature (kernels/ops/attention/kv_indices.py:59-74): the torch port
  (``harness.TorchKvIndices``) goes into every loaded ``sglang*`` module that binds it;
* 0.5.10 calls ``flashinfer.cascade.merge_state`` by name (:58, :862); ``fast_prefill_plan``
  (0.5.14+, 0.5.23 :180) re-plans a captured wrapper without re-picking its module;
* ``EagleVerifyInput`` spells ``retrive_*`` in 0.5.10 (speculative/eagle_info.py:59-62);
  ``NgramVerifyInput`` takes ``tree_mask`` and required ``retrieve_*`` up to 0.5.13.post1
  (0.5.13 ngram_info.py:52-60; ``custom_mask`` with defaults from 0.5.14, ngram_info.py:14-22).

The runner and forward-batch differences (test kit or none) are in ``releases_kit``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
import traceback
import types
from pathlib import Path

from swa_repro.sglang import harness


# ----------------------------------------------------------------------------- feature probes
def has_dflash() -> bool:
    """Whether this sglang has DFlash speculative verify (``SpecInputType.DFLASH_VERIFY``)."""
    try:
        from sglang.srt.speculative.spec_info import SpecInputType  # lazy: sglang is heavy and optional
    except ImportError:
        return False
    return hasattr(SpecInputType, "DFLASH_VERIFY") and importlib.util.find_spec(
        "sglang.srt.speculative.dflash_info") is not None


def has_ngram() -> bool:
    """Whether this sglang has NGRAM speculative verify (``SpecInputType.NGRAM_VERIFY``,
    ``speculative/ngram_info.py``)."""
    try:
        from sglang.srt.speculative.spec_info import SpecInputType  # lazy: sglang is heavy and optional
    except ImportError:
        return False
    return hasattr(SpecInputType, "NGRAM_VERIFY") and importlib.util.find_spec(
        "sglang.srt.speculative.ngram_info") is not None


def preload_spec_input(path: str) -> None:
    """Import a verify path's input module before the audit's environment is entered, so the
    kv-indices port reaches the Triton kernel it binds by name (0.5.14 ngram_info.py:8)."""
    if "ngram" in path:
        importlib.import_module("sglang.srt.speculative.ngram_info")


def has_full_prefill_graph(fb) -> bool:
    """Full prefill CUDA graph (plain EXTEND captured on dedicated wrappers): 0.5.15+
    (``_create_full_cg_prefill_wrappers``, 0.5.15.post1 :1085-1092); before, capture raises
    ``Invalid mode`` for EXTEND (0.5.14 :946)."""
    return hasattr(fb.FlashInferAttnBackend, "_create_full_cg_prefill_wrappers")


def has_paged_switch() -> bool:
    """``SGLANG_FLASHINFER_USE_PAGED`` exists (0.5.11+)."""
    from sglang.srt.environ import envs

    return hasattr(envs, "SGLANG_FLASHINFER_USE_PAGED")


def absent_reason(path: str, fb) -> str | None:
    """Why this release has no such path at all (None: it has)."""
    if path == "target_verify_dflash" and not has_dflash():
        return "no DFlash verify in this release (SpecInputType.DFLASH_VERIFY)"
    if "ngram" in path and not has_ngram():
        return "no NGRAM verify in this release (SpecInputType.NGRAM_VERIFY)"
    if path == "cuda_graph_extend" and not has_full_prefill_graph(fb):
        return "no full prefill CUDA graph in this release (FlashInferAttnBackend._create_full_cg_prefill_wrappers)"
    return None


def explain_error(e: BaseException) -> tuple[str, str]:
    """``(kind, why)`` of an exception while driving a path: ``sglang raised`` when the innermost
    Python frame of sglang or this package is sglang's (the release's own code fails there),
    else ``harness`` (this package could not drive it)."""
    import sglang

    root = str(Path(sglang.__file__).parent)
    mine = str(Path(__file__).parents[1])
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith((root, mine))]
    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if not frames:
        return "harness", msg
    f = frames[-1]
    if f.filename.startswith(root):
        rel = Path(f.filename).relative_to(Path(root).parent)
        return "sglang raised", f"{msg} (raised in the release's own {rel}:{f.lineno}{_in_transformers(e)})"
    return "harness", f"{msg} (at {Path(f.filename).name}:{f.lineno})"


def _in_transformers(e: BaseException) -> str:
    """``, in transformers' models/x/modeling_x.py:12``: the innermost frame of transformers' below the
    release's last (the Transformers fallback builds transformers' model inside the release's call), else ``""``."""
    import transformers

    root = Path(transformers.__file__).parent
    tb = traceback.extract_tb(e.__traceback__)
    ours = [i for i, f in enumerate(tb) if "/sglang/" in f.filename]
    deeper = [f for f in tb[ours[-1] + 1 if ours else 0:] if f.filename.startswith(str(root))]
    if not deeper:
        return ""
    f = deeper[-1]
    return f", in transformers {transformers.__version__}'s {Path(f.filename).relative_to(root)}:{f.lineno}"


# ----------------------------------------------------------------------------- what a release reads
def newer_release_attrs(runner) -> None:
    """Attributes sglang >= 0.5.16's backend reads that an older runner lacks: a KV-cache quant
    method with no special access (plain bf16 KV), the server's attention backends, the page size.
    Set only where missing; a frozen ``ServerArgs`` (0.5.19+) is the kit's and complete."""
    quant = types.SimpleNamespace(resolve_attention_access=lambda phase, backend: None,
                                  needs_global_scale=lambda: False, name="none",
                                  describe_attention_accesses=lambda phase: [])
    pool = runner.token_to_kv_pool
    if not hasattr(pool, "get_kv_cache_quant_method"):
        pool.get_kv_cache_quant_method = lambda: quant
    if not hasattr(runner.server_args, "get_attention_backends"):
        with contextlib.suppress(TypeError, AttributeError):
            object.__setattr__(runner.server_args, "get_attention_backends", lambda: (None, None))
    if not hasattr(runner, "page_size"):
        runner.page_size = runner.token_to_kv_pool.page_size


def spec_info_defaults(spec_info, draft: int) -> None:
    """Verify-input attributes sglang >= 0.5.16 reads (tokens per request, ragged verify layout);
    set only where missing."""
    for attr, value in (("num_tokens_per_req", draft), ("ragged_verify_layout", None)):
        if not hasattr(spec_info, attr):
            setattr(spec_info, attr, value)


# The audit's field name -> the older spelling a release's verify input takes.
_OLD_NAMES = {"custom_mask": "tree_mask"}  # NgramVerifyInput <= 0.5.13.post1 (0.5.13 ngram_info.py:52-60)


def build(cls, **kw):
    """``cls(**kw)`` with the audit's field names mapped to the release's (``retrieve_*`` ->
    ``retrive_*`` in 0.5.10, eagle_info.py:59-62 and ngram_info.py:57-59; ``custom_mask`` ->
    ``tree_mask`` in NgramVerifyInput up to 0.5.13.post1, 0.5.13 ngram_info.py:55, required
    positionals there); names the release lacks are dropped."""
    params = set(inspect.signature(cls).parameters)
    out = {}
    for k, v in kw.items():
        alt = _OLD_NAMES.get(k) or k.replace("retrieve_", "retrive_")
        if k in params or alt in params:
            out[k if k in params else alt] = v
    return cls(**out)


def graph_metadata(backend, batch, bs: int, n: int):
    """``(capture, replay)``: the CUDA-graph metadata calls this release has, on the same wrappers:
    ``init_forward_metadata_out_graph(in_capture=True / False)`` (0.5.15.post1 :646), or on older
    releases ``init_forward_metadata_capture_cuda_graph`` / ``..._replay_cuda_graph``."""
    if hasattr(backend, "init_forward_metadata_out_graph"):
        return (lambda: backend.init_forward_metadata_out_graph(batch, in_capture=True),
                lambda: backend.init_forward_metadata_out_graph(batch, in_capture=False))
    if hasattr(backend, "init_forward_metadata_capture_cuda_graph"):
        return (lambda: backend.init_forward_metadata_capture_cuda_graph(
                    bs, n, batch.req_pool_indices, batch.seq_lens, None, batch.forward_mode, batch.spec_info),
                lambda: backend.init_forward_metadata_replay_cuda_graph(
                    bs, batch.req_pool_indices, batch.seq_lens, int(batch.seq_lens.sum()), None,
                    batch.forward_mode, batch.spec_info, batch.seq_lens_cpu))
    raise NotImplementedError("this release has no CUDA-graph metadata methods the audit knows")


def attach(backend, batch):
    """Make ``backend`` the one ``RadixAttention.forward`` uses: ``forward_context`` (0.5.13+) or,
    before it existed, ``forward_batch.attn_backend`` (0.5.10 radix_attention.py)."""
    try:
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    except ImportError:
        batch.attn_backend = backend
        return contextlib.nullcontext()
    return forward_context(ForwardContext(attn_backend=backend))


# ----------------------------------------------------------------------------- CUDA-only pieces
class Missing:
    """A name from a CUDA-only extension this host cannot load; raises if actually called."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *a, **kw):
        raise NotImplementedError(f"{self.name}: CUDA-only (sgl_kernel placeholder on CPU)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self.name}.{attr}")


class _SglKernelPlaceholder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sgl_kernel`` and its submodules as placeholders whose names raise when called."""

    def find_spec(self, name, path=None, target=None):
        if name == "sgl_kernel" or name.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []

        def attr(name, _n=spec.name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Missing(f"{_n}.{name}")
        m.__getattr__ = attr
        return m

    def exec_module(self, module):
        pass


def ensure_sgl_kernel() -> str:
    """``real`` when ``sgl_kernel`` imports, else install the placeholder (``placeholder``)."""
    if any(isinstance(f, _SglKernelPlaceholder) for f in sys.meta_path):
        return "placeholder"
    try:
        import sgl_kernel  # noqa: F401
        return "real"
    except Exception:  # no libcuda: OSError / ImportError from its loader
        for k in [k for k in sys.modules if k == "sgl_kernel" or k.startswith("sgl_kernel.")]:
            del sys.modules[k]
        sys.meta_path.insert(0, _SglKernelPlaceholder())
        return "placeholder"


def fast_prefill_plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                      num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, causal=False,
                      window_left=-1, **rest):
    """sglang's ``fast_prefill_plan`` (0.5.23 flashinfer_backend.py:180): re-plans a captured
    wrapper through ``_cached_module.plan`` without re-picking the module; stores the window."""
    self._window_left = window_left


@contextlib.contextmanager
def kv_indices_everywhere():
    """The torch kv-indices port in every loaded sglang module that bound the Triton kernel by name
    (backend, eagle_info, dflash_info, 0.5.23 mem_cache/kv_index_translator.py:70); restored on exit."""
    port = harness.TorchKvIndices()
    with contextlib.ExitStack() as st:
        for mod in _kernel_binders():
            st.enter_context(harness._namespace(mod, {"create_flashinfer_kv_indices_triton": port}))
        yield


_BINDERS: dict = {}


def _kernel_binders() -> list:
    """The loaded ``sglang*`` modules that bind the Triton kernel by name; the scan of every module
    (~15 ms with a release's model registry loaded) is redone only when a module was imported since
    (what a module binds at import stays bound: the port is put in and taken out per use)."""
    n = len(sys.modules)
    if n not in _BINDERS:
        _BINDERS.clear()
        _BINDERS[n] = [mod for name, mod in list(sys.modules.items())
                       if name.startswith("sglang") and mod is not None and
                       mod.__dict__.get("create_flashinfer_kv_indices_triton") is not None]
    return _BINDERS[n]


@contextlib.contextmanager
def release_env(fb, *, use_paged: bool, kv_indices_port: bool = True):
    """The switches around a release's backend, restored on exit: the paged-only flag where it
    exists, the workspace size, single-rank parallel sizes, the kv-indices port everywhere (CPU
    hosts; on a GPU sglang's own Triton kernel runs)."""
    from sglang.srt.environ import envs

    with contextlib.ExitStack() as st:
        if has_paged_switch():
            st.enter_context(envs.SGLANG_FLASHINFER_USE_PAGED.override(use_paged))
        ws = envs.SGLANG_FLASHINFER_WORKSPACE_SIZE
        st.enter_context(ws.override(ws.get()))  # deterministic __init__ .set()s it (0.5.15.post1 :381)
        try:
            from sglang.srt import runtime_context as rc
        except ImportError:
            rc = None
        if rc is None or not hasattr(rc, "get_parallel"):
            from sglang.srt.layers import dp_attention

            for m in (fb, dp_attention):
                if hasattr(m, "get_attention_tp_size"):
                    st.enter_context(harness._namespace(m, {"get_attention_tp_size": lambda: 1}))
        else:
            known = getattr(rc, "_PARALLEL_FIELDS", ("attn_tp_size", "attn_cp_size"))
            sizes = [k for k in ("attn_tp_size", "attn_cp_size", "attn_dcp_size") if k in known]
            st.enter_context(rc.get_parallel().override(**dict.fromkeys(sizes, 1)))
        if kv_indices_port:
            st.enter_context(kv_indices_everywhere())
        yield
