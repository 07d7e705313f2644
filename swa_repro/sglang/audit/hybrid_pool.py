"""sglang's hybrid SWA KV pool around a family's runner (child side), so an architecture the release
serves on it (``ModelConfig.is_hybrid_swa``) is judged on the pool it is served on.

With the hybrid pool a sliding layer's KV lives in a pool of its own: the FlashInfer backend finds it
(``_resolve_swa_kv_pool``, 0.5.23 flashinfer_backend.py:588-600) and translates the sliding wrapper's
kv_indices from full slots to SWA slots (``translate_loc_from_full_to_swa``, :1814-1820 decode,
:2306-2312 prefill; the pool's ``full_to_swa_index_mapping``, swa_memory_pool.py:248-251). The
mapping is filled by the release's allocator (``SWATokenToKVPoolAllocator``, allocator/swa.py:41:
``alloc`` takes an SWA slot per full slot and ``set_full_to_swa_mapping``, :273-286; 0.5.10-0.5.12: the
same class in swa_memory_pool.py), and a running
request's SWA slots that left the window are freed by the release's
``free_swa_out_of_window_slots`` (mem_cache/common.py:75; on a decode, pre_len ``req.seqlen - 1``,
schedule_batch.py:4095), which clears their mapping to slot 0 (``free_swa``, allocator/swa.py:499).

:func:`install` builds the release's own pool and allocator in place of the kit's single pool;
:meth:`HybridPool.after_batch` plays what the scheduler did before the batch: a foreign request
holding SWA slots, the batch's requests allocated, the out-of-window slots of each decoding request
freed, and a later foreign request taking the freed SWA slots. :meth:`HybridPool.view` maps a
request's positions to the SWA slots the release's own translation gives, so ``audit.keys`` /
``audit.spans`` read a sliding call's SWA slots back to positions (foreign, stale or padding slots:
not that request's). Extend batches evict nothing (radix cache: prefix sharing, schedule_batch.py:4105).
"""

from __future__ import annotations

import importlib
import inspect
import types

import torch

from swa_repro.sglang.families import def_line

FOREIGN = 7  # SWA slots a request scheduled before the batch holds (not the batch's)


def classes():
    """``(SWAKVPool, SWATokenToKVPoolAllocator, eviction)`` of the release (a ``RuntimeError`` saying why not).
    The allocator is in ``mem_cache/allocator/swa.py`` (0.5.14+) or ``swa_memory_pool.py`` (0.5.10-0.5.12,
    :296 in 0.5.12); the eviction is ``free_swa_out_of_window_slots`` (mem_cache/common.py, 0.5.14+) or
    ``ScheduleBatch._evict_swa`` (0.5.12 schedule_batch.py:2714), called as the scheduler calls it."""
    try:
        swa = importlib.import_module("sglang.srt.mem_cache.swa_memory_pool")
        pool = swa.SWAKVPool
        try:
            alloc = importlib.import_module("sglang.srt.mem_cache.allocator.swa").SWATokenToKVPoolAllocator
        except ImportError:
            alloc = swa.SWATokenToKVPoolAllocator
    except (ImportError, AttributeError) as e:  # said in the run's error, the cell stays unknown with it
        raise RuntimeError(f"the release's hybrid pool classes are not importable: {type(e).__name__}: {e}") from e
    try:
        evict = importlib.import_module("sglang.srt.mem_cache.common").free_swa_out_of_window_slots
    except (ImportError, AttributeError):
        evict = _batch_eviction()
    return pool, alloc, evict


def _batch_eviction():
    """``ScheduleBatch._evict_swa(req, pre_len)`` with the batch fields it reads (its tree cache's window
    and page size, the pools), in ``free_swa_out_of_window_slots``' call shape; None if absent."""
    fn = getattr(importlib.import_module("sglang.srt.managers.schedule_batch").ScheduleBatch, "_evict_swa", None)
    if fn is None:
        return None

    def evict(req, pre_len, *, sliding_window_size, page_size, req_to_token_pool, token_to_kv_pool_allocator,
              **_):
        tree = types.SimpleNamespace(supports_swa=lambda: True, sliding_window_size=sliding_window_size,
                                     page_size=page_size)
        fn(types.SimpleNamespace(tree_cache=tree, req_to_token_pool=req_to_token_pool,
                                 token_to_kv_pool_allocator=token_to_kv_pool_allocator), req, pre_len)
    evict.release_fn = fn
    return evict


def _accepted(fn, kwargs: dict) -> dict:
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


