"""Finding classes and the release table (``docs/audit/releases.md`` + ``releases.json``).

A finding class is a (parameter, set of paths, kind of layer) question asked of one audit run:
does the layer's window / soft cap fail to reach ``plan()`` with a visible effect? Each cell is
derived from the run's *recorded calls* only:

* ``holds``: some finding of the class has effect ``wrong`` (evidence: the recorded plan call and
  the forward call that shows the drop);
* ``fixed``: every path of the class was driven on the relevant layers and none shows it (evidence:
  what the recorded plan calls carried);
* ``absent``: the release has none of the class's paths (``releases.absent_reason``);
* ``not driven``: otherwise, with why (the release's own code raised, file:line, or the harness
  could not drive it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from swa_repro.core.outputs import write_atomic
from swa_repro.engine.provenance import TABLE_DIR
from swa_repro.engine.provenance import provenance as engine_provenance
from swa_repro.sglang.audit.spec import GRAPH_TREE_PATHS, TREE_PATHS

VERIFY = ("target_verify_eagle", *TREE_PATHS, "target_verify_ngram")  # the tree shapes: audit.spec
GRAPH_VERIFY = ("cuda_graph_verify", *GRAPH_TREE_PATHS, "cuda_graph_verify_ngram")
PREFILL = ("extend_paged", "extend_ragged_no_prefix", "extend_ragged_prefix", *VERIFY, "target_verify_dflash")
GRAPH = ("cuda_graph_decode", "cuda_graph_extend", *GRAPH_VERIFY)
_PATH_ORDER = ("extend_paged", "extend_ragged_no_prefix", "extend_ragged_prefix", "decode", *VERIFY,
               "target_verify_dflash", *GRAPH)


@dataclass(frozen=True)
class FindingClass:
    title: str
    parameter: str  # window_left | logits_soft_cap
    paths: tuple


CLASSES = {
    "paged_only_window": FindingClass("paged-only window (#31501)", "window_left", ("extend_paged",)),
    "dflash_verify_window": FindingClass("DFlash verify window (#35208)", "window_left", ("target_verify_dflash",)),
    "eagle_verify_window": FindingClass("EAGLE / NGRAM verify window", "window_left", (*VERIFY, *GRAPH_VERIFY)),
    "ragged_no_prefix_window": FindingClass("ragged no-prefix window", "window_left", ("extend_ragged_no_prefix",)),
    "ragged_prefix_window": FindingClass("ragged-with-prefix window", "window_left", ("extend_ragged_prefix",)),
    "soft_cap_prefill": FindingClass("logits_soft_cap, prefill", "logits_soft_cap", PREFILL),
    "soft_cap_decode": FindingClass("logits_soft_cap, decode", "logits_soft_cap", ("decode",)),
    "soft_cap_cuda_graph": FindingClass("logits_soft_cap, CUDA graph", "logits_soft_cap", GRAPH),
}


def _layer_has(layer: str, parameter: str) -> bool:
    """Layer names from ``audit.paths.LayerConfig.name``: swa8_cap50, full_cap50, swa8, full."""
    if layer == "all":
        return True
    return layer.startswith("swa") if parameter == "window_left" else "_cap" in layer


def evidence_of(f: dict) -> str:
    ev = f.get("evidence", {})
    calls = f"{ev['plan_call']} then {ev['forward_call']}" if "plan_call" in ev else \
        f"plan={f['plan_value']} forward={f['forward_value']}"
    extra = f"; the layer's {f['parameter']}={f['layer_value']} reaches neither call" if f["kind"] == "dropped" else ""
    extra += f"; {ev['pairs_outside_window']} (row, key) pairs outside the window visible" \
        if ev.get("pairs_outside_window") else ""
    return f"{f['path']}/{f['layer']}: {f['wrapper'].split('#')[0]}.{calls} [{f['stage']}]{extra}"


def cell(run: dict, key: str) -> dict:
    """One class's cell for one audit run (``AuditResult.to_dict()``)."""
    c = CLASSES[key]
    rel = c.paths
    hits = [f for f in run["findings"] if f["path"] in rel and f["parameter"] == c.parameter
            and f["effect"] == "wrong" and _layer_has(f["layer"], c.parameter)]
    if hits:
        return {"state": "holds", "evidence": sorted({evidence_of(f) for f in hits})[:4]}
    nd = [d for d in run["not_driven"] if d["path"] in rel and _layer_has(d["layer"], c.parameter)]
    driven = [d for d in run["driven"] if d["path"] in rel and _layer_has(d["layer"], c.parameter)]
    if driven and all(d["status"] == "absent" for d in nd) and any(d.get("plans") for d in driven):
        ev = sorted({f"{d['path']}/{d['layer']}: {p}" for d in driven for p in d["plans"]})
        unset = tuple(f"{c.parameter}{v}" for v in (" not passed", "=-1", "=None", "=0.0"))
        ev = [e for e in ev if not any(u in e for u in unset)] or ev  # the plans that carry it, first
        return {"state": "fixed", "evidence": ev[:4] + [f"absent: {d['path']}" for d in nd][:1]}
    if not driven and nd and all(d["status"] == "absent" for d in nd):
        return {"state": "absent", "evidence": sorted({d["why"] for d in nd})}
    return {"state": "not driven", "evidence": sorted({f"{d['path']}/{d['layer']}: {d['status']}: {d['why']}"
                                                        for d in nd})[:4]
            or [f"{d['path']}/{d['layer']}: driven, but no plan() call recorded" for d in driven][:4]}


