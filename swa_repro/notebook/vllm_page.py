"""Notebook 08 ("vLLM"): the committed vLLM release x family x GPU class tables
(``docs/audit/vllm-releases.json`` and its ``fixed/`` twin, ``swa_repro.vllm.audit.table``) as frames and
one heatmap of the cells' states."""

from __future__ import annotations

import json

import pandas as pd

from swa_repro.engine.provenance import TABLE_DIR
from swa_repro.vllm.audit import table, verdict

STATES = ("not affected", "layer != HF", "affected", "refused", "not driven")
COLORS = ("#cfe8cf", "#f3e3a1", "#e8837a", "#c9c9c9", "#ffffff")


def load(fixed: bool = False) -> dict:
    folder = TABLE_DIR / "fixed" if fixed else TABLE_DIR
    return json.loads((folder / f"{table.NAME}.json").read_text())


def cells(t: dict) -> pd.DataFrame:
    """One row per release x GPU class x family: state, the table's text, the default backend."""
    rows = [{"vllm": v, "gpu": g, "family": f, "state": c["state"], "cell": c["short"],
             "default_backend": c["default_backend"]}
            for v, rel in t["releases"].items() for g, row in rel.items() for f, c in row.items()]
    return pd.DataFrame(rows)


def options(t: dict) -> pd.DataFrame:
    """One row per release x GPU class x family x quantized KV cache (``--kv-cache-dtype``): its own
    answer (``verdict.cell``'s ``cache_dtypes``) beside the default cache's state."""
    rows = [{"vllm": v, "gpu": g, "family": f, "cache_dtype": kv, "state": x["state"], "cell": verdict.short(x),
             "default_state": c["state"]}
            for v, rel in t["releases"].items() for g, row in rel.items() for f, c in row.items()
            for kv, x in c.get("cache_dtypes", {}).items()]
    return pd.DataFrame(rows, columns=["vllm", "gpu", "family", "cache_dtype", "state", "cell", "default_state"])


def pages(t: dict) -> pd.DataFrame:
    """One row per release x GPU class x family: the largest kernel page ``--block-size 128`` gets."""
    rows = [{"vllm": v, "gpu": g, "family": f, "page": max(c["kernel_page"].values())}
            for v, rel in t["releases"].items() for g, row in rel.items() for f, c in row.items()
            if c.get("kernel_page")]
    return pd.DataFrame(rows, columns=["vllm", "gpu", "family", "page"])


def grid(df: pd.DataFrame, gpu: str) -> pd.DataFrame:
    """release x family, the table's cell text, for one GPU class."""
    sub = df[df.gpu == gpu]
    return sub.pivot(index="vllm", columns="family", values="cell").loc[sub.vllm.unique(), sub.family.unique()]


