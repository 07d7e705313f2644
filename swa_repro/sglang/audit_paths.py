"""Drive every path of sglang's FlashInfer backend that plans a prefill or decode wrapper, on CPU,
with recording stand-ins for the three FlashInfer wrapper classes.

What runs is the importable sglang's own code (``FlashInferAttnBackend``, its indices updaters,
``forward_extend`` / ``forward_decode``, the CUDA-graph metadata methods, EAGLE's and DFlash's
``generate_attn_arg_prefill``), as it is unless a what-if swaps PR #31501's methods. The runner and
batches come from the release's own test kit (``releases_kit``), the inputs from
``harness._inputs``; calls are recorded by ``trace.record_class``. What is replaced around it
(FlashInfer and CUDA pieces, inside ``audit_env.audit_env`` only) is listed in ``audit_env``; what
differs between sglang releases lives in ``releases``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from swa_repro.core.case import Case
from swa_repro.sglang import harness, releases, releases_kit
from swa_repro.sglang import patch as sglang_patch
from swa_repro.sglang.audit_env import audit_env
from swa_repro.sglang.trace import Trace

# sglang itself is imported inside the functions that drive it: it is optional and slow to import
# (about a minute on 2 cores), and `swa-repro audit --help` / bad --paths must not wait for it.


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
    error: str | None = None  # a path not driven, with why
    status: str = "driven"  # driven | absent (no such path in this release) | sglang raised | harness


def _case(cfg: LayerConfig, prefix_lens, extend_lens) -> Case:
    return Case(prefix_lens=tuple(prefix_lens), extend_lens=tuple(extend_lens), window_left=cfg.window_left,
                name=f"audit_{cfg.name}", **HEADS)


def _setup(fb, case: Case, cfg: LayerConfig, max_ctx: int, use_paged: bool = False):
    """The release's runner (``releases_kit``), its backend and one RadixAttention layer. Without
    ``SGLANG_FLASHINFER_USE_PAGED`` (0.5.10) the paged-only prefill is reached by deterministic
    inference (0.5.10 flashinfer_backend.py:488-490)."""
    from sglang.srt.layers.radix_attention import RadixAttention

    runner = releases_kit.model_runner(case, dtype=torch.bfloat16, max_context_len=max_ctx,
                                       deterministic=use_paged and not releases.has_paged_switch())
    runner.sliding_window_size = cfg.window_left if cfg.window_left >= 0 else None
    releases.newer_release_attrs(runner)
    backend = fb.FlashInferAttnBackend(runner)
    layer = RadixAttention(case.num_qo_heads, case.head_dim, case.head_dim ** -0.5, case.num_kv_heads, layer_id=0,
                           logit_cap=cfg.logit_cap, sliding_window_size=cfg.window_left)
    return runner, backend, layer


def _run_layer(backend, layer, batch, n_tokens: int, case: Case):
    q = torch.randn(n_tokens, case.num_qo_heads * case.head_dim, dtype=torch.bfloat16)
    k = torch.randn(n_tokens, case.num_kv_heads * case.head_dim, dtype=torch.bfloat16)
    with releases.attach(backend, batch):
        layer(q, k, k.clone(), batch)


def _kit_batch(case: Case, runner, mode, max_ctx: int):
    kit = releases_kit.kit_module()
    return kit._make_forward_batch(releases_kit.kit_case(kit, case, mode), runner, max_context_len=max_ctx,
                                   device="cpu")


# ----------------------------------------------------------------------------- the paths
PREFIX, EXTEND, DRAFT = (20, 3), (24, 12), 4  # lengths past the window of 8, one request short


def _extend(fb, cfg, trace, prefix, use_paged: bool):
    case = _case(cfg, prefix, EXTEND)
    max_ctx = max(case.kv_lens)
    runner, backend, layer = _setup(fb, case, cfg, max_ctx, use_paged)
    _, batch, (q, k, v) = harness._inputs(case, runner, layer, dtype=torch.bfloat16, device="cpu", seed=0,
                                         max_context_len=max_ctx, kit=releases_kit.kit_module())
    with releases.attach(backend, batch):
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

        batch.spec_info = releases.build(
            EagleVerifyInput, draft_token=torch.zeros(n, dtype=torch.long), custom_mask=torch.ones(0, dtype=torch.bool),
            positions=batch.positions, retrieve_index=None, retrieve_next_token=None,
            retrieve_next_sibling=None, retrieve_cum_len=None, topk=1, draft_token_num=DRAFT, spec_steps=DRAFT - 1,
            capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq.clone())
    else:
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        batch.spec_info = DFlashVerifyInput(draft_token=torch.zeros(n, dtype=torch.long), positions=batch.positions,
                                            draft_token_num=DRAFT)
    releases.spec_info_defaults(batch.spec_info, DRAFT)
    return case, backend, layer, batch, n


def _verify(fb, cfg, trace, spec):
    case, backend, layer, batch, n = _verify_batch(fb, cfg, spec)
    backend.init_forward_metadata(batch)
    _run_layer(backend, layer, batch, n, case)


def _graph(fb, cfg, trace, mode: str, run: PathRun):
    """CUDA-graph capture then replay: ``init_cuda_graph_state`` (:860), then the capture's
    metadata call (``releases.graph_metadata``: ``init_forward_metadata_out_graph(in_capture=True)``,
    :646) and the captured forward, then the replay's metadata call on the same wrappers."""
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
    capture, replay = releases.graph_metadata(backend, batch, case.batch_size, n)
    capture()
    _run_layer(backend, layer, batch, n, case)
    mark = len(trace.calls)
    replay()
    run.graph_stage.update({i: "capture" for i in range(mark)})  # capture plans and the captured forward
    run.graph_stage.update({i: "replay" for i in range(mark, len(trace.calls))})


