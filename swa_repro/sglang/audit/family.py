"""A model family through release X's FlashInfer backend, at the family's real window (child side).

For each family (``audit.family_build``: the release's own ModelConfig, loader and model file, the
runner's ``sliding_window_size`` from the release's own model-runner code), one layer of each kind
transformers declares (sliding / full) is driven down every audit path (``audit.paths``) with:

* the release's test-kit runner carrying the release's ``ModelConfig`` and the derived window, the
  backend built as the release builds it (``FlashInferAttnBackend(runner)``) under the GPU class
  (:func:`gpu_env`: the release's own platform switch);
* the model's own ``RadixAttention`` (its window, cap, heads and head_dim), its id mapped to the
  kit's one-layer KV pool;
* batches past the window: extend ``prefix + extend`` with ``extend > window``, decode and verify
  over ``window + 256`` committed tokens, one request short.

What FlashInfer is told is read off the recorded calls (``audit.core.analyze``, ``plan_texts``);
the keys each query attends are counted as ranges (``audit.spans``) against the window transformers
intends for that layer kind, with what FlashInfer runs for each wrapper on that GPU class
(``families.GpuClass.resolve``); the cap is applied only where ``plan()`` carries it and the backend
applies one (cutlass does not: flashinfer 0.7.2 prefill.py:1815-1819, :5442-5460).
"""

from __future__ import annotations

import contextlib
import copy
import time
import types
from dataclasses import dataclass

import torch

from swa_repro.core.checkpoint_config import FULL, SLIDING
from swa_repro.engine.families import GpuClass, small_config
from swa_repro.sglang import harness, releases, releases_kit
from swa_repro.sglang.audit import calls as ac
from swa_repro.sglang.audit import core as audit_core
from swa_repro.sglang.audit import family_build as fbuild
from swa_repro.sglang.audit import family_live, hybrid_pool, rows, spans
from swa_repro.sglang.audit import keys as ak
from swa_repro.sglang.audit import paths as ap
from swa_repro.sglang.audit.env import RAGGED
from swa_repro.sglang.audit.gpu_backends import backend_of, cap_state, wrappers


def family_shape(layer, window: int) -> ap.Shape:
    """The family's heads; lengths past its window (HF's count): ragged no-prefix queries beyond
    it, paged prefixes, decode and verify over ``window + 256`` committed tokens."""
    return ap.Shape(num_qo_heads=int(layer.tp_q_head_num), num_kv_heads=int(layer.tp_k_head_num),
                    head_dim=int(layer.head_dim), prefix=(256, 3), extend=(window + 256, 40),
                    committed=(window + 256, 3))


def context_length(window: int) -> int:
    """The longest request any path builds, with margin: a server's ``--context-length``."""
    return window + 576