class HybridPool:
    """The release's ``SWAKVPool`` + ``SWATokenToKVPoolAllocator`` installed on ``runner``, layer 0
    (the kit's one layer) in the SWA pool when ``sliding``, else in the full pool."""

    def __init__(self, runner, sliding: bool, window: int | None):
        pool_cls, alloc_cls, self.evict = classes()
        old = runner.token_to_kv_pool
        self.size = 2 * int(old.size) + 4 * FOREIGN  # room for the foreign requests' full slots
        kw = {"size": self.size, "size_swa": self.size, "page_size": 1, "dtype": old.dtype,
              "head_num": int(old.head_num), "head_dim": int(old.head_dim),
              "swa_attention_layer_ids": [0] if sliding else [1], "full_attention_layer_ids": [1] if sliding else [0],
              "device": old.device, "enable_memory_saver": False, "enable_alt_stream": False}
        if "enable_kvcache_transpose" in inspect.signature(pool_cls.__init__).parameters:  # 0.5.14: required
            kw["enable_kvcache_transpose"] = False
        self.pool = pool_cls(**_accepted(pool_cls.__init__, kw))
        akw = {"size": self.size, "size_swa": self.size, "page_size": 1, "dtype": torch.int64, "device": old.device,
               "kvcache": self.pool, "need_sort": False, "req_to_token_pool": runner.req_to_token_pool}
        self.alloc = alloc_cls(**_accepted(alloc_cls.__init__, akw))
        self.runner, self.sliding, self.window = runner, sliding, window
        self.next_foreign = int(old.size) + 1  # full slots past the kit's, for foreign requests
        self.freed, self.batch = 0, None
        runner.token_to_kv_pool, runner.token_to_kv_pool_allocator = self.pool, self.alloc
        if hasattr(runner, "init_kv_index_translator"):  # 0.5.23: the translator reads the allocator
            runner.init_kv_index_translator()

    def _foreign(self, n: int) -> None:
        """A request outside the batch takes ``n`` SWA slots, as ``alloc`` does (swa.py:273-286)."""
        full = torch.arange(self.next_foreign, self.next_foreign + n, dtype=torch.int64)
        self.next_foreign += n
        self._map(full, self.alloc.swa_attn_allocator.alloc(n))

    def _map(self, full: torch.Tensor, swa: torch.Tensor) -> None:
        """``full_to_swa_index_mapping[full] = swa``: the allocator's ``set_full_to_swa_mapping``
        (0.5.12+), or the assignment its ``alloc`` makes inline (0.5.11 swa_memory_pool.py:362-367)."""
        if hasattr(self.alloc, "set_full_to_swa_mapping"):
            self.alloc.set_full_to_swa_mapping(full, swa)
        else:
            self.alloc.full_to_swa_index_mapping[full.to(torch.int64)] = swa.to(torch.int64)

    def after_batch(self, batch) -> None:
        """The scheduler's allocations and frees before ``batch`` runs (module docstring)."""
        rt = self.runner.req_to_token_pool.req_to_token
        rows, seqs = batch.req_pool_indices.tolist(), batch.seq_lens.tolist()
        self._foreign(FOREIGN)
        for row, seq in zip(rows, seqs):
            full = rt[row, :seq].to(torch.int64)
            self._map(full, self.alloc.swa_attn_allocator.alloc(int(seq)))
        self.batch = batch

    def before_plan(self) -> None:
        """Before the first plan of the last batch: a decoding request's SWA slots out of the window are
        freed by the release (``maybe_evict_swa`` before a decode, 0.5.23 allocation.py:633, and before an
        EAGLE verify, eagle_utils.py:857-858: pre_len ``req.seqlen - 1``, schedule_batch.py:4095, in steady
        state ``decode_batch_idx >= 1``); an extend batch frees none under the radix cache (:4105)."""
        batch, self.batch = self.batch, None
        if batch is None or self.evict is None or self.window is None:
            return
        mode = batch.forward_mode
        if not (mode.is_decode() or getattr(mode, "is_target_verify", lambda: False)()):
            return
        rows, seqs = batch.req_pool_indices.tolist(), batch.seq_lens.tolist()
        before = self.alloc.swa_attn_allocator.available_size()
        for row, seq in zip(rows, seqs):
            self.evict(_Req(row), int(seq) - 1, **_accepted(self.evict, {
                "sliding_window_size": int(self.window), "page_size": 1,
                "req_to_token_pool": self.runner.req_to_token_pool, "token_to_kv_pool_allocator": self.alloc,
                "supports_prefix_sharing": True}))
        self.freed = int(self.alloc.swa_attn_allocator.available_size() - before)
        if self.freed:
            self._foreign(self.freed)  # the freed SWA slots go to another request

    def view(self, req_to_token: torch.Tensor) -> torch.Tensor:
        """Each position's SWA slot by the release's own translation (a full layer: unchanged)."""
        if not self.sliding:
            return req_to_token
        return self.pool.translate_loc_from_full_to_swa(req_to_token.to(torch.int64))

    def facts(self) -> dict:
        return {"pool": type(self.pool).__name__, "allocator": type(self.alloc).__name__,
                "layer_pool": "swa" if self.sliding else "full", "foreign_slots": FOREIGN, "freed": self.freed,
                "eviction": def_line(getattr(self.evict, "release_fn", self.evict)) if self.evict else "none in this release"}