PATHS = {
    "extend_paged": dict(use_paged=True, fn=lambda fb, c, t, r: _extend(fb, c, t, PREFIX, True)),
    "extend_ragged_no_prefix": dict(use_paged=False, fn=lambda fb, c, t, r: _extend(fb, c, t, (0, 0), False)),
    "extend_ragged_prefix": dict(use_paged=False, fn=lambda fb, c, t, r: _extend(fb, c, t, PREFIX, False)),
    "decode": dict(use_paged=False, fn=lambda fb, c, t, r: _decode(fb, c, t)),
    "target_verify_eagle": dict(use_paged=False, fn=lambda fb, c, t, r: _verify(fb, c, t, "eagle")),
    "target_verify_dflash": dict(use_paged=False, fn=lambda fb, c, t, r: _verify(fb, c, t, "dflash")),
    "cuda_graph_decode": dict(use_paged=False, fn=lambda fb, c, t, r: _graph(fb, c, t, "decode", r)),
    "cuda_graph_extend": dict(use_paged=False, fn=lambda fb, c, t, r: _graph(fb, c, t, "extend", r)),
    "cuda_graph_verify": dict(use_paged=False, fn=lambda fb, c, t, r: _graph(fb, c, t, "verify", r)),
}


WHAT_IFS = {None: lambda fb: contextlib.nullcontext(), "patched": sglang_patch.patched,
            "unpatched": sglang_patch.unpatched}


def drive(path: str, cfg: LayerConfig, *, what_if: str | None = None) -> PathRun:
    """Run one path for one layer configuration of the importable sglang as it is (``what_if``:
    ``patched`` / ``unpatched`` swaps PR #31501's two methods in-process first); every wrapper call
    lands in the returned trace. A path not driven comes back with ``status`` and ``error``: absent
    from this release, raised inside the release's own code (file:line), or a harness failure."""
    spec = PATHS[path]
    trace = Trace(meta={"path": path, "layer": cfg.name, "what_if": what_if})
    run = PathRun(path, cfg, trace, cfg.window_left, cfg.logit_cap)
    releases.ensure_sgl_kernel()
    fb = harness.backend_module()
    absent = releases.absent_reason(path, fb)
    if absent:
        run.status, run.error = "absent", absent
        return run
    with audit_env(trace, fb, use_paged=spec["use_paged"]), WHAT_IFS[what_if](fb), torch.no_grad():
        try:
            spec["fn"](fb, cfg, trace, run)
        except Exception as e:  # said, never hidden: whose code raised, and where
            run.status, run.error = releases.explain_error(e)
    return run
