"""The model runner and forward batches the audit builds, from the release's own test kit where it
has one.

* 0.5.13+ ship ``sglang/test/kits/attention_unittest/attention_methods/dense_attention.py``:
  ``MockModelRunner`` (a real ``ModelRunner`` subclass that sglang keeps in step with the backend;
  same signature 0.5.13-0.5.23; from 0.5.16 it installs its server args through
  ``get_context().override_server_args``, 0.5.16 :342), ``make_loc_fn`` and ``_make_forward_batch``
  (0.5.23 binds ``runner.kv_index_translator``, :765). They are used as shipped.
* <= 0.5.12 have no kit: a runner with the fields that release's backend reads, a ``ServerArgs``
  built from its dataclass defaults (the recipe of 0.5.13's ``make_mock_server_args``, without
  ``__post_init__``), and a copy of 0.5.13's ``_make_forward_batch`` (contiguous token layout) that
  also sets the batch's pools, as ``ForwardBatch.init_new`` does (0.5.10 flashinfer_backend.py:782).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import types

import torch

KIT = "sglang.test.kits.attention_unittest.attention_methods.dense_attention"


def shipped_kit():
    """The release's dense-attention test kit, or None (<= 0.5.12)."""
    try:
        return importlib.import_module(KIT)
    except ImportError:
        return None


def kit_module():
    """The shipped kit, else the copy below (same names)."""
    return shipped_kit() or types.SimpleNamespace(DenseAttentionCase=_Case, make_loc_fn=_make_loc_fn,
                                                  _make_forward_batch=_make_forward_batch)


def kit_case(kit, case, mode):
    return kit.DenseAttentionCase(name=case.name or "swa", backend="flashinfer", forward_mode=mode,
                                  num_heads=case.num_qo_heads, num_kv_heads=case.num_kv_heads,
                                  page_size=case.page_size, prefix_lens=case.prefix_lens,
                                  extend_lens=case.extend_lens,
                                  sliding_window_size=case.window_left if case.window_left >= 0 else None)


def forward_batch(case, runner, mode, max_ctx: int, device: str):
    """The kit's ``_make_forward_batch`` for ``case`` in ``mode``, run as shipped, its token-slot writes
    fast (:func:`fast_slot_writes`)."""
    kit = kit_module()
    with fast_slot_writes(runner):
        return kit._make_forward_batch(kit_case(kit, case, mode), runner, max_context_len=max_ctx, device=device)


class _Slots:
    """A CPU ``req_to_token`` while the kit fills it: an ``[int, int] = int`` write goes to a numpy view of
    the same memory (~0.1 us; ``Tensor.__setitem__`` ~8 us), anything else to the tensor itself."""

    def __init__(self, t: torch.Tensor):
        self._t, self._np = t, t.numpy()

    def __setitem__(self, key, value):
        # exact types, no generator: ~4M writes per 0.5.23 table child (a bool or numpy scalar: the tensor's path)
        if type(key) is tuple and len(key) == 2 and type(key[0]) is int is type(key[1]) and type(value) is int:
            self._np[key] = value
        else:
            self._t[key] = value

    def __getitem__(self, key):
        return self._t[key]

    def __getattr__(self, name):
        return getattr(self._t, name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        un = lambda x: x._t if isinstance(x, cls) else x
        return func(*map(un, args), **{k: un(v) for k, v in (kwargs or {}).items()})


@contextlib.contextmanager
def fast_slot_writes(runner):
    """Why: the kit's ``_make_forward_batch`` fills ``req_to_token`` one element at a time (0.5.23
    dense_attention.py:741-742 ``runner.req_to_token_pool.req_to_token[req_idx, pos] = loc_fn(...)``):
    ~3.4M tensor writes for one release's table row, its child's largest cost (cProfile: 27 s of ~80).
    On a CPU pool they go through :class:`_Slots` (the same memory, the same values); the tensor is put
    back before the batch is used. A GPU pool (``--live`` on a device) is left as it is."""
    pool = getattr(runner, "req_to_token_pool", None)
    t = getattr(pool, "req_to_token", None)
    if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.requires_grad:
        yield
        return
    try:
        pool.req_to_token = _Slots(t)
    except (TypeError, RuntimeError, AttributeError):  # a dtype numpy lacks, a pool that fixes its fields
        yield
        return
    try:
        yield
    finally:
        pool.req_to_token = t


# ----------------------------------------------------------------------------- runner
def model_runner(case, *, dtype, deterministic: bool, max_context_len: int, device: str = "cpu"):
    """The runner ``FlashInferAttnBackend.__init__`` reads, for this release."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    kit = shipped_kit()
    flags = dict(enable_deterministic_inference=deterministic, enable_mis=False, enable_two_batch_overlap=False,
                 enable_dp_attention=False)
    if kit is not None and hasattr(kit, "MockModelRunner"):
        window = case.window_left if case.window_left >= 0 else None
        mc = kit.TinyModelConfig(num_heads=case.num_qo_heads, num_kv_heads=case.num_kv_heads, head_dim=case.head_dim,
                                 hidden_size=case.num_qo_heads * case.head_dim, context_len=max_context_len,
                                 sliding_window_size=window)
        runner = kit.MockModelRunner(case=kit_case(kit, case, ForwardMode.EXTEND), model_config=mc, dtype=dtype,
                                     device=device, max_context_len=max_context_len, head_dim=case.head_dim)
        for k, v in flags.items():  # a frozen ServerArgs (0.5.19+) keeps the kit's values
            with contextlib.suppress(TypeError, AttributeError):
                object.__setattr__(runner.server_args, k, v)
        runner.sliding_window_size = case.window_left
        if not hasattr(runner, "is_draft_worker"):
            runner.is_draft_worker = False
        return runner
    return _plain_runner(case, dtype=dtype, device=device, max_context_len=max_context_len, **flags)


def plain_server_args(**overrides):
    """A ``ServerArgs`` with its dataclass defaults, ``__post_init__`` skipped."""
    from sglang.srt.server_args import ServerArgs

    sa = object.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            object.__setattr__(sa, f.name, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            object.__setattr__(sa, f.name, f.default_factory())
    for k, v in overrides.items():
        object.__setattr__(sa, k, v)
    return sa


def _plain_runner(case, *, dtype, device, max_context_len, **flags):
    """The fields a kit-less release's backend reads (0.5.10 flashinfer_backend.py:120-200)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    sa = plain_server_args(dllm_algorithm=None, multi_item_scoring_delimiter=None,
                           disable_piecewise_cuda_graph=True, **flags)
    bs = case.batch_size
    rtp = ReqToTokenPool(size=bs, max_context_len=max_context_len, device=device, enable_memory_saver=False)
    pool = MHATokenToKVPool(size=case.page_size + bs * max_context_len + case.page_size, page_size=case.page_size,
                            dtype=dtype, head_num=case.num_kv_heads, head_dim=case.head_dim, layer_num=1,
                            device=device, enable_memory_saver=False, enable_alt_stream=False)
    mc = types.SimpleNamespace(
        num_attention_heads=case.num_qo_heads, get_num_kv_heads=lambda tp: case.num_kv_heads // tp,
        head_dim=case.head_dim, context_len=max_context_len, is_multimodal=False, is_encoder_decoder=False,
        hf_config=types.SimpleNamespace(architectures=["SwaReproForCausalLM"]))
    return types.SimpleNamespace(
        req_to_token_pool=rtp, token_to_kv_pool=pool,
        token_to_kv_pool_allocator=types.SimpleNamespace(get_kvcache=lambda: pool, page_size=case.page_size),
        is_draft_worker=False, server_args=sa, model_config=mc, kv_cache_dtype=dtype, dtype=dtype, device=device,
        sliding_window_size=case.window_left, page_size=case.page_size,
        spec_algorithm=types.SimpleNamespace(is_frozen_kv_mtp=lambda: False))


