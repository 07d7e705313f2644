"""Drive every path of sglang's FlashInfer backend that plans a prefill or decode wrapper, on CPU,
with recording stand-ins for the three FlashInfer wrapper classes.

What runs is sglang's own code (``FlashInferAttnBackend``, its indices updaters, ``forward_extend``
/ ``forward_decode``, the CUDA-graph metadata methods, EAGLE's and DFlash's
``generate_attn_arg_prefill``). Built on the harness (``sglang_harness.sglang_env``,
``model_runner``, ``_inputs``, ``TorchKvIndices``) and recorded by ``trace.record_class``.
Replaced, inside :func:`audit_env` only and restored on exit, are FlashInfer and CUDA pieces:

* the wrapper classes, by :class:`PagedStandIn` / :class:`RaggedStandIn` / :class:`DecodeStandIn`:
  flashinfer 0.6.12's call contract (signatures and the plan/forward/run state rules, cited per
  method) with zero outputs. The audit reads the *calls*, never these outputs;
* flashinfer's ``fast_decode_plan`` (decode.py:2898) and ``merge_state`` (sglang's
  ``_safe_merge_state``, :105), absent without flashinfer;
* the Triton kv-indices kernel (also inside EAGLE's / DFlash's spec-info modules);
* ``torch`` *as the backend module sees it*: ``device="cuda"`` buffers (decode's kv indices,
  :1500; ``init_cuda_graph_state``, :860) land on the CPU and ``torch.cuda.get_device_properties``
  reports an H200's 132 SMs.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

from swa_repro.core.errors import UsageError
from swa_repro.sglang import harness
from swa_repro.core.case import Case
from swa_repro.sglang.trace import Trace, record_class

PAGED, RAGGED, DECODE = harness.WRAPPER_NAMES


# ----------------------------------------------------------------------------- flashinfer stand-ins
class _StandIn:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, *, backend="auto"):
        self._float_workspace_buffer = float_workspace_buffer
        self._kv_layout, self._use_cuda_graph, self._backend = kv_layout, bool(use_cuda_graph), backend
        self.device = float_workspace_buffer.device
        self._window_left, self._logits_soft_cap, self._planned = -1, None, False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def _store(self, window_left, logits_soft_cap, sm_scale=None):
        self._window_left, self._logits_soft_cap, self._sm_scale = window_left, logits_soft_cap, sm_scale

    def _out(self, q, heads_dim, return_lse):
        o = torch.zeros(q.shape[0], q.shape[1], heads_dim, dtype=q.dtype, device=q.device)
        return (o, torch.zeros(q.shape[0], q.shape[1], dtype=torch.float32)) if return_lse else o


class PagedStandIn(_StandIn):
    """``BatchPrefillWithPagedKVCacheWrapper`` (prefill.py:1515 ctor, plan :1711, forward :2117 and
    forward_return_lse :2507 overwrite the window and cap, run :2184 asserts the window :2317)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend=backend)
        self._paged_kv_indices_buf, self._custom_mask_buf = paged_kv_indices_buf, custom_mask_buf

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
             window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None,
             seq_lens_q=None, block_tables=None, max_token_per_sequence=None, max_sequence_kv=None,
             fixed_split_size=None, disable_split_kv=False):
        self._head_dim_vo = head_dim_vo or head_dim_qk
        self._causal = causal
        self._store(window_left, logits_soft_cap, sm_scale)
        self._planned = True

    begin_forward = plan

    def forward(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                rope_theta=None):
        self._causal = causal
        self._store(window_left, logits_soft_cap, sm_scale)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
                           use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1,
                           logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._causal = causal
        self._store(window_left, logits_soft_cap, sm_scale)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, kv_cache_sf=None,
            skip_softmax_threshold_scale_factor=None):
        assert self._planned, "plan info is not initialized"
        window_left = self._window_left if window_left is None else window_left
        assert window_left == self._window_left  # prefill.py:2317
        return self._out(q, self._head_dim_vo, return_lse)