@dataclass(frozen=True, eq=False)
class FamilyLayer(ap.LayerConfig):
    """A model's own attention layer as a path drives it (``paths.LayerConfig``'s hooks)."""
    kind: str = SLIDING
    built: object = None  # family_build.Built
    attn: object = None  # the model's RadixAttention of this kind
    family_shape: ap.Shape = ap.SHAPE
    trace_values = False  # the audit reads indices, masks and parameters; q/k/v/KV by shape only
    hybrid = True  # a model the release serves on its hybrid SWA pool is driven on it (audit.hybrid_pool)

    @property
    def name(self) -> str:
        return f"{self.kind}:{ap.LayerConfig(self.window_left, self.logit_cap).name}"

    @property
    def shape(self) -> ap.Shape:
        return self.family_shape

    def setup(self, fb, case, max_ctx: int, device: str, use_paged: bool = False):
        """The kit's runner with the release's ModelConfig and derived window; the model's layer."""
        with untouched_kv_pools():
            runner = releases_kit.model_runner(case, dtype=torch.bfloat16, max_context_len=max_ctx, device=device,
                                               deterministic=use_paged and not releases.has_paged_switch())
            if self.hybrid and self.built.facts.get("is_hybrid_swa"):
                runner.hybrid_pool = hybrid_pool.HybridPool(runner, self.kind == SLIDING, self.built.runner_window)
        runner.model_config = self.built.model_config
        runner.sliding_window_size = self.built.runner_window
        runner.model = torch.nn.ModuleList(self.built.layers)  # a backend reading its layers finds the model's
        releases.newer_release_attrs(runner)
        layer = copy.copy(self.attn)
        layer.layer_id = 0  # the kit's pool holds one layer
        backend = fb.FlashInferAttnBackend(runner)
        if getattr(runner, "hybrid_pool", None) is not None:
            hybrid_pool.evict_before_plans(backend, runner.hybrid_pool)
        return runner, backend, layer

    def extend_inputs(self, case, runner, layer, max_ctx: int, device: str):
        """The kit's batch (contiguous slots); zero q/k/v on ``device``: the stand-ins never read values."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        batch = ap._kit_batch(case, runner, ForwardMode.EXTEND, max_ctx, device)
        return (batch, *(x.to(device) for x in self.inputs(sum(case.extend_lens), case)))

    def inputs(self, n_tokens: int, case):
        """Zero q, k, v in the runner's bf16, made once per shape in the process (no path writes
        into them)."""
        return tuple(_zeros(role, n_tokens, heads * case.head_dim)
                     for role, heads in (("q", case.num_qo_heads), ("k", case.num_kv_heads), ("v", case.num_kv_heads)))


@dataclass(frozen=True, eq=False)
class LiveFamilyLayer(FamilyLayer):
    """The same layer with data a kernel can be judged on (``audit.live``): seeded randn q/k/v and
    KV pool, as the synthetic audit's layers (``paths.LayerConfig``, ``paths._setup``), recorded by
    value. Slower and larger than :class:`FamilyLayer` (the pool is written whole)."""
    trace_values = True
    hybrid = False  # its batches come from harness._inputs, which the hybrid pool's allocator does not see

    def extend_inputs(self, case, runner, layer, max_ctx: int, device: str):
        return ap.LayerConfig.extend_inputs(self, case, runner, layer, max_ctx, device)

    def inputs(self, n_tokens: int, case):
        return ap.LayerConfig.inputs(self, n_tokens, case)

    def setup(self, fb, case, max_ctx: int, device: str, use_paged: bool = False):
        runner, backend, layer = super().setup(fb, case, max_ctx, device, use_paged)
        ap.fill_kv_pool(runner)
        return runner, backend, layer


_ZEROS: dict = {}


def _zeros(role: str, n: int, width: int):
    key = (role, n, width)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros(n, width, dtype=torch.bfloat16)
    return _ZEROS[key]


class _LazyPoolTorch(types.ModuleType):
    """``torch`` for the release's memory-pool module: a floating-point ``zeros`` (the KV buffers,
    hundreds of MB at a 4096 window with 64 KV heads) is ``empty``, whose pages the OS maps only
    where a path writes. The family audit reads the KV cache by shape only (``trace_values``);
    integer pools (``req_to_token``, whose entries the backend reads) stay zeros."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name != "zeros":
            return attr

        def zeros(*a, dtype=None, **kw):
            if (dtype or torch.get_default_dtype()).is_floating_point:
                return torch.empty(*a, dtype=dtype, **kw)
            return attr(*a, dtype=dtype, **kw)
        return zeros


@contextlib.contextmanager
def untouched_kv_pools():
    """:class:`_LazyPoolTorch` in ``sglang.srt.mem_cache.memory_pool`` while a runner is built
    (0.5.13 memory_pool.py:1010 ``_create_buffers``: ``torch.zeros`` per layer); restored after."""
    import importlib

    mp = importlib.import_module("sglang.srt.mem_cache.memory_pool")
    with harness._namespace(mp, {"torch": _LazyPoolTorch()}):
        yield


@contextlib.contextmanager
def gpu_env(fb, gpu: GpuClass):
    """The release's own switch for the GPU class: ``override_platform(is_sm100=...)`` (0.5.19+,
    runtime_context.py ``_PlatformOverride``; read at 0.5.23 flashinfer_backend.py:502), else the
    backend's ``is_sm100_supported()`` (0.5.14 :428)."""
    try:
        from sglang.srt.runtime_context import override_platform
    except ImportError:
        override_platform = None
    if override_platform is not None and hasattr(fb, "get_platform"):
        with override_platform(is_sm100=gpu.is_sm100):
            yield
        return
    with harness._namespace(fb, {"is_sm100_supported": lambda *a, **k: gpu.is_sm100}):
        yield