# ----------------------------------------------------------------------------- kit copy for <= 0.5.12
@dataclasses.dataclass
class _Case:
    """0.5.13 kit's ``DenseAttentionCase``: the fields and lengths ``_make_forward_batch`` reads."""
    name: str
    backend: str
    forward_mode: object
    num_heads: int
    num_kv_heads: int
    page_size: int
    prefix_lens: tuple
    extend_lens: tuple
    sliding_window_size: object = None

    @property
    def batch_size(self):
        return len(self.prefix_lens)

    @property
    def input_lens(self):
        return (1,) * self.batch_size if self.forward_mode.is_decode() else tuple(self.extend_lens)

    @property
    def seq_lens(self):
        if self.forward_mode.is_decode():
            return tuple(p + 1 for p in self.prefix_lens)
        return tuple(p + e for p, e in zip(self.prefix_lens, self.extend_lens))


def _make_loc_fn(layout, *, batch_size, seq_lens, prefix_lens, page_size, max_context_len, seed=0):
    """Contiguous token slots (0.5.13 kit ``_token_loc``), whatever ``layout`` asks."""
    return lambda req, pos: page_size + req * max_context_len + pos


def _make_forward_batch(case, runner, *, max_context_len, device, loc_fn=None):
    """0.5.13 kit ``_make_forward_batch``, plus the pools ``ForwardBatch.init_new`` sets."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    loc_fn = loc_fn or _make_loc_fn(None, batch_size=case.batch_size, seq_lens=case.seq_lens,
                                    prefix_lens=case.prefix_lens, page_size=case.page_size,
                                    max_context_len=max_context_len)
    decode = case.forward_mode.is_decode()
    locs, positions = [], []
    for r, s in enumerate(case.seq_lens):
        for p in range(s):
            runner.req_to_token_pool.req_to_token[r, p] = loc_fn(r, p)
        new = [s - 1] if decode else range(case.prefix_lens[r], case.prefix_lens[r] + case.input_lens[r])
        positions += list(new)
        locs += [loc_fn(r, p) for p in new]
    seq = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)
    batch = ForwardBatch(forward_mode=case.forward_mode, batch_size=case.batch_size,
                         input_ids=torch.arange(len(positions), dtype=torch.int64, device=device),
                         req_pool_indices=torch.arange(case.batch_size, dtype=torch.int32, device=device),
                         seq_lens=seq, seq_lens_cpu=seq.cpu(),
                         out_cache_loc=torch.tensor(locs, dtype=torch.int64, device=device),
                         seq_lens_sum=int(seq.sum()), positions=torch.tensor(positions, dtype=torch.int64, device=device))
    batch.req_to_token_pool, batch.token_to_kv_pool = runner.req_to_token_pool, runner.token_to_kv_pool
    if case.forward_mode.is_extend():
        batch.extend_prefix_lens = torch.tensor(case.prefix_lens, dtype=torch.int32, device=device)
        batch.extend_prefix_lens_cpu = list(case.prefix_lens)
        batch.extend_seq_lens = torch.tensor(case.input_lens, dtype=torch.int32, device=device)
        batch.extend_seq_lens_cpu = list(case.input_lens)
        batch.extend_num_tokens = len(positions)
    return batch
