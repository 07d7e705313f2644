"""What an audit's findings say to a reader: which public report holds (``REPORTS``: read off the
recorded findings, never assumed), the findings grouped for a table, and what a user of each model
should do. Split from ``audit.core`` by idea (#39): the audit makes the findings, this module
reads ``core.AuditResult`` / ``core.Finding`` by their fields only and imports nothing of the audit,
so ``audit.core`` can keep these names for its callers (notebook 05, ``audit.cli``) without a cycle.
"""

from __future__ import annotations

# The public reports, the path that can show each, and the finding that would; read off the
# recorded findings, never assumed.
REPORTS = {
    "sglang #31501 (this project): paged-only prefill plans the SWA wrapper without window_left":
        ("extend_paged", lambda f: f.parameter == "window_left" and f.effect == "wrong"),
    "sglang #35208: DFlash verify plans without the window":
        ("target_verify_dflash", lambda f: f.parameter == "window_left" and f.effect == "wrong"),
    "sglang #33915/#34093: ragged prefill without a prefix drops window_left":
        ("extend_ragged_no_prefix", lambda f: f.parameter == "window_left" and f.effect == "wrong"),
    "sglang #33915/#34093: logits_soft_cap reaches only forward() (soft-capped models run uncapped)":
        (None, lambda f: f.parameter == "logits_soft_cap" and f.effect == "wrong"),
}


def reports(results: list) -> list[dict]:
    """For each report and each audit run (keyed by its label): holds / does not hold / not
    driven, with the findings that show it."""
    rows = []
    for name, (path, pred) in REPORTS.items():
        row = {"report": name}
        for r in results:
            hits = [f for f in r.findings if (path is None or f.path == path) and pred(f)]
            driven = any(path is None or d["path"] == path for d in r.driven)
            row[r.label] = {
                "holds": bool(hits) if driven else None,
                "evidence": sorted({f"{f.path}/{f.layer}: {f.wrapper} plan={f.plan_value} "
                                    f"forward={f.forward_value} ({f.stage})" for f in hits})[:6]
                if driven else [f"{path} not driven: " + "; ".join(
                    sorted({d['why'] for d in r.not_driven if d['path'] == path}))]}
        rows.append(row)
    return rows


def verdict(v: dict) -> str:
    return {True: "holds", False: "does not hold", None: "not driven"}[v["holds"]]


def report_table(findings: list) -> list[dict]:
    """Findings (objects or their dicts) grouped by (path, parameter, wrapper class, effect)."""
    groups: dict[tuple, dict] = {}
    for f in findings:
        f = f if isinstance(f, dict) else f.to_dict()
        key = (f["path"], f["parameter"], f["wrapper"].split("#")[0], f["kind"], f["effect"])
        g = groups.setdefault(key, {"path": f["path"], "parameter": f["parameter"],
                                    "wrapper": f["wrapper"].split("#")[0], "kind": f["kind"],
                                    "effect": f["effect"], "plan": f["plan_value"], "forward": f["forward_value"],
                                    "layers": [], "stages": set(), "consequence": f["consequence"]})
        g["layers"].append(f["layer"])
        g["stages"].add(f["stage"])
    return [{**g, "layers": ",".join(sorted(set(g["layers"]))), "stages": ",".join(sorted(g["stages"]))}
            for g in groups.values()]


# ----------------------------------------------------------------------------- advice per model
def _has(result, path: str | None, param: str, window_layer: bool | None = None) -> bool:
    if result is None:
        return False
    return any((path is None or f.path == path) and f.parameter == param and f.effect == "wrong"
               and (window_layer is None or f.layer.startswith("swa") == window_layer) for f in result.findings)


def advice(specs, unpatched, patched) -> list[dict]:
    """What a user of each model should do, derived from the audit's findings (``unpatched``: a
    release without PR #31501, e.g. an unfixed one as installed; ``patched``: with it) and the
    model's sglang config."""
    rows = []
    for s in specs:
        todo = []
        if not s.has_window:
            todo.append(f"sglang serves it without a sliding window ({s.window_rule}); this bug does not "
                        "apply, but outputs beyond the window differ from the HF reference")
        else:
            if _has(unpatched, "extend_paged", "window_left", True) and not _has(patched, "extend_paged", "window_left", True):
                todo.append("upgrade to sglang >= 0.5.16 or apply `swa-repro patch apply`; until then avoid "
                            "SGLANG_FLASHINFER_USE_PAGED=1, deterministic inference, piecewise CUDA graph and "
                            "multimodal inputs (the paged-only prefill routes)")
            if _has(patched, "extend_ragged_no_prefix", "window_left", True):
                todo.append("prompts longer than the window without a cached prefix take the ragged path, which "
                            "drops the window even with the fix (sglang #33915/#34093)")
            if _has(patched, "target_verify_dflash", "window_left", True):
                todo.append("avoid DFlash speculative decoding on this model: verify plans without the window "
                            "(sglang #35208)")
            if _has(patched, "target_verify_eagle", "window_left", True):
                todo.append("EAGLE verify also plans its SWA wrapper without the window (tree mask only)")
        if s.logit_cap > 0 and _has(patched, None, "logits_soft_cap"):
            todo.append(f"its soft cap ({s.logit_cap:g}) never reaches a FlashInfer plan: logits run uncapped on "
                        "every FlashInfer path; use an attention backend that applies the cap until "
                        "sglang #34093 lands")
        if s.has_window and s.sliding_window is not None and s.window_left == s.sliding_window:
            todo.append(f"sglang passes sliding_window={s.sliding_window} unchanged as window_left "
                        f"({s.window_rule}): one key more than HF's inclusive window")
        rows.append({"model": s.name, "window_left": s.window_left, "soft_cap": s.logit_cap, "do": todo})
    return rows
