"""The family x release x GPU class table: ``docs/audit/families.{md,json}`` (issue #25).

``swa-repro audit --release-table --model all [--gpu sm90[,sm80,...]] [--releases ...]`` audits every
family each release serves (``audit.family_run``: the release's own model code at the family's real
window) and writes, per cell, the answer a user acts on (``family_verdict.answer``), the window as
transformers counts it, as the model file hands it to its layers and as the runner derives it,
and whether the soft cap reaches ``plan()``. Generated; never edited by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from swa_repro.core.outputs import write_atomic
from swa_repro.engine.provenance import TABLE_DIR
from swa_repro.sglang.audit.family_companion import fixed_cells
from swa_repro.sglang.audit.family_companion import markdown as fix_markdown
from swa_repro.sglang.audit.family_verdict import HYBRID, cell_of
from swa_repro.sglang.audit.table import provenance

SHORT = {"affected on the default path": "**affected**", "only with flags": "flags only",
         "only with speculative decoding": "spec only", "not affected": "not affected",
         "flashinfer refused": "refused", "not built": "not built", "unknown (not driven)": "unknown",
         "not driven": "not driven", "crashes on FlashInfer": "crashes (sinks)",
         "fallback: not audited": "fallback: not audited",
         HYBRID: "SWA pool: not driven"}
# "grouped by what is wrong": a column's group is the worst state any of its cells has, in this order
GROUPS = ("affected on the default path", "only with flags", "only with speculative decoding",
          "crashes on FlashInfer", "flashinfer refused", HYBRID, "unknown (not driven)", "not driven",
          "not built", "fallback: not audited", "not affected")


AUDIT_WINDOW = " (at a window the audit set)"  # the release's defaults give none: the verdict is conditional
NOT_IN = "*not in this release*"  # no model file of the release registers the family's architecture
TAG = {"extend_paged": "paged", "extend_ragged_no_prefix": "ragged", "extend_ragged_prefix": "ragged+prefix",
       "decode": "decode", "cuda_graph_decode": "decode graph", "cuda_graph_extend": "prefill graph"}


def tags(why) -> str:
    """``["sliding extend_paged: extra", "full decode: cap dropped", ...]`` -> ``S paged; F decode; cap``."""
    kinds, cap = {}, False
    for w in why or []:
        head, _, what = w.partition(": ")
        kind, _, path = head.partition(" ")
        if what == "cap dropped":
            cap = True
            continue
        t = TAG.get(path, "verify" if "verify" in path else path)
        if t not in kinds.setdefault(kind, []):
            kinds[kind].append(t)
    parts = [f"{k[0].upper()} {', '.join(v)}" for k, v in kinds.items()] + (["cap"] if cap else [])
    return "; ".join(parts)


def build(versions, gpus, *, jobs: int = 1, command: str = "", note=print, fixed: str | None = None,
          transformers: str = "venv") -> dict:
    """Audit every family of each release on every GPU class: one child per release serves them all
    (``family_run.audit_release``), ``jobs`` at a time, newest first (they serve the most families;
    0.5.23's child takes a third longer than 0.5.10's), so no long child starts last. With ``fixed`` (a
    release) the companion table of that release with ``--fix all`` (``family_companion.fixed_cells``:
    one family child) runs on a thread of its own from the start, beside the releases: in the pool it
    ran first and alone with ``--jobs 1``, and the row's column plan (~15 s of the parent, one core)
    then its children waited for it (one release's row: 143 s wall, the companion's 61 s of it first)."""
    from concurrent.futures import ThreadPoolExecutor

    from swa_repro.core.errors import UsageError
    from swa_repro.core.versions import sglang_release_key as parse
    from swa_repro.engine import forkserver
    from swa_repro.engine.child import child_env
    from swa_repro.sglang.audit.family_run import audit_release

    if transformers == "venv":  # with the release's own transformers every child is plain (engine.child.shadowed)
        forkserver.warm(child_env())  # its preload beside the parent's first seconds (the children's one server)

    def one(task):
        kind, v = task
        if kind == "fixed":
            return task, fixed_cells(gpus, v, note=note)
        try:
            return task, audit_release(v, "all", list(gpus), note=note, archs=True, transformers=transformers)
        except UsageError as e:  # a release this machine cannot install or run: a row that says so
            note(f"sglang {v}: {e}")
            return task, {g: {"release": {"sglang": v, "error": str(e)}, "gpu": g, "families": []} for g in gpus}

    tasks = [("release", v) for v in sorted(versions, key=parse, reverse=True)]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="swa-repro-companion") as side, \
            ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        companion = side.submit(one, ("fixed", fixed)) if fixed else None
        got = dict(ex.map(one, tasks))
        if companion is not None:
            got.update([companion.result()])
    done = {v: got["release", v] for v in versions}
    rows = [{"sglang": v, "gpu": g, "error": done[v][g]["release"].get("error"),
             "cells": {f["family"]: cell_of(f) for f in done[v][g]["families"]}} for g in gpus for v in versions]
    docs = [done[v][gpus[0]] for v in versions if "state" in done[v][gpus[0]]["release"]]
    table = {"provenance": provenance(command, docs), "gpus": list(gpus), "rows": rows}
    if transformers == "release":  # which transformers built each release's cells (release_transformers)
        table["provenance"]["transformers"] = {d["release"]["sglang"]: d["release"].get("transformers") for d in docs}
    if fixed:
        table["fixed"] = got["fixed", fixed]
    return table


def write(table: dict, out: Path = TABLE_DIR) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / "families.json", out / "families.md"
    write_atomic(js, (json.dumps(table, indent=1) + "\n").encode())
    write_atomic(md, markdown(table).encode())
    return md, js


def _families(table: dict) -> list[str]:
    """The 8 named families, then every other architecture column, grouped by its worst state
    (:data:`GROUPS`), by name within a group."""
    from swa_repro.engine.families import FAMILIES

    seen = {f for r in table["rows"] for f in r["cells"]}
    return [f for f in FAMILIES if f in seen] + sorted(seen - set(FAMILIES), key=lambda f: (group_of(table, f), f))


def group_of(table: dict, column: str) -> int:
    """The index in :data:`GROUPS` of the worst state ``column`` has in any row."""
    states = [r["cells"][column]["state"] for r in table["rows"] if column in r["cells"]]
    return min((GROUPS.index(s) if s in GROUPS else len(GROUPS) for s in states), default=len(GROUPS))


def grouped(table: dict) -> list[str]:
    """Markdown: the architecture columns by what is wrong (their worst state over every row)."""
    out = ["## Every sliding-window architecture, grouped by what is wrong", "",
           ("Each release's `srt/models/` read for the architectures that hand a window to their attention "
           "or run on the hybrid SWA pool (`swa_repro.sglang.swa_archs`), and those only its Transformers "
           "fallback serves (`models/transformers.py`, audited through the fallback: "
           "`swa_repro.sglang.audit.fallback_cells`); each is audited at its published defaults (transformers' "
           "config class for it, or the release's own), reported for what it is where it cannot be (a model "
           "passing `sinks=` FlashInfer's backend does not take, a config only a checkpoint has). Where the "
           "release's defaults set no window, the column is audited at a window the audit sets and says so "
           f"(\"{AUDIT_WINDOW.strip()}\": `--model PATH` answers at yours). A column's group is its worst cell "
           "over every release and GPU class."), ""]
    cols = _families(table)
    for i, g in enumerate(GROUPS):
        mine = [c for c in cols if group_of(table, c) == i]
        if mine:
            out.append(f"- **{SHORT.get(g, g).strip('*')}** ({len(mine)}): " + ", ".join(mine))
    return out + [""]


def column_groups(table: dict, fams: list[str]) -> list[tuple[str, list[str]]]:
    """``[(title, columns)]``: the named families first, then the other architectures one group per
    worst state (:func:`group_of`), so that a GPU class's table is a few readable tables, not one of
    every column side by side."""
    from swa_repro.engine.families import FAMILIES

    named = [f for f in fams if f in FAMILIES]
    out = [("the named families", named)] if named else []
    for i, g in enumerate(GROUPS + ("other",)):
        cols = [f for f in fams if f not in FAMILIES and group_of(table, f) == i]
        if cols:
            out.append((f"architectures whose worst cell is {SHORT.get(g, g).strip('*')}", cols))
    return out


def gpu_tables(rows: list[dict], gpu: str, title: str, cols: list[str]) -> list[str]:
    """One group's two tables on one GPU class: each cell's state, then its window and cap."""
    head = ["| sglang | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines = [f"### {gpu}: {title} ({len(cols)})", "", *head]
    lines += [f"| {r['sglang']} | " + " | ".join(main_cell_text(r["cells"].get(f)) for f in cols) + " |" for r in rows]
    lines += ["", f"Window (HF / the sliding layer's `sliding_window_size` / the runner's), cap state ({gpu}):",
              "", *head]
    lines += [f"| {r['sglang']} | " + " | ".join(
        (f"{_win(c)}; cap {c.get('cap_state', '-')}" if c else NOT_IN)
        for c in (r["cells"].get(f) for f in cols)) + " |" for r in rows]
    return lines + [""]


def main_cell_text(c: dict | None) -> str:
    """A main-table cell: the state, and for affected/flags/spec what is not exact (S/F: sliding/full)."""
    if c is None:
        return NOT_IN
    affected = ("affected on the default path", "only with flags", "only with speculative decoding")
    audit = AUDIT_WINDOW if c.get("window_from") == "audit" else ""
    if "ordinary_pool" in c:  # HYBRID: the verdict is the ordinary pool's, said as such
        t = tags(c["why"]) if c["ordinary_pool"] in affected else ""
        return f"{SHORT[c['state']]} (ordinary pool: {SHORT.get(c['ordinary_pool'], c['ordinary_pool'])}" \
               + (f": {t})" if t else ")") + audit
    t = tags(c["why"]) if c["state"] in affected else ""
    return SHORT.get(c["state"], c["state"]) + (f": {t}" if t else "") + audit


def _win(c: dict) -> str:
    if "window_hf" not in c:
        return "-"
    lw = c["layer_window"].get("sliding", c["layer_window"].get("full"))
    return f"{c['window_hf']} / {lw} / {c['runner_window']}"


def markdown(table: dict) -> str:
    pv, fams = table["provenance"], _families(table)
    lines = ["# Is my model, on my GPU, on my release affected? (sglang's FlashInfer backend)", "",
             f"Generated by `{pv['command']}` on {pv['date']} (swa-repro {pv['swa_repro_commit']}, python "
             f"{pv['python']}, torch {pv['torch']}). Do not edit: regenerate.", "",
             "How: each release's own sglang (an overlay, one subprocess per release for every family and "
             "GPU class) builds each family's attention layers from a small config of that family "
             "(transformers' published defaults: head_dim, GQA, window, cap, layer pattern; a few layers on "
             "the meta device), derives the runner's window with its own model-runner code and builds "
             "`FlashInferAttnBackend` as it does for that GPU class (a family the release has no model file "
             "for: *not in this release*); every path is driven at the family's real window with prompts past it, and the keys "
             "each query attends are counted as ranges against the window transformers intends "
             "(`swa-repro audit --sglang X --model FAMILY --gpu G` shows one cell in full).", "",
             "A cell: **affected** (a default path — ragged or paged-only extend as the release's server "
             "picks it, decode, decode CUDA graph — lets a query see keys outside its window, or drops the "
             "cap), flags only (only paths that flags such as `SGLANG_FLASHINFER_USE_PAGED=1` or "
             "deterministic inference switch on), spec only (speculative verify), not affected, refused "
             "(sglang refuses `--attention-backend flashinfer` for it), SWA pool: not driven (the release "
             "serves the model on its hybrid SWA KV pool, `ModelConfig.is_hybrid_swa`; the audit drives that pool "
             "with the release's own classes and eviction, `sglang.audit.hybrid_pool`, and judges the cell on it; "
             "where it could not, the cell says why, with the ordinary pool's verdict in brackets), "
             "not built (why in the JSON). Where "
             "FlashInfer is not the default backend on that GPU class, a cell applies with "
             "`--attention-backend flashinfer` (the JSON's `default_backend`).", ""]
    for g in table["gpus"]:
        rows = [r for r in table["rows"] if r["gpu"] == g]
        lines += [f"## {g}", ""]
        for title, cols in column_groups(table, fams):
            lines += gpu_tables(rows, g, title, cols)
    from swa_repro.engine.families import FAMILIES

    lines += grouped(table)
    lines += fix_markdown(table, [f for f in fams if f in FAMILIES], main_cell_text)
    lines += ["## Why (per cell: the paths and layer kinds that are not exact)", ""]
    for r in table["rows"]:
        lines.append(f"### sglang {r['sglang']}, {r['gpu']}" + (f": {r['error']}" if r.get("error") else ""))
        for f, c in r["cells"].items():
            extra = "; ".join(x for x in (str(c.get("flags") or ""), c.get("note") or "") if x)
            lines.append(f"- **{f}: {c['state']}**" + (f" ({extra})" if extra else ""))
            lines += [f"  - {w}" for w in c["why"][:12]] + ([f"  - ... {len(c['why']) - 12} more"]
                                                            if len(c["why"]) > 12 else [])
        lines.append("")
    t = pv["timings_s"]
    lines += ["## Timings (s, this machine)", "", "| sglang | import | audit (all families) | subprocess |",
              "|---|---|---|---|"]
    lines += [f"| {v} | {x['import_seconds']} | {x['audit_seconds']} | {x['child_seconds']} |" for v, x in t.items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """``python -m swa_repro.sglang.audit.family_table [--table DIR]``: the companion table
    (``family_companion.fixed_cells``) added to an existing ``families.json`` (its other rows as
    generated), and ``families.md`` re-rendered from it."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m swa_repro.sglang.audit.family_table", description=main.__doc__)
    p.add_argument("--table", default=str(TABLE_DIR))
    a = p.parse_args(argv)
    js = Path(a.table) / "families.json"
    table = json.loads(js.read_text())
    table["fixed"] = fixed_cells(table["gpus"])
    for f in write(table, Path(a.table)):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
