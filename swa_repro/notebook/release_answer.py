"""Notebook 05's opening: the committed release table, and for the release on this machine which
findings hold, what each does to attention (the audit's recorded evidence and the kernel model)
and what to do, each step read off the table and the as-installed audit, never a list of bugs.
"""

from __future__ import annotations

from swa_repro.core.versions import sglang_release_key as parse
from swa_repro.sglang.audit import table as at

# What to do while a class holds, beside "upgrade to the first release the table shows fixed".
WORKAROUND = {
    "paged_only_window": "or apply the fix in place (`swa-repro patch apply --in-place`); until then avoid the "
                         "paged-only prefill routes: SGLANG_FLASHINFER_USE_PAGED=1, deterministic inference, "
                         "piecewise CUDA graph, multimodal inputs",
    "dflash_verify_window": "avoid DFlash speculative decoding on sliding-window models",
    "eagle_verify_window": "avoid EAGLE speculative decoding on sliding-window models",
    "ragged_no_prefix_window": "with the #31501 fix in (upgrade or patch), set SGLANG_FLASHINFER_USE_PAGED=1: "
                               "prefill then takes the paged-only path, which is planned with the window",
    "ragged_prefix_window": "with the #31501 fix in (upgrade or patch), set SGLANG_FLASHINFER_USE_PAGED=1: "
                            "prefill then takes the paged-only path, which is planned with the window",
    "soft_cap_prefill": "serve soft-capped models (e.g. Gemma 2) with an attention backend that applies the cap",
    "soft_cap_decode": "serve soft-capped models (e.g. Gemma 2) with an attention backend that applies the cap",
    "soft_cap_cuda_graph": "serve soft-capped models (e.g. Gemma 2) with an attention backend that applies the cap",
}


def table_frame_rows(table: dict) -> list[dict]:
    """One row per release: its backend state and each class's cell state."""
    return [{"sglang": r["sglang"], "flashinfer pin": r["flashinfer_pin"], "backend": r["backend_state"],
             **{table["classes"][k]: r["cells"][k]["state"] for k in table["classes"]}} for r in table["rows"]]


def first_fixed(table: dict, key: str, after: str) -> str | None:
    """The first release newer than ``after`` whose cell for ``key`` is fixed (None: none yet)."""
    rows = sorted(table["rows"], key=lambda r: parse(r["sglang"]))
    return next((r["sglang"] for r in rows if parse(r["sglang"]) > parse(after)
                 and r["cells"][key]["state"] == "fixed"), None)


def effect(run: dict, key: str) -> str:
    """What the class does to attention, from its recorded findings (consequence, kernel model)."""
    c = at.CLASSES[key]
    hits = [f for f in run["findings"] if f["path"] in c.paths and f["parameter"] == c.parameter
            and f["effect"] == "wrong" and at._layer_has(f["layer"], c.parameter)]
    if not hits:
        return ""
    f = max(hits, key=lambda f: f["evidence"].get("pairs_outside_window") or 0)
    km = f["evidence"].get("kernel_model")
    model = f"; kernel model (H200): {', '.join(sorted(set(km['statuses'])))}, up to " \
            f"{km['max_extra_keys_per_query']} extra keys per query" if km else ""
    return f"{f['path']}: {f['consequence']}{model}"


def answer(run: dict, table: dict) -> list[dict]:
    """For the audited release (``AuditResult.to_dict()``): each class that holds, its evidence,
    its effect on attention and what to do."""
    version = run["release"]["sglang"]
    latest = max((r["sglang"] for r in table["rows"]), key=parse)
    rows = []
    for key, cell in at.cells(run).items():
        if cell["state"] != "holds":
            continue
        fix = first_fixed(table, key, version)
        upgrade = f"upgrade to sglang >= {fix}" if fix else f"no release up to {latest} fixes it"
        rows.append({"finding": at.CLASSES[key].title, "evidence": cell["evidence"][0],
                     "effect on attention": effect(run, key), "what to do": f"{upgrade}; {WORKAROUND[key]}"})
    return rows


def render(rows: list[dict]) -> str:
    """The answer as sentences: finding, the recorded call that shows it, its effect, what to do."""
    return "\n".join(f"{r['finding']} holds. Recorded: {r['evidence']}.\n  Effect: {r['effect on attention']}.\n"
                     f"  What to do: {r['what to do']}." for r in rows) or "No finding holds on this release."
