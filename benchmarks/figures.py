"""The figures notebook 06 shows from the results files, as ``matplotlib.figure.Figure`` objects
(no pyplot state): time against the window, the fix against the measured bf16 rate, and the
kernel model's CPU timings.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from swa_repro.notebook.plots import SMALL  # the project's one text style

# (backend, variant) -> (colour, line style): solid = planned with the window
STYLE = {("fa3", "fixed"): ("C0", "-"), ("fa3", "buggy"): ("C0", "--"), ("fa2", "fixed"): ("C1", "-"),
         ("fa2", "buggy"): ("C1", "--"), ("torch", "flex"): ("C2", "-"), ("torch", "sdpa"): ("C3", "-")}


def _timed(records) -> list[dict]:
    return [r for r in records if not r.get("error")]


def time_vs_window(records, title: str) -> Figure | None:
    """One panel per (batch, seq_len), GQA at the largest ratio measured, log-log; the fix (solid)
    should fall with the window, fa3 planned without it (dashed) stay at plain causal (grey).
    None when no record was timed without an error."""
    recs = _timed(records)
    if not recs:
        return None
    ratio = max(r["num_qo_heads"] // r["num_kv_heads"] for r in recs)
    recs = [r for r in recs if r["num_qo_heads"] // r["num_kv_heads"] == ratio]
    Ls, Bs = sorted({r["seq_len"] for r in recs}), sorted({r["batch"] for r in recs})
    fig = Figure(figsize=(3.6 * len(Ls), 3.0 * len(Bs)))
    axes = fig.subplots(len(Bs), len(Ls), squeeze=False)
    for (i, B), (j, L) in ((a, b) for a in enumerate(Bs) for b in enumerate(Ls)):
        ax, sel = axes[i][j], [r for r in recs if (r["seq_len"], r["batch"]) == (L, B)]
        for (be, var), (c, ls) in STYLE.items():
            pts = sorted((r["window"], r["ms"]) for r in sel if (r["backend"], r["variant"]) == (be, var))
            if pts:
                ax.plot(*zip(*pts), color=c, ls=ls, marker="o", label=var if be == "torch" else f"{be} {var}")
        for r in sel:
            if r["variant"] == "causal":
                ax.axhline(r["ms"], color="grey", lw=0.8, ls=":" if r["backend"] == "fa2" else "-")
        ws = sorted({r["window"] for r in sel if r["window"] >= 0})
        ax.set(xscale="log", yscale="log", title=f"L={L}, batch {B}, GQA {ratio}:1")
        ax.set_xticks(ws, [str(w) for w in ws])
        ax.xaxis.set_minor_formatter(NullFormatter())
    for ax in axes[-1]:
        ax.set_xlabel("window W")
    for row in axes:
        row[0].set_ylabel("ms (median)")
    axes[0][-1].legend(fontsize=SMALL)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def peak_fraction(records) -> Figure | None:
    """Each fixed kernel's useful TFLOP/s as a fraction of the measured bf16 matmul rate, against
    useful FLOPs per token. None when no fixed record has a peak fraction."""
    fixed = [r for r in records if r["variant"] == "fixed" and r.get("peak_fraction")]
    if not fixed:
        return None
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    for be, c in (("fa2", "C1"), ("fa3", "C0")):
        pts = [(r["useful_flops"] / r["seq_len"] / r["batch"], r["peak_fraction"]) for r in fixed if r["backend"] == be]
        if pts:
            ax.scatter(*zip(*pts), color=c, label=f"{be} fixed", s=14)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xscale="log", xlabel="useful FLOPs per token", ylabel="fraction of bf16 matmul rate",
           title="the fix against the H200's measured bf16 rate")
    ax.legend()
    return fig


def kernel_model_times(cpu: dict, target_s: float = 1.0) -> Figure:
    """Median seconds of each committed kernel-model case against the 1 s target."""
    km = cpu["kernel_model"]
    fig = Figure(figsize=(7, 2.8))
    ax = fig.subplots()
    ax.barh([r["name"] for r in km], [r["median_s"] for r in km], color="C4")
    ax.axvline(target_s, color="k", ls="--", lw=0.8, label=f"target {target_s:g} s (32k, no tile map)")
    ax.set(xlabel="seconds (median)", title=f"kernel model, 32k tokens: {cpu['provenance'].get('cpu')}")
    ax.legend(fontsize=SMALL)
    return fig