# ----------------------------------------------------------------------------- one run's record
def record(run, layer: FamilyLayer, intended: int, gpu: GpuClass, memo: dict | None = None) -> dict:
    """One path x layer kind: status, what the plans carried, backends, keys, verdict, cap, and the
    rows of its longest request as ranges (``audit.rows``: what a keys heatmap draws). ``memo``
    (one per family, its runs kept alive): the parts a GPU class cannot change, computed once per
    run (plans, findings) and once per run and :func:`spans.kernel_rule` of each call (keys, rows,
    verdicts: all that :func:`spans.kernel_ranges` reads of the backend a GPU class runs)."""
    d = {"path": run.path, "kind": layer.kind, "layer": layer.name}
    if run.error:
        return {**d, "status": run.status, "why": run.error}
    memo = {} if memo is None else memo
    be = backend_of(gpu)
    same_run = (id(run), intended)
    if same_run not in memo:
        memo[same_run] = {"plans": audit_core.plan_texts(run), "findings": [f.to_dict() for f in audit_core.analyze(run)]}
    same_ranges = (*same_run, tuple(spans.kernel_rule(p, p.plan[1], p.fwd[1], be(p, p.plan[1]))
                                    for p in ac.pairs(run)))
    if same_ranges not in memo:
        memo[same_ranges] = _keys(run, intended, be)
    common, k = copy.deepcopy(memo[same_run]), copy.deepcopy(memo[same_ranges])
    d.update(status="driven", plans=common["plans"], wrappers=wrappers(run, gpu), keys=k["keys"], rows=k["rows"],
             verdict=k["verdict"], cap=cap_state(run, gpu), findings=common["findings"])
    if "verdict_vs_layer" in k:
        d["verdict_vs_layer"] = k["verdict_vs_layer"]
    if "hybrid_pool" in run.snapshot:  # driven on the release's hybrid SWA pool (audit.hybrid_pool)
        d["hybrid_pool"] = run.snapshot["hybrid_pool"]
    return d


def _keys(run, intended: int, be) -> dict:
    """:func:`record`'s key counts, rows and verdicts of ``run`` against ``intended``."""
    stages = spans.stage_spans(run, intended, be)
    keys = spans.summary(stages)
    main = max(stages, key=lambda s: len(spans.stage_rows(stages[s])["rows"]), default=None)
    out = {"keys": keys, "rows": None if main is None else {"stage": main, **(rows.request_rows(stages[main]) or {})},
           "verdict": ak.verdict(keys)}
    if run.layer_window != intended:  # the same calls against the window the layer itself asked for
        out["verdict_vs_layer"] = ak.verdict(spans.keys_of_run(run, run.layer_window, be))
    return out


def reads_platform_once(fb) -> bool:
    """Whether the backend reads the platform switch once: the ragged wrapper's backend at
    construction (0.5.10 flashinfer_backend.py:249 ``is_sm100_supported()``, 0.5.23 :502
    ``get_platform().is_sm100``), so a path that plans and runs no ragged wrapper records the same
    calls on every GPU class and is driven once for all of them."""
    import inspect

    src = inspect.getsource(fb)
    return src.count("is_sm100_supported()") + src.count("get_platform().is_sm100") == 1


def uses_ragged(run) -> bool:
    """A run that could differ with the platform switch: it planned or ran the ragged wrapper, or
    was not driven (driven again, never assumed)."""
    return bool(run.error) or any(p.cls == RAGGED for p in ac.pairs(run))


# ----------------------------------------------------------------------------- one family
def layers_of(built, live: bool = False) -> list[FamilyLayer]:
    """The first layer of each kind transformers declares, as the model built it (``live``: as
    :class:`LiveFamilyLayer`, whose calls can be run on a kernel)."""
    small, out, cls = built.small, [], LiveFamilyLayer if live else FamilyLayer
    for kind in (SLIDING, FULL):
        attn = first_built(built.layers, small.kinds, kind)
        if attn is None:
            continue
        win = attn.sliding_window_size
        out.append(cls(-1 if win is None or win < 0 else int(win), float(attn.logit_cap or 0.0), kind, built,
                               attn, family_shape(attn, small.sliding_window or 0)))
    return out