class RaggedStandIn(_StandIn):
    """``BatchPrefillWithRaggedKVCacheWrapper`` (ctor :2644, plan :2801, forward :3188,
    forward_return_lse :3527; run :3246 reads ``self._window_left`` without an assert, :3324)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None,
                 jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend=backend)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
             fixed_split_size=None, disable_split_kv=False, **newer):
        self._head_dim_vo = head_dim_vo or head_dim_qk
        self._store(window_left, logits_soft_cap, sm_scale)
        self._planned = True

    begin_forward = plan

    def forward(self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._store(window_left, logits_soft_cap, sm_scale)
        return self.run(q, k, v)

    def forward_return_lse(self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                           window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._store(window_left, logits_soft_cap, sm_scale)
        return self.run(q, k, v, return_lse=True)

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, **newer):
        assert self._planned, "plan info is not initialized"
        return self._out(q, self._head_dim_vo, return_lse)


class DecodeStandIn(_StandIn):
    """``BatchDecodeWithPagedKVCacheWrapper`` (ctor :675, plan :841 picks the module from
    ``window_left >= 0`` / ``logits_soft_cap > 0`` at :1054-1055, forward :1160, run asserts :1368)."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, jit_kwargs=None):
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend=backend)
        self._paged_kv_indices_buf = paged_kv_indices_buffer

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
             non_blocking=True, fixed_split_size=None, disable_split_kv=False, o_data_type=None,
             global_override_indptr_cpu=None, **newer):
        self._head_dim = head_dim
        self._store(window_left, logits_soft_cap, sm_scale)
        self._planned = True

    begin_forward = plan

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None, v_scale=None,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        self._store(window_left, logits_soft_cap, sm_scale)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, **newer):
        assert self._planned, "plan info is not initialized"
        window_left = self._window_left if window_left is None else window_left
        assert window_left == self._window_left  # decode.py:1368
        return self._out(q, self._head_dim, return_lse)


STAND_INS = {PAGED: PagedStandIn, RAGGED: RaggedStandIn, DECODE: DecodeStandIn}


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                     pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
                     kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
                     non_blocking=True, fixed_split_size=None, disable_split_kv=False,
                     global_override_indptr_cpu=None, **newer):
    """flashinfer decode.py:2898: re-plans the captured wrapper *without* re-picking its module;
    stores the window and cap it is given (:3062-3063)."""
    self._store(window_left, logits_soft_cap, sm_scale)


def merge_state(v_a, s_a, v_b, s_b):
    """flashinfer.cascade.merge_state (base-2 log-sum-exp merge of two partial attentions)."""
    m = torch.maximum(s_a, s_b)
    wa, wb = torch.exp2(s_a - m), torch.exp2(s_b - m)
    v = (v_a.float() * wa[..., None] + v_b.float() * wb[..., None]) / (wa + wb)[..., None]
    return v.to(v_a.dtype), m + torch.log2(wa + wb)


