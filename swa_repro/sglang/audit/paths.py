"""Drive every path of sglang's FlashInfer backend that plans a prefill or decode wrapper, with
recording stand-ins for the three FlashInfer wrapper classes, on the device sglang itself would use
(:func:`audit_device`: CUDA where torch sees a GPU, so sglang takes its serving path there).

What runs is the importable sglang's own code (``FlashInferAttnBackend``, its indices updaters,
``forward_extend`` / ``forward_decode``, the CUDA-graph metadata methods, EAGLE's, NGRAM's and
DFlash's ``generate_attn_arg_prefill``), as it is unless a what-if swaps PR #31501's methods. The
verify paths drive an EAGLE chain (topk 1), EAGLE trees (topk 2 and 4) and NGRAM trees, eager and
CUDA-graph, with masks and positions laid out as sglang lays them (``audit.spec``). The runner and
batches come from the release's own test kit (``releases_kit``), the inputs from
``harness._inputs``; calls are recorded by ``trace.record_class``. What is replaced around it
(FlashInfer and CUDA pieces, inside ``audit.env.audit_env`` only) is listed in ``audit.env``; what
differs between sglang releases lives in ``releases``.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from dataclasses import dataclass, field

import torch

from swa_repro.core.case import Case
from swa_repro.sglang import harness, releases, releases_kit
from swa_repro.sglang.audit import hybrid_pool
from swa_repro.sglang.audit.env import audit_env
from swa_repro.sglang.patch.swap import patched, unpatched
from swa_repro.sglang.audit.spec import (EAGLE_TREES, GRAPH_TREES, NGRAM_TREES, Spec, chain_parents, eagle_draft,
                                         eagle_tree_layout, ngram_tree_layout)
from swa_repro.sglang.trace import Trace

# sglang itself is imported inside the functions that drive it: it is optional and slow to import
# (about a minute on 2 cores), and `swa-repro audit --help` / bad --paths must not wait for it.


# ----------------------------------------------------------------------------- one layer configuration
@dataclass(frozen=True)
class Shape:
    """Heads and lengths of every path's batch: ``prefix`` + ``extend`` for the extend paths,
    ``committed`` for decode and verify (default: past a window of 8, one request short)."""
    num_qo_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    page_size: int = 1  # sglang plans page size 1
    prefix: tuple = (20, 3)
    extend: tuple = (24, 12)
    committed: tuple = (20, 3)

    @property
    def heads(self) -> dict:
        return dict(num_qo_heads=self.num_qo_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                    page_size=self.page_size)


@dataclass(frozen=True)
class LayerConfig:
    """One attention layer: window (``-1`` none) and soft cap (``0`` none). Its methods build what
    a path drives (``audit.family`` overrides them with a model's own layer and runner window)."""
    window_left: int
    logit_cap: float

    @property
    def name(self) -> str:
        return f"{'swa' if self.window_left >= 0 else 'full'}{'' if self.window_left < 0 else self.window_left}" \
               f"{'_cap' + format(self.logit_cap, 'g') if self.logit_cap else ''}"

    @property
    def shape(self) -> Shape:
        return SHAPE

    def setup(self, fb, case: Case, max_ctx: int, device: str, use_paged: bool = False):
        return _setup(fb, case, self, max_ctx, device, use_paged)

    def extend_inputs(self, case: Case, runner, layer, max_ctx: int, device: str):
        """``(batch, q, k, v)`` of an extend path: seeded inputs, shuffled pages, prefix KV written."""
        _, batch, (q, k, v) = harness._inputs(case, runner, layer, dtype=torch.bfloat16, device=device, seed=0,
                                             max_context_len=max_ctx, kit=releases_kit.kit_module())
        return batch, q * q_scale(self), k, v

    def inputs(self, n_tokens: int, case: Case):
        """Seeded q, k, v of ``n_tokens`` rows (decode, verify, graph)."""
        g = torch.Generator().manual_seed(2)
        q = torch.randn(n_tokens, case.num_qo_heads * case.head_dim, generator=g) * q_scale(self)
        return (q, torch.randn(n_tokens, case.num_kv_heads * case.head_dim, generator=g),
                torch.randn(n_tokens, case.num_kv_heads * case.head_dim, generator=g))


SHAPE = Shape()
LAYER_CONFIGS = (LayerConfig(8, 0.0), LayerConfig(8, 50.0), LayerConfig(-1, 50.0), LayerConfig(-1, 0.0))
HEADS = SHAPE.heads


@dataclass
class PathRun:
    path: str
    layer: LayerConfig
    trace: Trace
    layer_window: int
    layer_cap: float
    graph_stage: dict = field(default_factory=dict)  # call index -> "capture" | "replay"
    error: str | None = None  # a path not driven, with why
    status: str = "driven"  # driven | absent (no such path in this release) | sglang raised | harness
    device: str = "cpu"  # where sglang's tensors lived
    snapshot: dict = field(default_factory=dict)  # the pools' token map and the batch's positions (audit.keys)
    spec_tree: dict | None = None  # a verify path's committed lengths and each request's parent links


def audit_device() -> str:
    """Where sglang's tensors go: where sglang itself puts them when serving. sglang picks its
    kernels at import from the platform (memory_pool.py:93 ``_is_cuda = is_cuda()``), and on CUDA
    its KV write calls the CUDA-only ``store_cache`` (memory_pool.py:146-147), which raises on CPU
    tensors. So the audit follows the platform, not the other way round."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def dispatch_mismatch(device: str) -> str | None:
    """Why sglang's import-time kernel choice does not fit tensors on ``device`` (None: it fits).
    Checked before a path is driven, so a mismatch is named instead of every path raising."""
    mp = importlib.import_module("sglang.srt.mem_cache.memory_pool")
    gpu = [n for n in ("_is_cuda", "_is_hip") if getattr(mp, n, False)]
    if gpu and device == "cpu":
        return (f"sglang dispatches its KV-cache writes to GPU kernels (memory_pool.{gpu[0]}=True, "
                "memory_pool.py:146) but the audit's tensors are on the CPU: run where torch sees that GPU")
    if not gpu and device != "cpu":
        return f"the audit's tensors are on {device} but sglang chose its CPU kernels at import (memory_pool)"
    return None


def snapshot(runner, batch) -> dict:
    """What maps a wrapper's KV back to positions (``audit.keys``): sglang's req-to-token pool (``hybrid_pool.rows_of``),
    the batch's request rows, query positions and sequence lengths; CPU copies taken after the path ran."""
    return {**hybrid_pool.rows_of(runner),
            "req_pool_indices": batch.req_pool_indices.detach().to("cpu", torch.int64).clone(),
            "positions": batch.positions.detach().to("cpu", torch.int64).clone(),
            "seq_lens": batch.seq_lens.detach().to("cpu", torch.int64).clone()}


def q_scale(cfg: "LayerConfig") -> float:
    """Queries are scaled by 16 on a soft-capped layer so that ``|q.k| * sm_scale`` (about 1 for
    randn at scale ``head_dim**-0.5``) reaches past the cap of 50 (~16 sigma): otherwise a dropped
    cap changes no output measurably and the live verdict could not tell capped from uncapped."""
    return 16.0 if cfg.logit_cap else 1.0


def _case(cfg: LayerConfig, prefix_lens, extend_lens) -> Case:
    return Case(prefix_lens=tuple(prefix_lens), extend_lens=tuple(extend_lens), window_left=cfg.window_left,
                name=f"audit_{cfg.name}", **cfg.shape.heads)


def fill_kv_pool(runner, seed: int = 1) -> None:
    """The runner's KV pool filled with seeded randn, so that a replay of the recorded calls on real
    kernels (``audit.live``) reads keys that differ."""
    g = torch.Generator().manual_seed(seed)
    pool = runner.token_to_kv_pool
    for buf in (*getattr(pool, "k_buffer", ()), *getattr(pool, "v_buffer", ())):
        buf.copy_(torch.randn(buf.shape, generator=g).to(buf.dtype))


def _setup(fb, case: Case, cfg: LayerConfig, max_ctx: int, device: str, use_paged: bool = False):
    """The release's runner (``releases_kit``), its backend and one RadixAttention layer. Without
    ``SGLANG_FLASHINFER_USE_PAGED`` (0.5.10) the paged-only prefill is reached by deterministic
    inference (0.5.10 flashinfer_backend.py:488-490). The KV pool is filled with seeded randn
    (:func:`fill_kv_pool`)."""
    from sglang.srt.layers.radix_attention import RadixAttention

    runner = releases_kit.model_runner(case, dtype=torch.bfloat16, max_context_len=max_ctx, device=device,
                                       deterministic=use_paged and not releases.has_paged_switch())
    fill_kv_pool(runner)
    runner.sliding_window_size = cfg.window_left if cfg.window_left >= 0 else None
    model_cap(runner, cfg.logit_cap)
    releases.newer_release_attrs(runner)
    backend = fb.FlashInferAttnBackend(runner)
    layer = RadixAttention(case.num_qo_heads, case.head_dim, case.head_dim ** -0.5, case.num_kv_heads, layer_id=0,
                           logit_cap=cfg.logit_cap, sliding_window_size=cfg.window_left)
    return runner, backend, layer


def model_cap(runner, cap: float) -> None:
    """The model config says what its layers' ``logit_cap`` is, as Gemma-2's does
    (``hf_text_config.attn_logit_softcapping``; gemma2.py gives it to every RadixAttention), so a
    backend that plans with the model's cap (``fix.fixes`` soft_cap_*) finds it. sglang as it ships
    never reads it: the audit of a release as it ships is unchanged."""
    mc = runner.model_config
    cfg = getattr(mc, "hf_text_config", None)
    if cfg is None:
        cfg = types.SimpleNamespace()
        mc.hf_text_config = cfg
    cfg.attn_logit_softcapping = cap if cap else None


def _run_layer(backend, layer, batch, n_tokens: int, case: Case, cfg: LayerConfig, device: str):
    q, k, v = cfg.inputs(n_tokens, case)
    with releases.attach(backend, batch):
        layer(*(x.to(device, torch.bfloat16) for x in (q, k, v)), batch)


def _kit_batch(case: Case, runner, mode, max_ctx: int, device: str):
    # a hybrid pool's scheduler steps before it
    return hybrid_pool.after_batch(runner, releases_kit.forward_batch(case, runner, mode, max_ctx, device))


# ----------------------------------------------------------------------------- the paths
PREFIX, EXTEND, DRAFT = SHAPE.prefix, SHAPE.extend, 4  # lengths past the window of 8, one request short


def _extend(fb, cfg, run, prefix, use_paged: bool):
    case = _case(cfg, prefix, cfg.shape.extend)
    max_ctx = max(case.kv_lens)
    runner, backend, layer = cfg.setup(fb, case, max_ctx, run.device, use_paged)
    batch, q, k, v = cfg.extend_inputs(case, runner, layer, max_ctx, run.device)
    with releases.attach(backend, batch):
        backend.init_forward_metadata(batch)
        layer(q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1), batch)
    return runner, batch


