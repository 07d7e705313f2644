"""The tables notebook 01 shows, as typed rows (``show.Row``): which module ``plan()`` picks, what
the plan fixes, ``forward()`` vs ``run()``, which rows come out wrong, and each backend.
Display labels live in the field declarations and are applied only by ``show.table``.
"""

from __future__ import annotations

from dataclasses import dataclass

from swa_repro.core.case import Case
from swa_repro.kernel.model import simulate
from swa_repro.notebook.calls import call, module_uri
from swa_repro.notebook.show import Row, col
from swa_repro.notebook.story import matching_recordings, with_fix


def _statuses_by_version(recorded: dict) -> str:
    return "; ".join(f"fi {v}: {','.join(s)}" for v, s in recorded.items()) or "no recording"


@dataclass(frozen=True)
class ModuleRow(Row):
    case: str = col("case")
    backend: str = col("backend")
    plan_window_left: int = col("plan window_left")
    run_window_left: int = col("run window_left")
    use_sliding_window: bool = col("use_sliding_window")
    cta_tile_q: int | None = col("cta_tile_q")
    split_kv: bool = col("split_kv")
    status: list = col("status (model)")
    module: str | None = col("module", optional=True)  # model mode: named by flashinfer's uri rule
    live_module: str | None = col("module (live)", optional=True)
    live_use_sliding_window: bool | None = col("use_sliding_window (live)", optional=True)
    live_cta_tile_q: int | None = col("cta_tile_q (live)", optional=True)
    live_split_kv: bool | None = col("split_kv (live)", optional=True)

    @property
    def effective_use_sliding_window(self) -> bool:
        """What the module that runs does: the real one in live mode, else the model's."""
        return self.use_sliding_window if self.live_use_sliding_window is None else self.live_use_sliding_window

    @property
    def effective_module(self) -> str:
        return (self.live_module if self.live_module is not None else self.module) or ""


def module_table(cases, mode: str) -> list[ModuleRow]:
    """Per case: module chosen at plan (``use_sliding_window``), CTA_TILE_Q, split_kv, statuses."""
    rows = []
    for c in cases:
        m = simulate(c)
        s = m.summary()
        base = dict(case=c.name, backend=m.backend, plan_window_left=c.plan_window_left, run_window_left=c.window_left,
                    use_sliding_window=s["use_sliding_window"], cta_tile_q=s["cta_tile_q"], split_kv=s["split_kv"],
                    status=m.statuses)
        if mode == "live":
            r = call(c, "live")
            rows.append(ModuleRow(**base, live_module=r.module.get("uri"),
                                  live_use_sliding_window=r.module.get("use_sliding_window"),
                                  live_cta_tile_q=r.plan_info.get("cta_tile_q"),
                                  live_split_kv=r.plan_info.get("split_kv")))
        else:
            rows.append(ModuleRow(**base, module=module_uri(c)))
    return rows


@dataclass(frozen=True)
class PlanRow(Row):
    case: str = col("case")
    kv_lens: tuple = col("kv_lens")
    extend_lens: tuple = col("extend_lens")
    cta_tile_q: int | None = col("cta_tile_q")
    split_kv: bool = col("split_kv")
    kv_chunk_size: int | None = col("kv_chunk_size")
    chunks_planned: list = col("chunks planned")
    chunks_written: list = col("chunks written")
    status: list = col("status")


def plan_table(cases) -> list[PlanRow]:
    """The fa2 plan of each case (model): CTA_TILE_Q, split-KV, and per request the KV chunks the
    plan sized (merge_indptr, scheduler.cuh:101) vs the chunks the kernel writes with the run's
    window (prefill.cuh:2727-2728). A mismatch is the split-KV ``undefined`` status."""
    rows = []
    for c in cases:
        m = simulate(c)
        p = m.plan
        rows.append(PlanRow(c.name, c.kv_lens, c.extend_lens, p.cta_tile_q if p else None,
                            p.split_kv if p else False, p.kv_chunk_size if p and p.split_kv else None,
                            [r.num_chunks_plan for r in m.requests], [r.num_chunks_run for r in m.requests],
                            m.statuses))
    return rows