class _CpuTorch(types.ModuleType):
    """``torch`` for the backend module: ``device="cuda"`` -> CPU, and an
    H200's SM count for ``_full_cg_prefill_workspace_bytes`` (:968)."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(
            get_device_properties=lambda d=None: types.SimpleNamespace(multi_processor_count=132),
            is_available=lambda: False)

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name in ("zeros", "empty", "ones", "full", "arange", "tensor"):
            def on_cpu(*a, **kw):
                if str(kw.get("device", "")).startswith("cuda"):
                    kw["device"] = "cpu"
                return attr(*a, **kw)
            return on_cpu
        return attr


# ----------------------------------------------------------------------------- foreign releases
@contextlib.contextmanager
def backend_source(path: Path | None):
    """Load another release's ``flashinfer_backend.py`` as the backend module (restored on exit).

    A newer file imports names the installed sglang does not have; those resolve to stand-ins
    (``get_buffer``: build the buffer; others: found by name in the installed sglang, else a
    placeholder that raises when used) and the runner gets the few attributes such a file asks
    for (see :func:`_newer_release_attrs`). Nothing on disk changes.
    """
    if path is None:
        yield harness.backend_module()
        return
    path = Path(path)
    if not path.is_file():

        raise UsageError(f"--sglang-source {path}: no such file (give a flashinfer_backend.py)")
    harness.backend_module()  # the installed one first: its imports populate sys.modules
    mod = types.ModuleType(harness.MODULE)
    mod.__file__ = str(path)
    mod.__package__ = harness.MODULE.rpartition(".")[0]
    mod.__dict__["__builtins__"] = dict(builtins.__dict__, __import__=_compat_import)
    saved = sys.modules[harness.MODULE]
    sys.modules[harness.MODULE] = mod
    try:
        exec(compile(path.read_text(), str(path), "exec"), mod.__dict__)
        yield mod
    finally:
        sys.modules[harness.MODULE] = saved


_ELSEWHERE = ("sglang.srt.layers.attention.utils", "sglang.srt.layers.attention.triton_ops.merge_state")


class Missing:
    """A name a newer release imports that this sglang lacks; raises if the audited path uses it."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *a, **kw):
        raise NotImplementedError(f"{self.name} is not in the installed sglang; this path needs it")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Missing(f"{self.name}.{attr}")


def _get_buffer(name, factory):
    """sglang >= 0.5.16 ``runtime_context.get_buffer``: a named, cached buffer; here, a fresh one."""
    return factory()


def _compat_import(name, globals=None, locals=None, fromlist=(), level=0):
    try:
        module = importlib.__import__(name, globals, locals, fromlist, level)
    except ModuleNotFoundError:
        if not name.startswith("sglang."):
            raise
        module = types.ModuleType(name)
    if not fromlist or not name.startswith("sglang."):
        return module  # a missing non-sglang name raises ImportError as usual (callers catch it)
    missing = [n for n in fromlist if not hasattr(module, n)]
    if not missing:
        return module
    proxy = types.ModuleType(module.__name__)
    proxy.__dict__.update(module.__dict__)
    for n in missing:
        proxy.__dict__[n] = _get_buffer if n == "get_buffer" else _find_elsewhere(n)
    return proxy


def _find_elsewhere(n):
    for m in _ELSEWHERE:
        try:
            mod = importlib.import_module(m)
        except ImportError:
            continue
        if hasattr(mod, n):
            return getattr(mod, n)
    return Missing(n)


def _newer_release_attrs(runner) -> None:
    """Attributes sglang >= 0.5.16's backend reads that 0.5.15.post1's objects lack: a KV-cache
    quant method with no special access (plain bf16 KV), the server's attention backends, and the
    runner's page size. Set only where missing."""
    quant = types.SimpleNamespace(resolve_attention_access=lambda phase, backend: None,
                                  needs_global_scale=lambda: False, name="none",
                                  describe_attention_accesses=lambda phase: [])
    pool = runner.token_to_kv_pool
    if not hasattr(pool, "get_kv_cache_quant_method"):
        pool.get_kv_cache_quant_method = lambda: quant
    if not hasattr(runner.server_args, "get_attention_backends"):
        object.__setattr__(runner.server_args, "get_attention_backends", lambda: (None, None))
    if not hasattr(runner, "page_size"):
        runner.page_size = runner.token_to_kv_pool.page_size


# ----------------------------------------------------------------------------- one layer configuration
@dataclass(frozen=True)
class LayerConfig:
    """One attention layer: window (``-1`` none) and soft cap (``0`` none)."""
    window_left: int
    logit_cap: float

    @property
    def name(self) -> str:
        return f"{'swa' if self.window_left >= 0 else 'full'}{'' if self.window_left < 0 else self.window_left}" \
               f"{'_cap' + format(self.logit_cap, 'g') if self.logit_cap else ''}"


LAYER_CONFIGS = (LayerConfig(8, 0.0), LayerConfig(8, 50.0), LayerConfig(-1, 50.0), LayerConfig(-1, 0.0))
HEADS = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=1)  # sglang plans page size 1


