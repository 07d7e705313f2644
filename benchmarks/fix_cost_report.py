"""The report's section on the cost of the fix (issue #40): ``benchmarks/fix_cost.py``'s results file
rendered into tables, the goals computed from it (``fix_cost_plan.goals``), never written by hand.

The file: of ``benchmarks/results/fix_cost.json`` and every ``fix-cost.json`` under ``recordings/``
(what a GPU call's bench step returns), the one with the most measured cases, the newest of those: a
call cut short by its JIT builds does not hide a whole measurement.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks.fix_cost_plan import FULL_GOAL, SLIDING_GOAL, goals, step_ms

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "fix_cost.json"
COMMAND = "python benchmarks/fix_cost.py --out $ART/fix-cost.json"
PHASES = {"decode": "Decode (one step, 32 requests)", "prefill": "Prefill (one request, ragged, no prefix)",
          "verify": "EAGLE verify (8 requests, 8 draft tokens, past the window)"}


def find(root: Path = ROOT) -> Path | None:
    """The results file the report renders (module docstring)."""
    root, found = Path(root), []
    for p in [root / "benchmarks" / "results" / "fix_cost.json", *sorted((root / "recordings").glob("**/fix-cost.json"))]:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        measured = sum(1 for r in doc.get("records", []) if not r.get("error"))
        found.append((measured, doc.get("provenance", {}).get("date") or "", str(p), p))
    return max(found)[3] if found else None


def _ms(x):
    return "–" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.2f}")


def _r(x):
    return "–" if x is None else f"{x:.3f}"


def _verdict(met) -> str:
    return "not measured" if met is None else ("**met**" if met else "**NOT met**")


def goal_lines(g: dict) -> list[str]:
    """One line per goal, for all fixes and for the window fixes alone (without the soft cap)."""
    out = []
    for pre, what in (("", "all fixes (window + soft cap)"), ("window_", "the window fixes alone (no soft cap)")):
        for layer, goal, text in (("full", FULL_GOAL, f"full-attention layers within {FULL_GOAL:.0%} of shipped"),
                                  ("sliding", SLIDING_GOAL, "sliding-window layers no slower than shipped")):
            w = g[f"worst_{pre}{layer}"]
            worst = (f"; worst fixed / shipped {w[pre + layer]:.3f} ({w['key']}, noise {w[pre + layer + '_tol']:.3f})"
                     if w else "")
            out.append(f"- {what}: {text} (ratio <= {1 + goal:g} + the rounds' noise): "
                       f"{_verdict(g[f'{pre}{layer}_met'])}{worst}")
    return out


def phase_table(doc: dict, g: dict, phase: str) -> list[str]:
    recs = [r for r in doc.get("records", []) if r.get("phase") == phase and not r.get("error")]
    if not recs:
        return []
    per = {c["key"]: c for c in g["cases"]}
    window = any("window_full_ms" in r for r in recs)
    head = ("| case | sliding shipped | sliding fixed | ratio | full shipped | full fixed | ratio | plan shipped | "
            "plan fixed | step shipped | step fixed | ratio |")
    extra = " mask cut (fixed) |" if phase == "verify" else ""
    extra += " sliding window-only | ratio | full window-only | ratio |" if window else ""
    lines = [f"#### {PHASES[phase]}", "", head + extra, "|" + "---|" * (head.count("|") - 1 + extra.count("|"))]
    for r in recs:
        c, shape = per[r["key"]], doc["models"][r["model"]]
        row = (f"| {r['key']} | {_ms(r['shipped_sliding_ms'])} | {_ms(r['fixed_sliding_ms'])} | {_r(c['sliding'])} | "
               f"{_ms(r['shipped_full_ms'])} | {_ms(r['fixed_full_ms'])} | {_r(c['full'])} | "
               f"{_ms(r['shipped_plan_ms'])} | {_ms(r['fixed_plan_ms'])} | {_ms(step_ms(shape, r, 'shipped'))} | "
               f"{_ms(step_ms(shape, r, 'fixed'))} | {_r(c['step'])} |")
        if phase == "verify":
            row += f" {_ms(r.get('fixed_mask_cut_ms'))} |"
        if window:
            has = "window_full_ms" in r
            row += (f" {_ms(r.get('window_sliding_ms'))} | {_r(c['window_sliding'] if has else None)} | "
                    f"{_ms(r.get('window_full_ms'))} | {_r(c['window_full'] if has else None)} |")
        lines.append(row)
    return lines + [""]


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def findings(doc: dict) -> list[str]:
    """What the tables say, each a median over the cases that measured it."""
    recs = [r for r in doc.get("records", []) if not r.get("error")]
    ratio = lambda a, b: a / b if a and b else None
    cap = _median([ratio(r.get("fixed_full_ms"), r.get("window_full_ms")) for r in recs if r["phase"] != "decode"])
    long = _median([ratio(r.get("fixed_sliding_ms"), r.get("shipped_sliding_ms")) for r in recs
                    if r["phase"] == "prefill" and r.get("tokens", 0) > doc["models"][r["model"]]["window_left"] + 1])
    alone = _median([ratio(r.get("window_full_ms", r.get("fixed_full_ms") if not doc["models"][r["model"]]["cap"]
                                 else None), r.get("shipped_full_ms")) for r in recs])
    cut = _median([r.get("fixed_mask_cut_ms") for r in recs if r["phase"] == "verify"])
    plan = _median([r["fixed_plan_ms"] - r["shipped_plan_ms"] for r in recs if r["phase"] == "verify"])
    out = []
    if cap:
        out.append(f"- The soft cap, planned at last, costs full-attention layers {cap - 1:+.1%} "
                   "(fixed / window-only: prefill and verify of the capped model).")
    if alone:
        out.append(f"- The window fixes alone (no cap planned): full-attention layers take {alone:.3f}x their "
                   "shipped time.")
    if long:
        out.append(f"- Prefill longer than the window: a sliding-window layer takes {long:.2f}x its shipped time "
                   "(the window lets the kernel skip KV tiles).")
    if cut is not None and plan is not None:
        out.append(f"- Verify: the fix's plan takes {plan:+.2f} ms per step, of which the tree-mask cut "
                   f"(`_spec_tree_mask_in_window`, per step, on the GPU) {cut:.2f} ms.")
    return out + [""] if out else []


def render_fix_cost(path: Path | None = None, root: Path = ROOT) -> list[str]:
    lines = ["## GPU: the cost of the fix (issue #40)", ""]
    path = path or find(root)
    if path is None:
        return lines + [f"Not measured yet: run `{COMMAND}` on the GPU and commit the file as "
                        "`benchmarks/results/fix_cost.json` (or under `recordings/`).", ""]
    doc = json.loads(Path(path).read_text())
    p, g = doc.get("provenance", {}), goals(doc)
    where = Path(path).resolve().relative_to(Path(root).resolve()) if Path(path).resolve().is_relative_to(
        Path(root).resolve()) else Path(path).name
    lines += [f"From `{where}`: {p.get('gpu')} (driver {p.get('driver')}), torch {p.get('torch')} (CUDA {p.get('cuda')}), "
              f"flashinfer {p.get('flashinfer')}, {p.get('date')}; {doc.get('status')}, {doc.get('elapsed_s')} s of a "
              f"{doc.get('budget_s')} s budget. Command: `{p.get('command')}`.", "",
              "Per layer, the median ms of one attention call (CUDA events, groups after warm-up, shipped and fixed "
              "alternating over rounds); plan: wall ms of one step's plans of the wrappers the fix changes, and a sync "
              "(prefill: the two ragged plans; decode: the two decode plans; verify: the two paged plans with their "
              "mask packing, and the fix's tree-mask cut; not timed: building the KV indices, the same in both); "
              "step: every layer's call plus the plans. Shipped = how sglang 0.5.23 plans FlashInfer's wrappers, fixed = "
              "how `swa-repro patch --fix all` plans them (`benchmarks/fix_cost_plan.py` cites each line). Fixed "
              "outputs differ from shipped ones on purpose: shipped ignores the window and the soft cap.", "",
              "Verify: shipped, both wrappers share one packed-mask buffer (sglang's CUDA-graph wrappers), "
              "the sliding one listing each request's first window keys; fixed, one buffer per wrapper, the whole "
              "sequence, and the tree mask cut to the window in the plan (its own column).", "",
              "### Goals (computed from the file)", "", *goal_lines(g), "", *findings(doc)]
    lines += ["### Models", "", "| model | layers | sliding (window_left) | full | heads q:kv | head_dim | soft cap |",
              "|---|---|---|---|---|---|---|"]
    for m, s in doc.get("models", {}).items():
        lines.append(f"| {m} | {s['layers']} | {s['sliding']} ({s['window_left']}) | {s['full']} | "
                     f"{s['num_qo_heads']}:{s['num_kv_heads']} | {s['head_dim']} | {s['cap']:g} |")
    lines += ["", f"Shapes from {doc.get('models_source')}.", "", "### Per case (ms; ratio = fixed / shipped)", ""]
    for phase in PHASES:
        lines += phase_table(doc, g, phase)
    lines += ["### Modules (JIT build seconds in this run; ~0: already built)", "", "| module | s | note |", "|---|---|---|"]
    lines += [f"| {m} | {e.get('s', '–')} | {e.get('error', '')} |" for m, e in (doc.get("jit") or {}).items()]
    errs = [r for r in doc.get("records", []) if r.get("error")]
    if errs:
        lines += ["", f"### Not measured ({len(errs)} cases)", ""] + [f"- {r['key']}: {r['error']}" for r in errs]
    return lines + [""]