@dataclass(frozen=True)
class CallRow(Row):
    case: str = col("case")
    api: str = col("api")
    error: str | None = col("outcome", fmt=lambda e: e or "returned")
    max_err: list | None = col("max err vs reference", fmt=lambda e: e or None)

    @property
    def returned(self) -> bool:
        return self.error is None

    @property
    def asserted(self) -> bool:
        return (self.error or "").startswith("AssertionError")


def forward_vs_run(case: Case, mode: str, seed: int = 0) -> list[CallRow]:
    """sglang's ``forward(window_left=W)`` vs ``run(window_left=W)`` after the same plan."""
    rows = []
    for api in ("forward", "run"):
        r = call(case, mode, api, seed)
        rows.append(CallRow(case.name, f"{api}(window_left={case.window_left})", r.error, r.max_err))
    return rows


@dataclass(frozen=True)
class RowError(Row):
    """One query row of ``forward()``: its max |o - reference|, and the recorded GPU errors."""
    mode: str = col(None)
    req: int = col("req")
    row: int = col("row")
    status: str = col("status")
    extra_keys: int = col("extra keys")
    err: float = col("err ({mode})")
    gpu_err: dict = col("", expand="err (GPU, fi {key})", default_factory=dict)  # flashinfer version -> err


def row_error_table(case: Case, mode: str, seed: int = 0, recordings=()) -> list[RowError]:
    """Per request and row: max |o - reference| of ``forward()``; recorded GPU errors alongside."""
    r = call(case, mode, "forward", seed)
    m = simulate(case)
    recs = matching_recordings(case, recordings) if mode == "model" else []
    return [RowError(mode, i, q, m.requests[i].status, int(m.requests[i].extra_keys()[q]), float(e),
                     {rec.case.flashinfer_version: float(rec.requests[i].err_vs_reference[q]) for rec in recs})
            for i, err in enumerate(r.err_vs_reference) for q, e in enumerate(err)]


@dataclass(frozen=True)
class BackendRow(Row):
    mode: str = col(None)
    case: str = col("case")
    backend: str = col("backend")
    resolves_to: str = col("resolves to")
    plan_window_left: int = col("plan window_left")
    status: list = col("status (model)")
    max_extra_keys: list = col("max extra keys (model)")
    plain_causal: bool = col("plain causal (model)")
    wrong_rows: list | None = col("wrong rows ({mode})")  # None: see ``unavailable``
    unavailable: str | None = col(None)  # why this GPU cannot run the backend
    recorded: dict | None = col("recorded status", optional=True, fmt=_statuses_by_version)  # version -> statuses

    def cells(self) -> dict:
        c = super().cells()
        if self.unavailable:
            c[f"wrong rows ({self.mode})"] = self.unavailable
        return c


def backend_table(base: Case, mode: str, backends=("fa2", "fa3", "auto"), seed: int = 0,
                  recordings=()) -> list[BackendRow]:
    """Each backend planned without and with ``window_left``: the model's status and extra keys,
    the rows that come out wrong (live: real kernel; model: model wrapper) and, in model mode,
    the statuses of committed recordings of the same shapes; a backend this GPU cannot run says why."""
    rows = []
    stem = base.name.removesuffix("_bug").removesuffix("_fix") or "case"
    for b in backends:
        for fix in (False, True):
            c = with_fix(base.with_(backend=b, name=f"{stem}_{b}"), fix)
            m = simulate(c)
            wrong, why = None, None
            try:
                wrong = call(c, mode, "forward", seed).wrong_rows
            except Exception as e:  # e.g. fa3 on a GPU that is not sm90
                why = f"unavailable: {type(e).__name__}: {e}"[:120]
            recorded = ({r.case.flashinfer_version: list(r.statuses) for r in matching_recordings(c, recordings)}
                        if mode == "model" else None)
            rows.append(BackendRow(mode, c.name, b, c.resolved_backend, c.plan_window_left, m.statuses,
                                   [int(r.extra_keys().max()) for r in m.requests],
                                   all(bool((r.intervals.lo == 0).all()) for r in m.requests), wrong, why, recorded))
    return rows