@dataclass
class PathRun:
    path: str
    layer: LayerConfig
    trace: Trace
    layer_window: int
    layer_cap: float
    graph_stage: dict = field(default_factory=dict)  # call index -> "capture" | "replay"
    error: str | None = None  # a path this release cannot drive, with why


@contextlib.contextmanager
def audit_env(trace: Trace, fb, *, use_paged: bool):
    """harness.sglang_env plus the audit's stand-ins (restored on exit)."""
    from sglang.srt.environ import envs

    with contextlib.ExitStack() as st:
        st.enter_context(harness.sglang_env("model", trace, route="paged"))
        names = {n: record_class(cls, trace, n) for n, cls in STAND_INS.items()}
        names.update(fast_decode_plan=fast_decode_plan, _safe_merge_state=merge_state,
                     create_flashinfer_kv_indices_triton=harness.TorchKvIndices(), torch=_CpuTorch())
        st.enter_context(harness._namespace(fb, names))
        for m in ("sglang.srt.speculative.eagle_info", "sglang.srt.speculative.dflash_info"):
            with contextlib.suppress(ImportError):
                st.enter_context(harness._namespace(importlib.import_module(m),
                                                    {"create_flashinfer_kv_indices_triton": harness.TorchKvIndices()}))
        st.enter_context(envs.SGLANG_FLASHINFER_USE_PAGED.override(use_paged))
        yield


def _case(cfg: LayerConfig, prefix_lens, extend_lens) -> Case:
    return Case(prefix_lens=tuple(prefix_lens), extend_lens=tuple(extend_lens), window_left=cfg.window_left,
                name=f"audit_{cfg.name}", **HEADS)


def _setup(fb, case: Case, cfg: LayerConfig, max_ctx: int):
    from sglang.srt.layers.radix_attention import RadixAttention

    runner = harness.model_runner(case, dtype=torch.bfloat16, device="cpu", route="paged", max_context_len=max_ctx)
    runner.sliding_window_size = cfg.window_left if cfg.window_left >= 0 else None
    _newer_release_attrs(runner)
    backend = fb.FlashInferAttnBackend(runner)
    layer = RadixAttention(case.num_qo_heads, case.head_dim, case.head_dim ** -0.5, case.num_kv_heads, layer_id=0,
                           logit_cap=cfg.logit_cap, sliding_window_size=cfg.window_left)
    return runner, backend, layer


def _run_layer(backend, layer, batch, n_tokens: int, case: Case):
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    q = torch.randn(n_tokens, case.num_qo_heads * case.head_dim, dtype=torch.bfloat16)
    k = torch.randn(n_tokens, case.num_kv_heads * case.head_dim, dtype=torch.bfloat16)
    with forward_context(ForwardContext(attn_backend=backend)):
        layer(q, k, k.clone(), batch)


def _kit_batch(case: Case, runner, mode, max_ctx: int):
    from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit

    kcase = kit.DenseAttentionCase(name=case.name, backend="flashinfer", forward_mode=mode,
                                   num_heads=case.num_qo_heads, num_kv_heads=case.num_kv_heads,
                                   page_size=case.page_size, prefix_lens=case.prefix_lens,
                                   extend_lens=case.extend_lens, sliding_window_size=case.window_left)
    return kit._make_forward_batch(kcase, runner, max_context_len=max_ctx, device="cpu")


# ----------------------------------------------------------------------------- the paths
PREFIX, EXTEND, DRAFT = (20, 3), (24, 12), 4  # lengths past the window of 8, one request short


def _extend(fb, cfg, trace, prefix):
    case = _case(cfg, prefix, EXTEND)
    max_ctx = max(case.kv_lens)
    runner, backend, layer = _setup(fb, case, cfg, max_ctx)
    _, batch, (q, k, v) = harness._inputs(case, runner, layer, dtype=torch.bfloat16, device="cpu", seed=0,
                                         max_context_len=max_ctx)
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    with forward_context(ForwardContext(attn_backend=backend)):
        backend.init_forward_metadata(batch)
        layer(q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1), batch)