def cells(run: dict) -> dict:
    return {k: cell(run, k) for k in CLASSES}


# ----------------------------------------------------------------------------- the committed table
REQUIRED = ("0.5.10", "0.5.12", "0.5.14", "0.5.15.post1", "0.5.16", "0.5.19", "0.5.23")


def row_of(doc: dict) -> dict:
    rel = doc["release"]
    return {"sglang": rel["sglang"], "backend_state": rel["state"],
            "flashinfer_pin": rel.get("overlay_info", {}).get("flashinfer_pin"),
            "sglang_modules_from_overlay": rel.get("sglang_modules_from_overlay"),
            "paths_driven": sorted({d["path"] for d in doc["driven"]}),
            "cells": cells(doc), "keys": key_cells(doc)}


def key_cells(doc: dict) -> dict:
    """Per path, the keys a sliding-window layer's queries really attend (``audit.keys``, window 8,
    with and without a cap): verdict, queries seeing keys outside the window, the most extra
    keys per query, intended keys never read, keys from other requests' slots."""
    out = {}
    for d in doc["driven"]:
        if d["layer"].startswith("swa") and "keys" in d:
            ks = d["keys"].values()
            cur = {"verdict": d["key_verdict"], "queries": sum(s["queries"] for s in ks),
                   "queries_with_extra": sum(s["queries_with_extra"] for s in ks),
                   "max_extra_per_query": max((s["max_extra_per_query"] for s in ks), default=0),
                   "missing_keys": sum(s["missing_keys"] for s in ks), "foreign_keys": sum(s["foreign_keys"] for s in ks)}
            prev = out.get(d["path"])
            if prev is None or (prev["verdict"] == "exact" and cur["verdict"] != "exact"):
                out[d["path"]] = cur
    return out


def key_text(c: dict | None) -> str:
    if c is None:
        return "-"
    if c["verdict"] == "exact":
        return "exact"
    parts = [c["verdict"]]
    if c["queries_with_extra"]:
        parts.append(f"{c['queries_with_extra']}/{c['queries']} q, <= {c['max_extra_per_query']} extra")
    if c["missing_keys"]:
        parts.append(f"{c['missing_keys']} missing")
    if c["foreign_keys"]:
        parts.append(f"{c['foreign_keys']} foreign")
    return ": ".join(parts[:1]) + (" " + ", ".join(parts[1:]) if len(parts) > 1 else "")


HOW = ("each release's own sglang package (an overlay: uv pip install --no-deps --target) first on "
       "sys.path of this venv, in its own subprocess; every loaded sglang module checked to come "
       "from the overlay; FlashInfer's wrappers replaced by recording stand-ins (CPU)")


def provenance(command: str, docs: list[dict]) -> dict:
    """``engine.provenance``'s, in sglang's words, with each release's timings."""
    return {**engine_provenance(command, HOW),
            "timings_s": {d["release"]["sglang"]: {k: d["release"].get(k) for k in
                                                   ("import_seconds", "audit_seconds", "child_seconds")}
                          | {"install_seconds": d["release"].get("overlay_info", {}).get("install_seconds")}
                          for d in docs}}