def first_built(layers: tuple, kinds, kind: str):
    """The first attention layer the model built of ``kind``, or None. A model that builds every layer the
    config declares: the layer at that kind's first index. One that builds fewer (an MTP head: 0.5.23
    models/exaone_moe_mtp.py:47 ``config.num_hidden_layers = 1`` before it builds the decoder, so one layer,
    ``layer_types[0]``, of the 4 declared): the kind of each built layer is the config's at its ``layer_id``,
    and a kind it did not build is not driven (it has none)."""
    if kind not in kinds:
        return None
    if len(layers) >= len(kinds):
        return layers[list(kinds).index(kind)]
    return next((x for x in layers if 0 <= int(x.layer_id) < len(kinds) and kinds[int(x.layer_id)] == kind), None)


def audit_family(family: str, gpus, paths=None, jobs: list | None = None, small=None) -> dict:
    """Build ``family`` with the importable release once and drive every path x layer kind once
    per distinct platform switch (``gpu_env``: sm100 or not; sm80 and sm90 share the calls, which
    each GPU class then resolves to its own FlashInfer backend): ``{gpu name: document}``.
    ``jobs``: a list, to which each GPU class's driven records are queued (``audit.family_live.Job``)
    to be run on a kernel and judged against the float64 reference at the window and cap the family's
    config intends (``family_live.run_jobs``, which fills in each record's ``live``). ``small``: a
    checkpoint's config (``checkpoint.small_config``: the user's values) instead of the family's."""
    t0 = time.monotonic()
    small = small or small_config(family)
    built = fbuild.build(small, context_length(small.sliding_window or 0))
    t_build = time.monotonic() - t0
    layers = layers_of(built, live=jobs is not None)
    fb = harness.backend_module()
    device = ap.audit_device()  # where sglang itself dispatches its KV writes (paths.audit_device)
    todo = [(p, layer) for p in paths or ap.PATHS for layer in layers]
    out, first, one_switch = {}, None, reads_platform_once(fb)
    memo: dict = {}  # record()'s shared parts, keyed by id(run): every run stays alive in `kept`
    kept = []
    for is_sm100 in dict.fromkeys(g.is_sm100 for g in gpus):
        group = [g for g in gpus if g.is_sm100 == is_sm100]
        t1 = time.monotonic()
        with gpu_env(fb, group[0]):  # a later switch re-drives only what it can change
            done = [first[i] if first and one_switch and not uses_ragged(first[i]) else ap.drive(p, x, device=device)
                    for i, (p, x) in enumerate(todo)]
        first, runs = first or done, list(zip(done, (x for _, x in todo)))
        kept.append(done)
        t_drive = time.monotonic() - t1
        for gpu in group:
            t2 = time.monotonic()
            recs = [record(r, layer, small.intended_window if layer.kind == SLIDING else -1, gpu, memo)
                    for r, layer in runs]
            if jobs is not None:
                jobs.append(family_live.Job(recs, runs, small, gpu, memo))
            out[gpu.name] = _document(family, gpu, small, built, layers, recs,
                                      {"build": round(t_build, 1), "drive": round(t_drive, 1),
                                       "keys": round(time.monotonic() - t2, 1)})
    return out


def _document(family, gpu: GpuClass, small, built, layers, recs, seconds) -> dict:
    return {"family": family, "gpu": {"name": gpu.name, "cards": gpu.cards},
            "config": {"hf_class": small.hf_class or mc_name(family), "sliding_window": small.sliding_window,
                       "head_dim": small.head_dim,
                       "num_qo_heads": small.num_qo_heads, "num_kv_heads": small.num_kv_heads, "cap": small.cap,
                       "layers_built": len(small.kinds), "layers_published": small.full_layers,
                       "kinds": list(small.kinds)},
            "build": {"model_class": built.facts["model_class"], "model_file": built.model_file,
                      "runner_window": built.runner_window, "runner_rule": built.runner_rule,
                      "model_config": built.facts, "layers": [fbuild.layer_text(x) for x in built.layers]},
            "kinds": {x.kind: {"layer": fbuild.layer_text(x.attn), "layer_window": x.window_left,
                               "intended_window": small.intended_window if x.kind == SLIDING else -1,
                               "cap": x.logit_cap} for x in layers},
            "paths": recs, "seconds": seconds}


def mc_name(family: str) -> str:
    from swa_repro.engine.families import MODELS

    return MODELS[family][0]
