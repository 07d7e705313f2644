"""The vLLM table's architecture columns (``vllm.archs``): driven per release and GPU class, and their
section of ``docs/audit/vllm-releases.md`` (issue #41 item 4).

Why a section of its own: the table's named families are 5 columns; a release serves ~170 sliding-window
architectures, most of which the published configs cannot build (no config, no window by default: each
says why). One row per architecture that is driven (its cell per release, per GPU class), the rest
grouped by why they are not built, so that every architecture of every release has its answer.
"""

from __future__ import annotations

from swa_repro.vllm.audit import verdict as vv

NOT_BUILT = "not built"


def build(version: str, gpus, *, note=print, fix: str | None = None) -> dict:
    """One release's columns: ``{"columns": {arch: facts}, "cells": {gpu: {arch: cell}}}``; the
    columns asking the same parameters driven once (``archs.groups``), in one child."""
    from swa_repro.vllm import archs
    from swa_repro.vllm.audit.core import arch, run_release
    from swa_repro.vllm.provision import provision

    overlay, _ = provision(version)
    cols = archs.plan(version, overlay)
    drive, of = archs.groups(cols)
    doc = run_release(version, [d["family"] for d in drive], gpus, note=note, fix=fix, fams=drive)[0] \
        if drive else {"audits": {}}
    cells = {}
    for g in gpus:
        row = {}
        for a, c in cols.items():
            if "not_built" in c:
                row[a] = {"state": NOT_BUILT, "why": [c["not_built"]], "routes": [], "short": NOT_BUILT}
                continue
            fam = c["fam"]
            enc = fam.get("refused")  # checkpoint.encoder_refusal: not driven, vv.cell says so
            d = {} if enc else {"error": fam["error"]} if fam.get("error") else doc["audits"][arch(g)][of[a]]
            cell = vv.cell({**d, "family": fam})
            if cell["state"] == "refused" and any(x["sinks"] for x in fam["layers"].values()):
                cell["why"] = cell["why"] + [f"the model passes sinks: {fam['sources']['sinks']}", sink_line(overlay)]
            row[a] = {**cell, "short": "refused: encoder-only" if enc else vv.short(cell), "default_backend": d.get("platform", {}).get("default"),
                      "asked": {k: {"window_left": (x["sliding_window"] or 0) - 1, "cap": x["logits_soft_cap"],
                                    "scale": x["scale"], "sinks": x["sinks"], "hf_window_left": x["hf_window_left"]}
                                for k, x in fam["layers"].items()}}
        cells[g.name] = row
    facts = {a: {k: v for k, v in c.items() if k != "fam"} | ({"sources": c["fam"]["sources"], "driven_as": of.get(a)}
                                                               if "fam" in c else {}) for a, c in cols.items()}
    return {"columns": facts, "cells": cells}


BACKEND = "vllm/v1/attention/backends/flashinfer.py"


def sink_line(overlay) -> str:
    """Where the release's FlashInfer backend says whether it takes sinks (``supports_sink``; before it, the
    impl's own refusal: ``has_sinks``)."""
    from swa_repro.vllm import registry

    p = overlay / BACKEND
    hit = registry.line_of(overlay, [p], r"def supports_sink|if self\.has_sinks and") if p.is_file() else None
    return f"the backend: {hit}" if hit else f"the backend: {BACKEND} (no supports_sink line found)"


def lines(t: dict, gpus) -> list[str]:
    """The section: per GPU class, a row per driven architecture (a column per release; – where the
    release does not serve it with a window), then the architectures not built, grouped by why."""
    per = t.get("architectures") or {}
    if not per:
        return []
    versions = list(per)
    driven = sorted({a for v in versions for a, c in per[v]["columns"].items() if "not_built" not in c})
    out = ["## Every architecture a release serves with a sliding window (issue #41)", "",
           ("Found in each release's own files (`vllm/archs.py`: its registry's architectures whose attention "
            "files pass `per_layer_sliding_window`, or read `sliding_window` / `layer_types` / `use_sliding_window` "
            "off the config), the table's named families aside. Each is built from its published config "
            "(transformers' class defaults for the `model_type` naming it, else the release's own config class in "
            "`vllm/transformers_utils/configs` its model file imports) through the release's model-file lines "
            "(`vllm/checkpoint.py`, as `--model PATH`) and driven like a family; sinks are driven, and refused "
            "where the release's FlashInfer backend cannot take them. A row per architecture, a column per "
            "release; – : that release does not serve it with a window. The JSON's `architectures` has each "
            "column's config, window line and sources."), ""]
    for g in gpus:
        out += [f"### {g.name}", "", "| architecture | " + " | ".join(versions) + " |",
                "|---|" + "---|" * len(versions)]
        for a in driven:
            out.append(f"| {a} | " + " | ".join(per[v]["cells"][g.name][a]["short"] if a in per[v]["cells"][g.name]
                                                   and "not_built" not in per[v]["columns"][a] else "–"
                                                   for v in versions) + " |")
        out.append("")
    out += [f"### {NOT_BUILT} (the latest release that serves each, and why)", ""]
    latest = {}
    for v in versions:
        for a, c in per[v]["columns"].items():
            if "not_built" in c:
                latest[a] = (v, c["not_built"])
            elif a in latest:
                del latest[a]
    groups: dict = {}
    for a, (v, why) in sorted(latest.items()):
        kind = ("no sliding layer at the published defaults" if why.startswith("no sliding layer") else
                "no published config" if why.startswith("no published config") else None)
        groups.setdefault(kind or "not buildable", []).append((a, v, why))
    for kind, items in groups.items():
        if kind == "not buildable":
            out += [f"- {a} ({v}): {why}" for a, v, why in items]
        else:
            out.append(f"- {kind} ({len(items)}; audit a checkpoint with `--model PATH`): "
                       + ", ".join(f"{a} ({v})" for a, v, _ in items))
    return out + [""]