def heatmap(df: pd.DataFrame, title: str):
    """releases (rows) x GPU class / family (columns), coloured by state."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure  # not pyplot: shown once, by plots.publish

    from swa_repro.notebook.plots import MEDIUM, SMALL

    cols = [(g, f) for g in df.gpu.unique() for f in df.family.unique()]
    releases = list(df.vllm.unique())
    idx = {(r.vllm, r.gpu, r.family): STATES.index(r.state) for r in df.itertuples()}
    data = [[idx[(v, g, f)] for g, f in cols] for v in releases]
    fig = Figure(figsize=(1.0 + 0.55 * len(cols), 1.2 + 0.42 * len(releases)), layout="constrained")
    ax = fig.subplots()
    ax.imshow(data, cmap=ListedColormap(COLORS), vmin=0, vmax=len(STATES) - 1, aspect="auto")
    ax.set_xticks(range(len(cols)), [f"{g} {f}" for g, f in cols], rotation=60, ha="right", fontsize=SMALL)
    ax.set_yticks(range(len(releases)), releases, fontsize=SMALL)
    for i, row in enumerate(data):
        for j, s in enumerate(row):
            ax.text(j, i, "NHARX"[s], ha="center", va="center", fontsize=SMALL)
    ax.set_title(title + "\nN not affected, H layer != HF, A affected, R refused, X not driven", fontsize=MEDIUM)
    return fig


# ----------------------------------------------------------------------------- on the kernel (issue #27's live step)
LIVE_CALL = TABLE_DIR.parents[1] / "recordings" / "vllm-live" / "0.33.0" / "call-20261205T2228-h200"
LIVE_VERSION, LIVE_PATHS = "0.33.0", "decode,mixed"


def live(mode: str) -> tuple[dict, str]:
    """``{site: live document}`` and where it comes from: on CUDA (``mode`` live) vLLM 0.33.0's backend
    run here on this GPU's FlashInfer for Gemma-2's decode and mixed batches, shipped and with
    ``--fix cap-route`` (``vllm.audit.core.run_live``: minutes, most of them JIT builds); otherwise the
    committed H200 recording (``recordings/vllm-live``: every path, Gemma-2 and Cohere2)."""
    if mode == "live":
        from swa_repro.engine.families import GPU_CLASSES
        from swa_repro.vllm.audit.core import run_live

        docs = {site: run_live(LIVE_VERSION, ["gemma2"], [GPU_CLASSES["sm90"]], mode="live", fix=fix,
                               paths=LIVE_PATHS, note=lambda s: None)["sm90"]
                for site, fix in (("shipped", None), ("fixed", "cap-route"))}
        return docs, f"run here: vLLM {LIVE_VERSION}, gemma2, {LIVE_PATHS}"
    from swa_repro.vllm.audit.live_report import load

    docs = {site: load(LIVE_CALL / f"live-{site}.json.xz") for site in ("shipped", "fixed")}
    return docs, f"the committed recording {LIVE_CALL.relative_to(LIVE_CALL.parents[3])} ({docs['shipped']['device']})"


NVFP4_CALL = LIVE_CALL.parent / "call-20261206T0002-h100"


def live_nvfp4(mode: str) -> tuple[dict, str]:
    """Gemma-2's mixed batch with an NVFP4 cache (``--kv-cache-dtype nvfp4``, 0.32.0+ on sm90: fa2's
    wrappers): on CUDA (``mode`` live) run here as shipped; otherwise the committed H100 recording."""
    if mode == "live":
        from swa_repro.engine.families import GPU_CLASSES
        from swa_repro.vllm.audit.core import run_live

        doc = run_live(LIVE_VERSION, ["gemma2"], [GPU_CLASSES["sm90"]], mode="live", paths="nvfp4_kv_mixed",
                       note=lambda s: None)["sm90"]
        return {"shipped": doc}, f"run here: vLLM {LIVE_VERSION}, gemma2, nvfp4_kv_mixed"
    from swa_repro.vllm.audit.live_report import load

    doc = load(NVFP4_CALL / "live-shipped.json.xz")
    return {"shipped": doc}, f"the committed recording {NVFP4_CALL.relative_to(NVFP4_CALL.parents[3])} ({doc['device']})"


def live_rows(docs: dict) -> pd.DataFrame:
    """One row per site, family, layer kind, path and kernel: what it was told, its rows, the wrong ones."""
    out = []
    for site, d in docs.items():
        for fam, f in d["families"].items():
            for r in f["rows"]:
                for x in r.get("cap", {}).get("requests", []):
                    out.append({"site": site, "family": fam, "layer": r["layer"], "path": r["path"],
                                "kernel": x["kernel"], "told_cap": x["logits_soft_cap"], "rows": x["rows"],
                                "wrong_rows": x["wrong_rows"], "max_err": x["max_err_asked"],
                                "told_agrees": x["told_agrees"], "keys_off_hf": r["keys"].get("rows_off_hf")})
    df = pd.DataFrame(out)
    return df.groupby(["site", "family", "layer", "path", "kernel", "told_cap"], as_index=False).agg(
        rows=("rows", "sum"), wrong_rows=("wrong_rows", "sum"), max_err=("max_err", "max"),
        told_agrees=("told_agrees", "all"))