def build_table(versions, *, jobs: int = 1, command: str = "", note=print, fixes=None) -> dict:
    """Audit each release in its own subprocess (``jobs`` at a time) and tabulate; ``fixes``: each
    release with these ``swa-repro patch --fix`` fixes applied to a copy (``fix.overlay``)."""
    from concurrent.futures import ThreadPoolExecutor

    from swa_repro.sglang.audit.release import audit_release

    def one(v):
        try:
            return audit_release(v, fixes=fixes, note=note)
        except UsageError as e:  # a release this machine cannot install or import: a row that says so
            note(f"sglang {v}: {e}")
            return {"release": {"sglang": v, "state": "unknown", "error": str(e)}, "findings": [], "driven": [],
                    "not_driven": [{"path": p, "layer": "all", "status": "harness", "why": str(e)}
                                   for c in CLASSES.values() for p in c.paths]}

    from swa_repro.core.errors import UsageError

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        docs = list(ex.map(one, versions))
    from dataclasses import asdict

    from swa_repro.sglang import serving_path

    paths = serving_path.release_table(versions)  # each release's own server_args / backend source
    return {"provenance": provenance(command, docs), "fixes": list(fixes or []),
            "classes": {k: c.title for k, c in CLASSES.items()},
            "rows": [row_of(d) for d in docs],
            "serving_paths": {v: [asdict(fp) for fp in fps] for v, fps in paths.items()}}


