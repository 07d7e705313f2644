"""Notebook 08 ("vLLM"): the committed vLLM release x family x GPU class tables
(``docs/audit/vllm-releases.json`` and its ``fixed/`` twin, ``swa_repro.vllm.table``) as frames and
one heatmap of the cells' states."""

from __future__ import annotations

import json

import pandas as pd

from swa_repro.vllm import table

STATES = ("not affected", "layer != HF", "affected", "refused", "not driven")
COLORS = ("#cfe8cf", "#f3e3a1", "#e8837a", "#c9c9c9", "#ffffff")


def load(fixed: bool = False) -> dict:
    folder = table.TABLE_DIR / "fixed" if fixed else table.TABLE_DIR
    return json.loads((folder / f"{table.NAME}.json").read_text())


def cells(t: dict) -> pd.DataFrame:
    """One row per release x GPU class x family: state, the table's text, the default backend."""
    rows = [{"vllm": v, "gpu": g, "family": f, "state": c["state"], "cell": c["short"],
             "default_backend": c["default_backend"]}
            for v, rel in t["releases"].items() for g, row in rel.items() for f, c in row.items()]
    return pd.DataFrame(rows)


def grid(df: pd.DataFrame, gpu: str) -> pd.DataFrame:
    """release x family, the table's cell text, for one GPU class."""
    sub = df[df.gpu == gpu]
    return sub.pivot(index="vllm", columns="family", values="cell").loc[sub.vllm.unique(), sub.family.unique()]


def heatmap(df: pd.DataFrame, title: str):
    """releases (rows) x GPU class / family (columns), coloured by state."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure  # not pyplot: shown once, by plots.publish

    cols = [(g, f) for g in df.gpu.unique() for f in df.family.unique()]
    releases = list(df.vllm.unique())
    idx = {(r.vllm, r.gpu, r.family): STATES.index(r.state) for r in df.itertuples()}
    data = [[idx[(v, g, f)] for g, f in cols] for v in releases]
    fig = Figure(figsize=(1.0 + 0.55 * len(cols), 1.2 + 0.42 * len(releases)), layout="constrained")
    ax = fig.subplots()
    ax.imshow(data, cmap=ListedColormap(COLORS), vmin=0, vmax=len(STATES) - 1, aspect="auto")
    ax.set_xticks(range(len(cols)), [f"{g} {f}" for g, f in cols], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(releases)), releases, fontsize=8)
    for i, row in enumerate(data):
        for j, s in enumerate(row):
            ax.text(j, i, "NHARX"[s], ha="center", va="center", fontsize=7)
    ax.set_title(title + "\nN not affected, H layer != HF, A affected, R refused, X not driven", fontsize=9)
    return fig