def _decode(fb, cfg, trace):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    case = _case(cfg, PREFIX, (1,) * len(PREFIX))
    max_ctx = max(case.kv_lens) + 1
    runner, backend, layer = _setup(fb, case, cfg, max_ctx)
    batch = _kit_batch(case, runner, ForwardMode.DECODE, max_ctx)
    backend.init_forward_metadata(batch)
    _run_layer(backend, layer, batch, case.batch_size, case)


def _verify_batch(fb, cfg, spec: str):
    """TARGET_VERIFY over committed ``PREFIX`` with ``DRAFT`` draft tokens per request: the kit
    lays out prefix + draft tokens, then ``seq_lens`` are the committed lengths, as in sglang."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    case = _case(cfg, PREFIX, (DRAFT,) * len(PREFIX))
    max_ctx = max(case.kv_lens)
    runner, backend, layer = _setup(fb, case, cfg, max_ctx)
    batch = _kit_batch(case, runner, ForwardMode.EXTEND, max_ctx)
    seq = torch.tensor(PREFIX, dtype=torch.int32)
    batch.forward_mode, batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = \
        ForwardMode.TARGET_VERIFY, seq, seq.clone(), int(seq.sum())
    n = DRAFT * len(PREFIX)
    if spec == "eagle":
        from sglang.srt.speculative.eagle_info import EagleVerifyInput
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        batch.spec_info = EagleVerifyInput(
            draft_token=torch.zeros(n, dtype=torch.long), custom_mask=torch.ones(0, dtype=torch.bool),
            positions=batch.positions, retrieve_index=None, retrieve_next_token=None,
            retrieve_next_sibling=None, retrieve_cum_len=None, topk=1, draft_token_num=DRAFT, spec_steps=DRAFT - 1,
            capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq.clone())
    else:
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        batch.spec_info = DFlashVerifyInput(draft_token=torch.zeros(n, dtype=torch.long), positions=batch.positions,
                                            draft_token_num=DRAFT)
    for attr, value in (("num_tokens_per_req", DRAFT), ("ragged_verify_layout", None)):  # read by >= 0.5.16
        if not hasattr(batch.spec_info, attr):
            setattr(batch.spec_info, attr, value)
    return case, backend, layer, batch, n


def _verify(fb, cfg, trace, spec):
    case, backend, layer, batch, n = _verify_batch(fb, cfg, spec)
    backend.init_forward_metadata(batch)
    _run_layer(backend, layer, batch, n, case)


def _graph(fb, cfg, trace, mode: str, run: PathRun):
    """CUDA-graph capture then replay: ``init_cuda_graph_state`` (:860), then
    ``init_forward_metadata_out_graph(in_capture=True)`` (:646; older releases:
    ``init_forward_metadata_capture_cuda_graph``) and the captured forward, then the replay's
    metadata call on the same wrappers (``in_capture=False`` / ``..._replay_cuda_graph``)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if mode == "decode":
        case = _case(cfg, PREFIX, (1,) * len(PREFIX))
        max_ctx = max(case.kv_lens) + 1
        runner, backend, layer = _setup(fb, case, cfg, max_ctx)
        batch, n = _kit_batch(case, runner, ForwardMode.DECODE, max_ctx), case.batch_size
    elif mode == "extend":  # full prefill CUDA graph: plain EXTEND on capture-stable wrappers (:1084)
        case = _case(cfg, PREFIX, EXTEND)
        max_ctx = max(case.kv_lens)
        runner, backend, layer = _setup(fb, case, cfg, max_ctx)
        batch, n = _kit_batch(case, runner, ForwardMode.EXTEND, max_ctx), sum(EXTEND)
    else:
        case, backend, layer, batch, n = _verify_batch(fb, cfg, "eagle")
    backend.init_cuda_graph_state(max_bs=case.batch_size, max_num_tokens=max(n, case.batch_size) * 2)
    if hasattr(backend, "init_forward_metadata_out_graph"):
        backend.init_forward_metadata_out_graph(batch, in_capture=True)
        _run_layer(backend, layer, batch, n, case)
        mark = len(trace.calls)
        backend.init_forward_metadata_out_graph(batch, in_capture=False)
    elif hasattr(backend, "init_forward_metadata_capture_cuda_graph"):
        backend.init_forward_metadata_capture_cuda_graph(case.batch_size, n, batch.req_pool_indices, batch.seq_lens,
                                                         None, batch.forward_mode, batch.spec_info)
        _run_layer(backend, layer, batch, n, case)
        mark = len(trace.calls)
        backend.init_forward_metadata_replay_cuda_graph(case.batch_size, batch.req_pool_indices, batch.seq_lens,
                                                        int(batch.seq_lens.sum()), None, batch.forward_mode,
                                                        batch.spec_info, batch.seq_lens_cpu)
    else:
        raise NotImplementedError("this release has no CUDA-graph metadata methods the audit knows")
    run.graph_stage.update({i: "capture" for i in range(mark)})  # capture plans and the captured forward
    run.graph_stage.update({i: "replay" for i in range(mark, len(trace.calls))})