def _decode(fb, cfg, run):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    committed = cfg.shape.committed
    case = _case(cfg, committed, (1,) * len(committed))
    max_ctx = max(case.kv_lens) + 1
    runner, backend, layer = cfg.setup(fb, case, max_ctx, run.device)
    batch = _kit_batch(case, runner, ForwardMode.DECODE, max_ctx, run.device)
    backend.init_forward_metadata(batch)
    _run_layer(backend, layer, batch, case.batch_size, case, cfg, run.device)
    return runner, batch


def chain_mask(committed, draft: int) -> torch.Tensor:
    """EAGLE's verify mask for a chain of ``draft`` tokens (topk 1), laid out as EAGLE builds it:
    per request ``draft x (committed + draft)`` row-major, every committed key visible, draft ``d``
    seeing drafts ``0..d`` (speculative/eagle_utils.py ``build_tree_kernel_efficient``)."""
    parts = [torch.cat([torch.ones(draft, c, dtype=torch.bool), torch.ones(draft, draft, dtype=torch.bool).tril()], 1)
             for c in committed]
    return torch.cat([p.reshape(-1) for p in parts])


CHAIN, DFLASH, NGRAM = Spec("eagle", DRAFT, 1, DRAFT - 1), Spec("dflash", DRAFT), Spec("ngram", 8)