class _Req:
    """What ``free_swa_out_of_window_slots`` reads of a running request, nothing protected by the cache:
    the cursor of evicted positions on ``req.kv`` (0.5.21+ ``get_evicted_seqlen``, 0.5.16-0.5.20
    ``kv.swa_evicted_seqlen``) or on the request itself (0.5.14)."""

    def __init__(self, row: int):
        self.evicted = {}
        self.req_pool_idx = row
        self.cache_protected_len = 0
        self.swa_evicted_seqlen = 0
        self.kv = types.SimpleNamespace(
            holds_kv=True, cache_protected_len=0, req_pool_idx=row, swa_dead_lo=lambda page_size: 0,
            swa_evicted_seqlen=0,
            get_evicted_seqlen=lambda c: self.evicted.get(c, 0),
            set_evicted_seqlen=lambda c, n: self.evicted.__setitem__(c, n))


# ----------------------------------------------------------------------------- the runner's (audit.paths)
def after_batch(runner, batch):
    """``batch``, after the hybrid pool (if ``runner`` has one) played the scheduler's steps before it."""
    if getattr(runner, "hybrid_pool", None) is not None:
        runner.hybrid_pool.after_batch(batch)
    return batch


PLANS = ("init_forward_metadata", "init_forward_metadata_out_graph", "init_forward_metadata_capture_cuda_graph",
         "init_forward_metadata_replay_cuda_graph")


def evict_before_plans(backend, hybrid: HybridPool) -> None:
    """Each metadata call of ``backend`` (eager or CUDA-graph) first lets the scheduler free the last
    batch's out-of-window SWA slots (:meth:`HybridPool.before_plan`, once per batch)."""
    for name in PLANS:
        fn = getattr(backend, name, None)
        if fn is not None:
            setattr(backend, name, lambda *a, _fn=fn, **k: (hybrid.before_plan(), _fn(*a, **k))[1])


def rows_of(runner) -> dict:
    """``req_to_token`` as the driven layer's wrappers index it (a sliding layer on the hybrid pool: SWA
    slots, :meth:`HybridPool.view`), CPU int64, and the pool's facts (``hybrid_pool``) where it has one."""
    rt, hybrid = runner.req_to_token_pool.req_to_token, getattr(runner, "hybrid_pool", None)
    out = {"req_to_token": (hybrid.view(rt) if hybrid is not None else rt).detach().to("cpu", torch.int64).clone()}
    return {**out, "hybrid_pool": hybrid.facts()} if hybrid is not None else out


# ----------------------------------------------------------------------------- child: a hand-sized probe
def probe(seqs: list[int], window: int, mode: str, sliding: bool = True) -> dict:
    """The pool of :class:`HybridPool` around requests of ``seqs`` tokens (request ``i`` in row ``i``,
    its full slots the kit's: ``1 + i * ctx + position``), one batch in ``mode`` (``decode`` /
    ``extend``): each request's SWA slot per position as the release translates it, after the
    release's eviction (a check of this module against the release's rules, ``tests/test_hybrid_pool.py``)."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    ctx = max(seqs) + 1
    rtp = ReqToTokenPool(size=len(seqs), max_context_len=ctx, device="cpu", enable_memory_saver=False)
    for i, n in enumerate(seqs):
        rtp.req_to_token[i, :n] = torch.arange(1 + i * ctx, 1 + i * ctx + n, dtype=rtp.req_to_token.dtype)
    kit_pool = types.SimpleNamespace(size=len(seqs) * ctx + 1, dtype=torch.bfloat16, head_num=1, head_dim=8,
                                     device="cpu")
    runner = types.SimpleNamespace(token_to_kv_pool=kit_pool, req_to_token_pool=rtp)
    runner.hybrid_pool = hybrid = HybridPool(runner, sliding, window)
    batch = types.SimpleNamespace(req_pool_indices=torch.arange(len(seqs)), seq_lens=torch.tensor(seqs),
                                  forward_mode=ForwardMode.DECODE if mode == "decode" else ForwardMode.EXTEND)
    hybrid.after_batch(batch)
    hybrid.before_plan()
    rows = rows_of(runner)["req_to_token"]
    return {"view": [rows[i, :n].tolist() for i, n in enumerate(seqs)], "facts": hybrid.facts(),
            "pool_file": def_line(type(hybrid.pool)), "allocator_file": def_line(type(hybrid.alloc))}


def main(argv=None) -> int:
    from swa_repro.engine.child import child_main, child_parser

    p = child_parser("swa_repro.sglang.audit.hybrid_pool")
    p.add_argument("--seqs", required=True, help="comma-separated request lengths")
    p.add_argument("--window", type=int, required=True)
    p.add_argument("--modes", type=_modes, required=True, help="comma-separated, of decode, extend")

    def run(overlay, a):
        """Every mode in one child: the import of the release's pools is the child's cost, a probe is ms."""
        from swa_repro.sglang import releases
        from swa_repro.sglang.audit import family_build

        family_build.vllm_placeholder()
        releases.ensure_sgl_kernel()
        return {"by_mode": {m: probe([int(x) for x in a.seqs.split(",")], a.window, m) for m in a.modes}}
    return child_main(p, run, argv)


def _modes(text: str) -> list[str]:
    import argparse

    modes = list(dict.fromkeys(text.split(",")))
    if not set(modes) <= {"decode", "extend"}:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated, of decode, extend")
    return modes


if __name__ == "__main__":
    import sys

    sys.exit(main())