PATHS = {
    "extend_paged": dict(use_paged=True, fn=lambda fb, c, t, r: _extend(fb, c, t, PREFIX)),
    "extend_ragged_no_prefix": dict(use_paged=False, fn=lambda fb, c, t, r: _extend(fb, c, t, (0, 0))),
    "extend_ragged_prefix": dict(use_paged=False, fn=lambda fb, c, t, r: _extend(fb, c, t, PREFIX)),
    "decode": dict(use_paged=False, fn=lambda fb, c, t, r: _decode(fb, c, t)),
    "target_verify_eagle": dict(use_paged=False, fn=lambda fb, c, t, r: _verify(fb, c, t, "eagle")),
    "target_verify_dflash": dict(use_paged=False, fn=lambda fb, c, t, r: _verify(fb, c, t, "dflash")),
    "cuda_graph_decode": dict(use_paged=False, fn=lambda fb, c, t, r: _graph(fb, c, t, "decode", r)),
    "cuda_graph_extend": dict(use_paged=False, fn=lambda fb, c, t, r: _graph(fb, c, t, "extend", r)),
    "cuda_graph_verify": dict(use_paged=False, fn=lambda fb, c, t, r: _graph(fb, c, t, "verify", r)),
}


def has_dflash() -> bool:
    try:
        from sglang.srt.speculative.spec_info import SpecInputType
    except ImportError:
        return False
    return hasattr(SpecInputType, "DFLASH_VERIFY") and importlib.util.find_spec(
        "sglang.srt.speculative.dflash_info") is not None


def drive(path: str, cfg: LayerConfig, *, patched: bool, source: Path | None = None) -> PathRun:
    """Run one path for one layer configuration; every wrapper call lands in the returned trace.
    A path this sglang cannot reach comes back with ``error`` saying why."""
    from swa_repro.sglang import patch as sglang_patch

    spec = PATHS[path]
    trace = Trace(meta={"path": path, "layer": cfg.name, "patched": patched, "source": str(source or "installed")})
    run = PathRun(path, cfg, trace, cfg.window_left, cfg.logit_cap)
    if path == "target_verify_dflash" and not has_dflash():
        run.error = "this sglang has no DFlash verify (SpecInputType.DFLASH_VERIFY)"
        return run
    with backend_source(source) as fb, audit_env(trace, fb, use_paged=spec["use_paged"]), \
            (sglang_patch.patched(fb) if patched else sglang_patch.unpatched(fb)), torch.no_grad():
        try:
            spec["fn"](fb, cfg, trace, run)
        except Exception as e:  # a path this release cannot drive on CPU: said, never hidden
            run.error = f"{type(e).__name__}: {e}"
    return run