def verify_layout(spec: Spec, committed) -> tuple[torch.Tensor | None, torch.Tensor | None, list]:
    """``(custom_mask, positions, parents)`` of a verify batch over ``committed`` tokens per request:
    the mask and positions as sglang lays them out (``audit.spec``; DFlash: no mask, its block is
    causal, positions ``committed + i``), and each request's parent links for the key oracle."""
    n = spec.n
    if spec.kind == "dflash" or (spec.kind == "eagle" and spec.topk == 1):
        positions = torch.cat([torch.arange(c, c + n) for c in committed])
        return (None if spec.kind == "dflash" else chain_mask(committed, n)), positions, \
            [chain_parents(n) for _ in committed]
    if spec.kind == "ngram":
        trees = [NGRAM_TREES[i % len(NGRAM_TREES)] for i in range(len(committed))]
        mask, positions = ngram_tree_layout(trees, committed, n)
        return mask, positions, [list(t) for t in trees]
    drafts = [eagle_draft(spec.topk, spec.steps, n, seed=7 + i) for i in range(len(committed))]
    mask, positions = eagle_tree_layout(drafts, committed, spec.topk, spec.steps, n)
    return mask, positions, [d.parents for d in drafts]


def _verify_batch(fb, cfg, spec: Spec, device: str, run: PathRun | None = None):
    """TARGET_VERIFY over ``cfg.shape.committed`` tokens with ``spec.n`` draft tokens per request: the kit
    lays out prefix + draft tokens, then ``seq_lens`` are the committed lengths and ``positions``
    the verify input's (forward_batch_info.py:1219-1223: ``positions = spec_info.positions``), as
    in sglang. The tree's parent links go to ``run.spec_tree`` for the key oracle."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    n, committed = spec.n, cfg.shape.committed
    case = _case(cfg, committed, (n,) * len(committed))
    max_ctx = max(case.kv_lens)
    runner, backend, layer = cfg.setup(fb, case, max_ctx, device)
    batch = _kit_batch(case, runner, ForwardMode.EXTEND, max_ctx, device)
    seq = torch.tensor(committed, dtype=torch.int32, device=device)
    batch.forward_mode, batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = \
        ForwardMode.TARGET_VERIFY, seq, seq.cpu(), int(seq.sum())
    mask, positions, parents = verify_layout(spec, committed)
    batch.positions = positions.to(device)
    if run is not None:
        run.spec_tree = {"committed": list(committed), "parents": parents}
    draft = torch.zeros(n * len(committed), dtype=torch.long, device=device)
    if spec.kind == "eagle":
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        batch.spec_info = releases.build(
            EagleVerifyInput, draft_token=draft, custom_mask=mask.to(device), positions=batch.positions,
            retrieve_index=None, retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
            topk=spec.topk, draft_token_num=n, spec_steps=spec.steps, capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq.cpu())
    elif spec.kind == "ngram":
        from sglang.srt.speculative.ngram_info import NgramVerifyInput

        batch.spec_info = releases.build(NgramVerifyInput, draft_token=draft, custom_mask=mask.to(device),
                                         positions=batch.positions, retrieve_index=None, retrieve_next_token=None,
                                         retrieve_next_sibling=None, draft_token_num=n)
    else:
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        batch.spec_info = DFlashVerifyInput(draft_token=draft, positions=batch.positions, draft_token_num=n)
    releases.spec_info_defaults(batch.spec_info, n)
    return case, runner, backend, layer, batch, n * len(committed)


def _verify(fb, cfg, run, spec: Spec):
    case, runner, backend, layer, batch, n = _verify_batch(fb, cfg, spec, run.device, run)
    backend.init_forward_metadata(batch)
    _run_layer(backend, layer, batch, n, case, cfg, run.device)
    return runner, batch


def _graph(fb, cfg, run: PathRun, mode: str, spec: Spec = CHAIN):
    """CUDA-graph capture then replay: ``init_cuda_graph_state`` (:860), then the capture's
    metadata call (``releases.graph_metadata``: ``init_forward_metadata_out_graph(in_capture=True)``,
    :646) and the captured forward, then the replay's metadata call on the same wrappers, then the
    graph's replay: the captured forward again, whose runs read the wrappers' buffers as every
    replay plan left them (a buffer two wrappers share holds the last one's: ``kernel.graph_buffers``)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    dev = run.device
    if mode == "decode":
        case = _case(cfg, cfg.shape.committed, (1,) * len(cfg.shape.committed))
        max_ctx = max(case.kv_lens) + 1
        runner, backend, layer = cfg.setup(fb, case, max_ctx, dev)
        batch, n = _kit_batch(case, runner, ForwardMode.DECODE, max_ctx, dev), case.batch_size
    elif mode == "extend":  # full prefill CUDA graph: plain EXTEND on capture-stable wrappers (:1084)
        case = _case(cfg, cfg.shape.prefix, cfg.shape.extend)
        max_ctx = max(case.kv_lens)
        runner, backend, layer = cfg.setup(fb, case, max_ctx, dev)
        batch, n = _kit_batch(case, runner, ForwardMode.EXTEND, max_ctx, dev), sum(cfg.shape.extend)
    else:
        case, runner, backend, layer, batch, n = _verify_batch(fb, cfg, spec, dev, run)
    backend.init_cuda_graph_state(max_bs=case.batch_size, max_num_tokens=max(n, case.batch_size) * 2)
    capture, replay = releases.graph_metadata(backend, batch, case.batch_size, n)
    capture()
    _run_layer(backend, layer, batch, n, case, cfg, dev)
    mark = len(run.trace.calls)
    replay()
    _run_layer(backend, layer, batch, n, case, cfg, dev)  # graph.replay(): the captured kernels run again
    run.graph_stage.update({i: "capture" for i in range(mark)})  # capture plans and the captured forward
    run.graph_stage.update({i: "replay" for i in range(mark, len(run.trace.calls))})
    return runner, batch


PATHS = {  # each driver takes (flashinfer_backend module, layer config, PathRun), returns (runner, batch)
    "extend_paged": dict(use_paged=True, fn=lambda fb, c, r: _extend(fb, c, r, c.shape.prefix, True)),
    "extend_ragged_no_prefix": dict(use_paged=False, fn=lambda fb, c, r: _extend(fb, c, r, (0, 0), False)),
    "extend_ragged_prefix": dict(use_paged=False, fn=lambda fb, c, r: _extend(fb, c, r, c.shape.prefix, False)),
    "decode": dict(use_paged=False, fn=lambda fb, c, r: _decode(fb, c, r)),
    "target_verify_eagle": dict(use_paged=False, fn=lambda fb, c, r: _verify(fb, c, r, CHAIN)),
    **{f"target_verify_eagle_{t.name}": dict(use_paged=False, fn=lambda fb, c, r, t=t: _verify(fb, c, r, t))
       for t in EAGLE_TREES},
    "target_verify_ngram": dict(use_paged=False, fn=lambda fb, c, r: _verify(fb, c, r, NGRAM)),
    "target_verify_dflash": dict(use_paged=False, fn=lambda fb, c, r: _verify(fb, c, r, DFLASH)),
    "cuda_graph_decode": dict(use_paged=False, fn=lambda fb, c, r: _graph(fb, c, r, "decode")),
    "cuda_graph_extend": dict(use_paged=False, fn=lambda fb, c, r: _graph(fb, c, r, "extend")),
    "cuda_graph_verify": dict(use_paged=False, fn=lambda fb, c, r: _graph(fb, c, r, "verify")),
    **{f"cuda_graph_verify_eagle_{t.name}": dict(use_paged=False,
                                                  fn=lambda fb, c, r, t=t: _graph(fb, c, r, "verify", t))
       for t in GRAPH_TREES},
    "cuda_graph_verify_ngram": dict(use_paged=False, fn=lambda fb, c, r: _graph(fb, c, r, "verify", NGRAM)),
}


WHAT_IFS = {None: lambda fb: contextlib.nullcontext(), "patched": patched,
            "unpatched": unpatched}


def drive(path: str, cfg: LayerConfig, *, what_if: str | None = None, device: str | None = None) -> PathRun:
    """Run one path for one layer configuration of the importable sglang as it is (``what_if``:
    ``patched`` / ``unpatched`` swaps PR #31501's two methods in-process first); every wrapper call
    lands in the returned trace. A path not driven comes back with ``status`` and ``error``: absent
    from this release, raised inside the release's own code (file:line), or a harness failure
    (``device`` not where sglang dispatches, among others)."""
    spec = PATHS[path]
    device = device or audit_device()
    trace = Trace(meta={"path": path, "layer": cfg.name, "what_if": what_if, "device": device},
                  values=getattr(cfg, "trace_values", True))
    run = PathRun(path, cfg, trace, cfg.window_left, cfg.logit_cap, device=device)
    releases.ensure_sgl_kernel()
    fb = harness.backend_module()
    absent = releases.absent_reason(path, fb)
    if absent:
        run.status, run.error = "absent", absent
        return run
    mismatch = dispatch_mismatch(device)
    if mismatch:
        run.status, run.error = "harness", mismatch
        return run
    releases.preload_spec_input(path)
    with audit_env(trace, fb, use_paged=spec["use_paged"], device=device), WHAT_IFS[what_if](fb), torch.no_grad():
        try:
            runner, batch = spec["fn"](fb, cfg, run)
            run.snapshot = snapshot(runner, batch)
            if run.spec_tree is not None:
                run.snapshot["spec_tree"] = run.spec_tree
        except Exception as e:  # said, never hidden: whose code raised, and where
            run.status, run.error = releases.explain_error(e)
    return run