def write_table(table: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "releases.json", out / "releases.md"
    write_atomic(js, (json.dumps(table, indent=1, sort_keys=False) + "\n").encode())  # never a half-written table
    write_atomic(md, markdown(table).encode())
    return md, js


def markdown(table: dict) -> str:
    pv, classes = table["provenance"], table["classes"]
    title = "# Which sglang release has which plan/forward finding"
    if table.get("fixes"):
        title += f", with `swa-repro patch --fix {','.join(table['fixes'])}` applied"
    lines = [title,
             "",
             "Generated by `" + pv["command"] + "` on " + pv["date"] + f" (swa-repro {pv['swa_repro_commit']}, "
             f"python {pv['python']}, torch {pv['torch']}, base flashinfer {pv['base_flashinfer']}). "
             "Do not edit: regenerate.",
             "",
             "How: " + pv["how"] + ". Each cell comes from that release's recorded wrapper calls: "
             "**holds** (a parameter the layer asks for reaches `forward()` but not `plan()`, with a visible "
             "effect), **fixed** (it reaches `plan()`), **absent** (no such path in that release), "
             "**not driven** (with why).",
             "",
             "Per model family and GPU class, at each family's real window and with its own layers as the "
             "release builds them: [families.md](" + ("../" if table.get("fixes") else "") + "families.md) "
             "(`swa-repro audit --sglang X --model FAMILY --gpu G`).",
             "",
             "vLLM's FlashInfer backend, per release, family and GPU class (issue #27): [vllm-releases.md]("
             + ("../" if table.get("fixes") else "") + "vllm-releases.md) (`swa-repro audit --vllm X --model "
             "FAMILY --gpu G`).",
             "",
             "| sglang | flashinfer pin | backend | " + " | ".join(classes.values()) + " |",
             "|---|---|---|" + "---|" * len(classes)]
    for r in table["rows"]:
        lines.append(f"| {r['sglang']} | {r['flashinfer_pin']} | {r['backend_state']} | "
                     + " | ".join(r["cells"][k]["state"] for k in classes) + " |")
    paths = sorted({p for r in table["rows"] for p in r.get("keys", {})}, key=_PATH_ORDER.index)
    lines += ["", "## Keys each query attends (sliding-window layer, window 8)", "",
              "From the same recorded calls, per path: each call's KV mapped back to token positions through "
              "sglang's req-to-token pool, the keys FlashInfer lets each query see (the window only if compiled "
              "in at plan; fa2's tile-granular start from the kernel model) against the keys the layer intends "
              "(`swa_repro.sglang.audit.keys`). **extra**: queries that see keys outside their window (how many "
              "of all, the most extra keys per query); **missing**: intended keys no call lets a query see; "
              "**foreign**: keys from slots that are not the request's; **exact**: neither.", "",
              "| sglang | " + " | ".join(paths) + " |", "|---|" + "---|" * len(paths)]
    lines += [f"| {r['sglang']} | " + " | ".join(key_text(r.get("keys", {}).get(p)) for p in paths) + " |"
              for r in table["rows"]]
    if table.get("serving_paths"):  # which of these paths a default server takes, per model family
        from swa_repro.sglang import serving_path

        lines += ["", serving_path.render_markdown({v: [serving_path.FamilyPath(**fp) for fp in fps]
                                                     for v, fps in table["serving_paths"].items()}).rstrip()]
    lines += ["", "## Evidence (recorded calls)", ""]
    for r in table["rows"]:
        lines.append(f"### sglang {r['sglang']}")
        lines.append("")
        for k, title in classes.items():
            c = r["cells"][k]
            lines.append(f"- **{title}: {c['state']}**")
            lines += [f"  - `{e}`" for e in c["evidence"]]
        lines.append("")
    t = pv["timings_s"]
    lines += ["## Timings (s, this machine)", "", "| sglang | overlay install | first import | audit | subprocess |",
              "|---|---|---|---|---|"]
    lines += [f"| {v} | {x['install_seconds']} | {x['import_seconds']} | {x['audit_seconds']} | {x['child_seconds']} |"
              for v, x in t.items()]
    return "\n".join(lines) + "\n"


def committed(path: Path | None = None) -> dict | None:
    p = path or TABLE_DIR / "releases.json"
    return json.loads(p.read_text()) if p.is_file() else None


def committed_row(version: str, path: Path | None = None) -> dict | None:
    t = committed(path)
    return next((r for r in t["rows"] if r["sglang"] == version), None) if t else None


# ----------------------------------------------------------------------------- for `swa-repro doctor`
AFFECTED = {"holds": "affected", "fixed": "not affected (fixed)", "absent": "not affected (path absent)",
            "not driven": "unknown (not driven)"}


def installed_summary() -> dict:
    """The installed sglang's backend state, computed live from its file, and its row of the
    committed table (None when the table has no such release)."""
    from importlib import metadata

    from swa_repro.core.errors import UsageError
    from swa_repro.sglang.patch.classify import classify
    from swa_repro.sglang.patch.files import installed_path

    try:
        path = installed_path()
        version = metadata.version("sglang")
    except (UsageError, metadata.PackageNotFoundError) as e:
        return {"error": str(e)}
    try:
        state = classify(path.read_text()).state
    except Exception as e:  # never let doctor crash on an odd file
        state = f"unknown ({type(e).__name__})"
    row = committed_row(version)
    classes = {k: {"title": c.title, "state": row["cells"][k]["state"] if row else None,
                   "command": f"swa-repro audit --paths {','.join(c.paths)}"} for k, c in CLASSES.items()}
    return {"sglang": version, "backend_file": str(path), "state": state,
            "table_row_state": row["backend_state"] if row else None, "classes": classes if row else None}


def summary_lines(s: dict) -> list[str]:
    if "error" in s:
        return [f"findings    {s['error']}"]
    from swa_repro.sglang.patch.classify import state_text

    lines = [f"backend     {state_text(s['state'])}  ({s['backend_file']})"]
    if s["classes"] is None:
        return lines + [f"findings    sglang {s['sglang']} has no row in docs/audit/releases.md; derive them: "
                        "`swa-repro audit`"]
    lines.append(f"findings    sglang {s['sglang']}, from docs/audit/releases.md; re-derive: `swa-repro audit`")
    if s["state"] != s["table_row_state"]:
        said = {"fixed": "with PR #31501", "unfixed": "without PR #31501"}
        lines.append(f"            (the row is for the file as released, {said.get(s['table_row_state'], '?')}; this "
                     f"one is {said.get(s['state'], s['state'])}: run `swa-repro audit` for what it does now)")
    for c in s["classes"].values():
        lines.append(f"  {c['title']:<30} {AFFECTED[c['state']]:<28} `{c['command']}`")
    return lines
