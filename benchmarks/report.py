"""Render ``benchmarks/results/*.json`` into ``benchmarks/REPORT.md`` (generated; never edit by hand).

    python -m benchmarks.report            # writes benchmarks/REPORT.md
    python -m benchmarks.report --check    # exit 1 if REPORT.md is stale

Every number comes from a results file; a missing file is said to be missing ("not measured yet").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (CPU_RESULTS, GPU_RESULTS, WORKFLOW_RESULTS, computed_pairs, load_json,  # noqa: E402
                               validate_cpu_results, validate_gpu_results, window_pairs)
from benchmarks.family_audit import RESULTS as FAMILY_RESULTS, render as render_family  # noqa: E402
from benchmarks.fix_cost_report import render_fix_cost  # noqa: E402
from benchmarks.fix_report import render_family_live, render_fix  # noqa: E402
from benchmarks.jit_report import render_jit  # noqa: E402
from benchmarks.targets_report import RESULTS as TARGETS_RESULTS, render_targets24  # noqa: E402
from benchmarks.workflow_report import make_test_from_nothing, render_workflow, repro_run  # noqa: E402

REPORT = Path(__file__).resolve().parent / "REPORT.md"
ROOT = Path(__file__).resolve().parents[1]
GPU_COMMAND = ("python3 -m benchmarks.h200_swa_prefill --budget-s 480 --out $OUT/h200_swa_prefill.json")
CPU_COMMAND = "python -m benchmarks.cpu_model --repro"

# (key, what, limit in seconds)
TARGETS = [
    ("kernel_model_32k", "kernel model (`simulate`), one 32k-token request, fa2 planned without the window", 1.0),
    ("repro_model_mode", "`swa-repro run --mode model` (every notebook, model mode) on 2 cores", 90.0),
    ("probe_8k", "live probe of an 8k-token request on the H200 (warm: modules already built)", 10.0),
    ("make_test_from_nothing", "`make test` from nothing (install the pinned stack, then the suite) on 2 cores", 300.0),
]


def _fmt_ms(x):
    return "–" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.1f}")


def _fmt(x, spec=".2f"):
    return "–" if x is None else format(x, spec)


def target_values(gpu: dict | None, cpu: dict | None, workflow: dict | None = None) -> dict:
    """``key -> (value_s or None, how it was measured or why not)``; the model-mode run comes from
    the workflow benchmark (``cpu_workflow.json``) when it has one, else from ``cpu_model.json``."""
    out = {"make_test_from_nothing": make_test_from_nothing(workflow)}
    km = next((r for r in (cpu or {}).get("kernel_model", []) if r.get("name") == "fa2-buggy-W4096"), None)
    if km:
        prov = cpu["provenance"]
        load = prov.get("loadavg_start")
        out["kernel_model_32k"] = (km["median_s"], f"median of {km['repeats']} on {prov.get('cpu_count')} cores "
                                                   f"({prov.get('cpu')}), {prov.get('date')}"
                                                   + (f"; load average {load[0]:.1f}" if load else ""))
    else:
        out["kernel_model_32k"] = (None, f"not measured yet: run `{CPU_COMMAND}`")
    rp = (cpu or {}).get("repro_model_mode")
    if (wr := repro_run(workflow)) is not None:
        out["repro_model_mode"] = wr
    elif rp and not rp.get("error"):
        prov, nbs = cpu["provenance"], rp.get("notebooks") or []
        load = prov.get("loadavg_start")
        out["repro_model_mode"] = (rp["wall_s"], f"one run on {prov.get('cpu_count')} cores, {prov.get('date')}; "
                                                 f"{len(nbs)} notebooks ({', '.join(n['notebook'][:2] for n in nbs)})"
                                                 + (f"; load average {load[0]:.1f} at the start" if load else ""))
    elif rp:
        out["repro_model_mode"] = (None, f"not measured: `{rp['command']}` failed ({rp['error']})")
    else:
        out["repro_model_mode"] = (None, f"not measured yet: run `{CPU_COMMAND}` once `swa-repro run` exists")
    pr = (gpu or {}).get("probe_8k")
    if pr and pr.get("warm_s") is not None:
        out["probe_8k"] = (pr["warm_s"], f"second call on {gpu['provenance'].get('gpu')}; "
                                         f"first call incl. module build {pr['first_s']:.1f} s")
    elif pr:
        out["probe_8k"] = (None, f"not measured: {pr.get('error', 'no timing recorded')}")
    elif gpu is not None and (rec := _recorded_8k_probe()) is not None:
        out["probe_8k"] = rec
    else:
        out["probe_8k"] = (None, "not measured yet: needs the GPU results file with its probe_8k entry")
    return out


def _recorded_8k_probe():
    """The same measurement from `swa-repro record`: the committed ``long8k_unsplit_bug`` recording
    times its probe (all repeats) and random-data runs with the module already built."""
    best = None
    for path in sorted((ROOT / "recordings").glob("[0-9]*/long8k_unsplit_bug.json")):
        doc = json.loads(path.read_text())
        t, prov = doc.get("timings") or {}, doc.get("provenance") or {}
        kv = [p + e for p, e in zip(doc["case"]["prefix_lens"], doc["case"]["extend_lens"])]
        if "probe" not in t or max(kv) < 8192:
            continue
        s = t["probe"] + t.get("random", 0.0)
        how = (f"`{prov.get('command')}` on {prov.get('gpu')}, flashinfer {prov.get('flashinfer', {}).get('version')}, "
               f"{prov.get('date_utc')}: {doc.get('repeats')} probe sweeps + random-data runs, module prebuilt "
               f"({path.relative_to(ROOT)})")
        if best is None or s > best[0]:
            best = (s, how)
    return best


def render_targets(gpu, cpu, workflow=None) -> list[str]:
    vals = target_values(gpu, cpu, workflow)
    lines = ["## Targets", "", "| target | limit | measured | verdict | how |", "|---|---|---|---|---|"]
    for key, what, limit in TARGETS:
        v, how = vals[key]
        verdict = "not measured yet" if v is None else ("PASS" if v <= limit else "FAIL")
        lines.append(f"| {what} | <= {limit:g} s | {'–' if v is None else f'{v:.3g} s'} | {verdict} | {how} |")
    cores = (cpu or {}).get("provenance", {}).get("cpu_count")
    if repro_run(workflow) is None and (cpu or {}).get("repro_model_mode") and cores != 2:
        lines.append(f"\nThe model-mode run was timed on {cores} cores, not the target's 2.")
    return lines + [""]


def index(records):
    """``(backend, variant, seq_len, batch, heads, head_dim, window) -> record`` of timed records."""
    idx = {}
    for r in records:
        if r.get("error"):
            continue
        idx[(r["backend"], r["variant"], r["seq_len"], r["batch"], (r["num_qo_heads"], r["num_kv_heads"]),
             r["head_dim"], r["window"])] = r
    return idx


def shapes(records):
    """Every measured ``(seq_len, batch, (Hq, Hk), head_dim, window)`` but causal's, in table order."""
    keys = {(r["seq_len"], r["batch"], (r["num_qo_heads"], r["num_kv_heads"]), r["head_dim"], r["window"])
            for r in records if r["variant"] != "causal"}
    return sorted(keys, key=lambda k: (k[3], k[0], k[1], -k[2][0] // k[2][1], k[4]))


def ms(idx, backend, variant, shape, window=None):
    """Median ms of one (backend, variant) at ``shape`` (``window`` overrides its W), None if not timed."""
    L, B, heads, d, w = shape
    r = idx.get((backend, variant, L, B, heads, d, w if window is None else window))
    return r["ms"] if r else None


def small_window_shapes(records):
    """Shapes whose window is at most 1/8 of the sequence: where the fix should pay most."""
    return [s for s in shapes(records) if s[4] * 8 <= s[0]]


def fa3_fixed_vs_buggy(records) -> list[tuple[float, float]]:
    """``(fixed ms, buggy ms)`` of fa3 at every small-window shape where both were timed."""
    idx = index(records)
    pairs = [(ms(idx, "fa3", "fixed", s), ms(idx, "fa3", "buggy", s)) for s in small_window_shapes(records)]
    return [(a, b) for a, b in pairs if a and b]


def cost_tables(records) -> list[str]:
    """Markdown: what the bug costs, the fix against the limit, and the findings (REPORT.md's)."""
    idx = index(records)
    return bug_table(idx, records) + fixed_table(idx, records) + findings_lines(idx, records)


def _ratio(a, b):
    return a / b if a and b else None


def render_gpu(gpu: dict | None) -> list[str]:
    lines = ["## GPU study: FlashInfer paged prefill on an H200", ""]
    if gpu is None:
        return lines + [f"Not measured yet: `{GPU_RESULTS.relative_to(GPU_RESULTS.parents[2])}` is missing. "
                        f"The lead runs `{GPU_COMMAND}` on the H200 and copies the file back.", ""]
    problems = validate_gpu_results(gpu)
    p = gpu["provenance"]
    peak, bw = gpu.get("peak_bf16_tflops"), gpu.get("copy_tbps")
    lines += [f"Measured on {p.get('gpu')} (driver {p.get('driver')}), torch {p.get('torch')} (CUDA {p.get('cuda')}), "
              f"flashinfer {p.get('flashinfer')}, {p.get('date')}; run status: {gpu.get('status')}.",
              f"Command: `{p.get('command')}`", "",
              f"Ceilings measured in the same run: bf16 dense matmul **{_fmt(peak, '.0f')} TFLOP/s**, "
              f"device copy **{_fmt(bw)} TB/s** (read + write). `peak` below = useful TFLOP/s / matmul rate; "
              "`floor` = max(useful FLOPs / matmul rate, fewest bytes / copy rate). Useful FLOPs count only "
              "the in-window causal (query, key) pairs x 4·d per query head.", ""]
    if problems:
        lines += ["**The results file has problems:** " + "; ".join(problems[:10]), ""]
    recs = gpu.get("records", [])
    idx = index(recs)
    lines += jit_table(gpu)
    lines += fixed_table(idx, recs)
    lines += bug_table(idx, recs)
    lines += findings_lines(idx, recs)
    errs = [r for r in recs if r.get("error")]
    if errs:
        lines += [f"### Not measured ({len(errs)} records)", ""]
        by = {}
        for r in errs:
            by.setdefault((r["backend"], r["variant"], r["error"]), []).append(r)
        for (b, v, e), rs in sorted(by.items()):
            lines.append(f"- {b} {v} x{len(rs)}: {e}")
        lines.append("")
    return lines


def jit_table(gpu):
    jit = gpu.get("jit", [])
    if not jit:
        return []
    lines = ["### Build times (first call minus a steady call)", "", "| module | JIT s | first call s | note |",
             "|---|---|---|---|"]
    for e in jit:
        note = e.get("error") or ("built while other builds ran (contended)" if e.get("contended") else "")
        lines.append(f"| {e['module']} | {_fmt(e.get('jit_s'), '.1f')} | {_fmt(e.get('first_s'), '.1f')} | {note} |")
    return lines + [""]


def fixed_table(idx, recs):
    lines = ["### The fix against the limit and the alternatives (ms, median)", "",
             "| L | B | Hq:Hk | D | W | floor | fa2 fixed | fa3 fixed | peak (best fixed) | flex | sdpa | flex / best fixed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sh in shapes(recs):
        L, B, (hq, hk), d, w = sh
        f2, f3 = ms(idx, "fa2", "fixed", sh), ms(idx, "fa3", "fixed", sh)
        best = min((x for x in (f2, f3) if x), default=None)
        rb = next((idx[k] for k in [("fa2", "fixed", L, B, (hq, hk), d, w), ("fa3", "fixed", L, B, (hq, hk), d, w)]
                   if k in idx and idx[k]["ms"] == best), None)
        fl, sd = ms(idx, "torch", "flex", sh), ms(idx, "torch", "sdpa", sh)
        floor = next((idx[k].get("floor_ms") for k in idx if k[2:] == (L, B, (hq, hk), d, w)), None)
        lines.append(f"| {L} | {B} | {hq}:{hk} | {d} | {w} | {_fmt_ms(floor)} | {_fmt_ms(f2)} | {_fmt_ms(f3)} | "
                     f"{_fmt(rb.get('peak_fraction') if rb else None)} | {_fmt_ms(fl)} | {_fmt_ms(sd)} | "
                     f"{_fmt(_ratio(fl, best))} |")
    return lines + [""]


def bug_table(idx, recs):
    lines = ["### What the bug costs: planned without the window (buggy) vs with it (fixed)", "",
             "`causal pairs / window pairs` is the work fa3-buggy is expected to do over the fix's "
             "(it ignores the window, GUIDE); fa2-buggy leaks per CTA tile. `err` is the sampled-row error "
             "against the intended window (float32 reference): the fix should be < 1e-2, buggy shows the bug.", "",
             "| L | B | Hq:Hk | W | causal/window pairs | fa3 buggy | fa3 fixed | fa3 buggy/fixed | fa3 causal | "
             "fa2 buggy | fa2 fixed | fa2 buggy/fixed | err fa2 fixed / buggy | err fa3 fixed / buggy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sh in shapes(recs):
        L, B, (hq, hk), d, w = sh
        cells = {(b, v): ms(idx, b, v, sh) for b in ("fa2", "fa3") for v in ("fixed", "buggy")}
        if not any(cells.values()):
            continue
        c3 = ms(idx, "fa3", "causal", sh, window=-1)
        errs = []
        for b in ("fa2", "fa3"):
            e = [idx.get((b, v, L, B, (hq, hk), d, w), {}) for v in ("fixed", "buggy")]
            errs.append(" / ".join("nan" if r.get("nan_frac") else _fmt(r.get("rel_err"), ".1e") if r else "–"
                                   for r in e))
        pr = window_pairs(0, L, -1) / window_pairs(0, L, w)
        lines.append(f"| {L} | {B} | {hq}:{hk} | {w} | {pr:.1f} | {_fmt_ms(cells['fa3', 'buggy'])} | "
                     f"{_fmt_ms(cells['fa3', 'fixed'])} | {_fmt(_ratio(cells['fa3', 'buggy'], cells['fa3', 'fixed']))} | "
                     f"{_fmt_ms(c3)} | {_fmt_ms(cells['fa2', 'buggy'])} | {_fmt_ms(cells['fa2', 'fixed'])} | "
                     f"{_fmt(_ratio(cells['fa2', 'buggy'], cells['fa2', 'fixed']))} | {errs[0]} | {errs[1]} |")
    return lines + [""]


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def findings(idx, recs) -> dict:
    """The numbers the prose states, each a median over the measured shapes."""
    shs = shapes(recs)
    f = {}
    f["fa3_buggy_over_causal"] = _median([_ratio(ms(idx, "fa3", "buggy", s), ms(idx, "fa3", "causal", s, -1))
                                          for s in shs])
    big = small_window_shapes(recs)
    f["fa3_buggy_over_fixed_small_w"] = _median([_ratio(ms(idx, "fa3", "buggy", s), ms(idx, "fa3", "fixed", s))
                                                 for s in big])
    f["fa2_buggy_over_fixed"] = _median([_ratio(ms(idx, "fa2", "buggy", s), ms(idx, "fa2", "fixed", s))
                                         for s in shs])
    for b in ("fa2", "fa3"):
        f[f"flex_over_{b}_fixed"] = _median([_ratio(ms(idx, "torch", "flex", s), ms(idx, b, "fixed", s))
                                             for s in shs])
        f[f"{b}_fixed_peak_max"] = max((r["peak_fraction"] for r in recs if r["backend"] == b
                                        and r["variant"] == "fixed" and r.get("peak_fraction")), default=None)
    f["fa2_buggy_expected_over_fixed"] = _median([
        computed_pairs("buggy", s[0], s[4], "fa2", idx.get(("fa2", "buggy", *s), {}).get("plan_cta_tile_q", 128),
                       s[2][0] // s[2][1]) / window_pairs(0, s[0], s[4])
        for s in shs if ("fa2", "buggy", *s) in idx])
    return f


def findings_lines(idx, recs):
    f = findings(idx, recs)
    out = ["### Findings (medians over the measured shapes)", ""]
    if f["fa3_buggy_over_causal"]:
        out.append(f"- fa3 planned without the window takes **{f['fa3_buggy_over_causal']:.2f}x** the time of plain "
                   "causal attention (1.00 = it computes the whole causal triangle).")
    if f["fa3_buggy_over_fixed_small_w"]:
        out.append(f"- Where the window is at most 1/8 of the sequence, the fix makes fa3 "
                   f"**{f['fa3_buggy_over_fixed_small_w']:.1f}x** faster (buggy / fixed).")
    if f["fa2_buggy_over_fixed"]:
        exp = f["fa2_buggy_expected_over_fixed"]
        out.append(f"- fa2 buggy / fixed: **{f['fa2_buggy_over_fixed']:.2f}x**"
                   + (f" (the per-tile leak adds {exp:.2f}x the window's pairs)" if exp else "") + ".")
    for b in ("fa2", "fa3"):
        if f[f"flex_over_{b}_fixed"]:
            out.append(f"- FlexAttention takes **{f[f'flex_over_{b}_fixed']:.2f}x** the time of {b} fixed.")
        if f[f"{b}_fixed_peak_max"]:
            out.append(f"- {b} fixed reaches at best **{f[f'{b}_fixed_peak_max']:.0%}** of the measured bf16 matmul rate.")
    return out + ([""] if len(out) > 2 else ["No paired measurements yet.", ""])


def render_cpu(cpu: dict | None) -> list[str]:
    lines = ["## CPU: the kernel model", ""]
    if cpu is None:
        return lines + [f"Not measured yet: run `{CPU_COMMAND}`.", ""]
    problems = validate_cpu_results(cpu)
    p = cpu["provenance"]
    lines += [f"{p.get('cpu')} ({p.get('cpu_count')} cores), Python {p.get('python')}, {p.get('date')}; "
              f"command `{p.get('command')}`.", ""]
    if problems:
        lines += ["**The results file has problems:** " + "; ".join(problems), ""]
    lines += ["| case | tokens | tile map | median s | min s | status |", "|---|---|---|---|---|---|"]
    for r in cpu.get("kernel_model", []):
        lines.append(f"| {r['name']} | {r['seq_len']} | {'yes' if r.get('tiles') else 'no'} | {r['median_s']:.3f} | "
                     f"{r['min_s']:.3f} | {', '.join(r.get('status', []))} |")
    return lines + [""]


def render(gpu: dict | None, cpu: dict | None, workflow: dict | None = None, targets: dict | None = None,
           family: dict | None = None) -> str:
    lines = ["# Performance report", "",
             "Generated by `python -m benchmarks.report` from `benchmarks/results/*.json`; do not edit by hand.", ""]
    lines += render_targets(gpu, cpu, workflow) + render_targets24(targets) + render_family(family) + render_gpu(gpu) + render_jit() + render_fix() + render_fix_cost() + render_family_live() + render_cpu(cpu) + render_workflow(workflow)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=Path, default=GPU_RESULTS)
    ap.add_argument("--cpu", type=Path, default=CPU_RESULTS)
    ap.add_argument("--workflow", type=Path, default=WORKFLOW_RESULTS)
    ap.add_argument("--targets", type=Path, default=TARGETS_RESULTS,
                    help="issue #24's measurement file (bash benchmarks/measure_targets.sh)")
    ap.add_argument("--family", type=Path, default=FAMILY_RESULTS,
                    help="issue #25's measurement file (python -m benchmarks.family_audit)")
    ap.add_argument("--out", type=Path, default=REPORT)
    ap.add_argument("--check", action="store_true", help="exit 1 if --out differs from a fresh rendering")
    a = ap.parse_args(argv)
    text = render(load_json(a.gpu), load_json(a.cpu), load_json(a.workflow), load_json(a.targets), load_json(a.family))
    if a.check:
        same = a.out.exists() and a.out.read_text() == text
        print(f"{a.out}: {'up to date' if same else 'stale: run python -m benchmarks.report'}")
        return 0 if same else 1
    a.out.write_text(text)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
