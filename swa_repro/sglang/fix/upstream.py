"""``python -m swa_repro.sglang.fix.upstream --out docs/upstream``: the fixes as an sglang maintainer
would take them, against sglang 0.5.23's own file.

Writes one unified diff per finding class (``apply_fixes(text, (name,))`` on the overlay's file,
paths as in sglang's repository), ``all.diff``, and a README whose line numbers are found in that
file, whose audit cells come from CPU audits of 0.5.23 as shipped and with each fix
(``audit.release.audit_release``), and whose live section comes from a committed H200 recording
when there is one. Nothing in it is typed by hand, so it is regenerated, never edited.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from swa_repro.core.outputs import write_atomic
from swa_repro.sglang.audit import table as at
from swa_repro.sglang.fix import FIXES, parse_names, states
from swa_repro.sglang.fix.alternatives import ALTERNATIVES
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.fix.upstream_diff import (DETAIL, LIVE, ROOT, TEST, VERSION, diffs,
                                                release_file, source)
from swa_repro.sglang.fix.upstream_live import (live_fix_set, load_live, live_lines, regress_lines, stale_live)
from swa_repro.sglang.fix.upstream_refs import upstream_section
from swa_repro.sglang.patch.classify import REL_PATH

# ----------------------------------------------------------------------------- file:line in 0.5.23
def line_of(text: str, needle: str, after: str | None = None, nth: int = 1) -> int:
    """1-based line of the ``nth`` line holding ``needle`` after the first holding ``after``."""
    lines = text.splitlines()
    start = 0 if after is None else next(i for i, ln in enumerate(lines) if after in ln)
    hits = [i + 1 for i, ln in enumerate(lines[start:], start) if needle in ln]
    if len(hits) < nth:
        raise LookupError(f"{needle!r} after {after!r}: not in this file (regenerate against the right release)")
    return hits[nth - 1]


def problems(text: str) -> dict[str, str]:
    """Each class's problem in this file, its lines found by anchors (so a moved line fails loudly)."""
    L = lambda *a, **k: f"`flashinfer_backend.py:{line_of(text, *a, **k)}`"  # noqa: E731
    pre_cbf = "class FlashInferIndicesUpdaterPrefill"
    ragged_plan = L("wrapper_ragged.begin_forward(", pre_cbf)
    usw_call = L("self.call_begin_forward(", pre_cbf, nth=2)
    gate = L("if (wrapper_id == 0 and not use_ragged and spec_info is None)")
    paged_window = L('paged_plan_kwargs["window_left"] = window_left')
    return {
        "paged_only_window": f"The paged-only path plans wrapper 0 with the layer's window ({paged_window}).",
        "ragged_no_prefix_window": (
            f"One ragged wrapper (`self.prefill_wrapper_ragged`, created at {L('self.prefill_wrapper_ragged = ')}) "
            f"serves sliding-window and full layers. `update_sliding_window` plans it once per wrapper id "
            f"({usw_call}), the full layers' plan last, and its plan ({ragged_plan}) never gets a "
            f"`window_left`, so the compiled kernel has no window mask. The no-prefix `forward()` "
            f"({L('self.prefill_wrapper_ragged.forward(', 'def forward_extend')}) passes no window either: "
            "every query attends all earlier tokens of the extend."),
        "ragged_prefix_window": (
            f"The with-prefix `forward_return_lse()` ({L('self.prefill_wrapper_ragged.forward_return_lse(', 'def forward_extend')}) "
            f"passes `window_left=layer.sliding_window_size`, but on the same wrapper planned without a window "
            f"({ragged_plan}) that only sets `_window_left`: the new tokens attend each other unwindowed "
            "(the paged prefix part is windowed by its custom mask and is exact)."),
        "eagle_verify_window": (
            f"EAGLE (any topk), Frozen-KV MTP and NGRAM verify plan wrapper 0 over the first `min(seq, window)` keys "
            f"({L('paged_kernel_lens = torch.minimum(', 'class FlashInferIndicesUpdaterPrefill')}; their "
            f"`generate_attn_arg_prefill` takes no `kv_start_idx`, {L('spec_info.generate_attn_arg_prefill(', pre_cbf, nth=2)}) "
            f"under a tree mask laid out for the whole sequence, and the window gate ({gate}) "
            "keeps `window_left` out of verify plans. Planning the window alone would not be exact for a tree "
            "(topk > 1, NGRAM): FlashInfer places a query at its index in the flattened draft "
            "(`kv_idx + qo_len + window_left >= kv_len + qo_idx`, flashinfer's variants.cuh), while a draft token's "
            "position is the committed length plus its depth in the tree, so a node after its siblings would lose "
            "its oldest in-window keys."),
        "dflash_verify_window": (
            f"DFlash verify trims wrapper 0's keys per request (`kv_start_idx`, {L('kv_start_idx=kv_start_idx,', 'spec_input_type == SpecInputType.DFLASH_VERIFY:')}) "
            f"but the window gate ({gate}) plans no "
            "`window_left`, so queries early in the draft see keys past their window."),
        "soft_cap_prefill": (
            f"`forward_extend` reads `layer.logit_cap` ({L('logits_soft_cap = layer.logit_cap', 'def forward_extend')}) "
            f"and passes it only to `forward()` / `forward_return_lse()`; neither the ragged plan ({ragged_plan}) "
            f"nor the paged plan ({L('wrapper_paged.begin_forward(', pre_cbf)}) gets `logits_soft_cap`, so the "
            "kernel compiled has no tanh cap."),
        "soft_cap_decode": (
            f"`forward_decode` passes `logits_soft_cap=layer.logit_cap` ({L('logits_soft_cap=layer.logit_cap', 'def forward_decode')}) "
            f"to `forward()` only; the decode plans ({L('wrapper.begin_forward(', 'class FlashInferIndicesUpdaterDecode', nth=1)}, "
            f"{L('wrapper.begin_forward(', 'class FlashInferIndicesUpdaterDecode', nth=2)}) get none."),
        "soft_cap_cuda_graph": (
            "CUDA-graph capture plans go through the same `call_begin_forward` methods as eager plans, and a "
            f"replay (`fast_decode_plan`, `fast_prefill_plan` at {L('def fast_prefill_plan(')}) never re-picks the "
            "captured module: the cap is lost in every graph for the same reasons as above."),
    }


# ----------------------------------------------------------------------------- audits
def audits(version: str = VERSION, note=print) -> dict:
    """CPU audits of ``version``: as shipped (every path) and, per class with a fix of its own to
    apply, with it (that class's paths); ``all`` with every fix."""
    from swa_repro.sglang.audit.release import audit_release

    text = source(version)
    st = states(text)
    out = {"shipped": audit_release(version, note=note)}
    for name in ORDER:
        if st[name].state != "applied":
            out[name] = audit_release(version, paths=list(at.CLASSES[name].paths), fixes=parse_names(name), note=note)
    out["all"] = audit_release(version, fixes=ORDER, note=note)
    out["alternatives"] = audit_release(version, fixes=tuple(ALTERNATIVES), paths=alt_paths(), note=note)
    return out


def alt_paths() -> list[str]:
    return sorted({p for a in ALTERNATIVES.values() for f in a.findings for p in at.CLASSES[f].paths})


def alternative_lines(runs: dict, cost: dict | None) -> list[str]:
    """Per finding with an alternative: the alternative's keys against ours (CPU audits of the same
    paths), and what it costs on the GPU (``benchmarks/alt_cost.py``'s recording) where measured."""
    alt, ours = at.key_cells(runs["alternatives"]), at.key_cells(runs["all"])
    out = ["", "## The simpler alternative", "",
           "What a maintainer would suggest first, audited like ours (`swa_repro/sglang/fix/alternatives.py`; "
           "not offered by `patch --fix`). Keys: per path, as above.", "",
           "| finding | alternative | its keys | ours |", "|---|---|---|---|"]
    for a in ALTERNATIVES.values():
        for f in a.findings:
            for p in at.CLASSES[f].paths:
                out.append(f"| {f} | `{a.name}`: {a.summary} | {p}: {at.key_text(alt.get(p))} | "
                           f"{p}: {at.key_text(ours.get(p))} |")
    if cost is None:
        out += ["", "Cost on the GPU: not recorded yet (`python benchmarks/alt_cost.py --out alt-cost.json` on "
                "the GPU machine; `scripts/gpu_fix.sh` runs it as its `alt` step)."]
        return out
    pv = cost["provenance"]
    out += ["", f"Cost on {pv['gpu']} (flashinfer {pv['flashinfer']}, torch {pv['torch']}, {pv['date']}; "
            f"`{pv['command']}`): prefill `run()` per layer, median, ragged (ours) against paged "
            "(`alt_paged_for_swa`), for a model of sliding-window and full layers in the ratio named.", "",
            "| requests x tokens | window | model mix | ours ms | alternative ms | alternative / ours |",
            "|---|---|---|---|---|---|"]
    for s in cost["shapes"]:
        for mix, m in s["layers"]["mix"].items():
            out.append(f"| {s['requests']} x {s['tokens_each']} | {s['window_left']} | {mix} | "
                       f"{m['ours_ms']:.3f} | {m['alt_ms']:.3f} | {m['alt_over_ours']:.2f} |")
    return out


def cell_text(doc: dict, name: str) -> str:
    c = at.cell(doc, name)
    keys = at.key_cells(doc)
    paths = "; ".join(f"{p}: {at.key_text(keys.get(p))}" for p in at.CLASSES[name].paths)
    return f"**{c['state']}** (keys a window-8 layer's queries attend: {paths})"


# ----------------------------------------------------------------------------- live (H200)
# ----------------------------------------------------------------------------- README
def readme(text: str, ds: dict, runs: dict, prov: dict, before=None, after=None, regress_log=None, kit=None,
           live_diff: str | None = None, cost=None, family: tuple = (), prs=()) -> str:
    """``family``: the family- and GPU-class-level fixes the series has (``series.fix_names``)."""
    from swa_repro.sglang.fix import upstream_family as uf

    st, probs = states(text), problems(text)
    shipped = runs["shipped"]
    lines = [
        f"# FlashInfer plan-time parameters in sglang {VERSION}'s attention backend",
        "",
        "Do not edit: regenerate. (`python -m swa_repro.sglang.fix.upstream --out docs/upstream`)",
        "",
        f"Generated by `{prov['command']}` on {prov['date']} (swa-repro {prov['swa_repro_commit']}; sglang "
        f"{VERSION}, whose flashinfer pin is {prov['flashinfer_pin']}; the CPU audits ran with flashinfer "
        f"{prov['base_flashinfer']}'s call contract, torch {prov['torch']}).",
        "",
        "FlashInfer picks the compiled attention kernel at `plan()`: `window_left >= 0` selects the one with the "
        "per-element sliding-window mask, `logits_soft_cap > 0` the one with the tanh cap. The deprecated "
        "`forward()` / `forward_return_lse()` only overwrite `_window_left` / `_logits_soft_cap` on the wrapper, "
        "which the kernel planned without them ignores. sglang's FlashInfer backend passes a layer's window and "
        "cap to `forward()` on several paths but not to the `plan()` before it, so those layers silently run "
        f"without them. Line numbers are `python/sglang/{REL_PATH}` of sglang {VERSION}.",
        "",
        "The fixes are five separate PRs, each applying alone on sglang "
        f"{VERSION} (`git am --keep-non-patch docs/upstream/pr-<x>/*.patch` in a clean checkout), every commit "
        "bisectable: it carries its fix, the attention-kit expectation that fix needs and the registered-test "
        "methods it makes pass (see **PR series** below, and each folder's `PR.md`). Each `<finding>.diff` "
        f"applies alone; `all.diff` is the backend's plan-time findings in one step. {uf.series_text(family)[1]} "
        f"Each finding's section names the upstream issues and PRs on the same finding. `{TEST}` is the combined "
        "regression test of all five (for a checkout with every PR; each PR carries the cut of it its finding "
        f"needs), in the style of sglang's attention test kit (CUDA; `python {TEST}`): with FlashInfer's wrappers "
        f"replaced by swa-repro's CPU model of them (`tests/test_upstream_kit.py`) it fails on {VERSION} as shipped "
        "and passes with every fix; its CUDA run is in the live section below when recorded.",
        "",
        "Audit cells: `swa-repro audit --sglang 0.5.23 [--fix NAME]` on a CPU (sglang's own code with recording "
        "FlashInfer stand-ins): **holds** (the layer's parameter reaches `forward()` but not `plan()`, with a "
        "visible effect), **fixed** (it reaches `plan()`), **absent**, **not driven**. Keys: per path, whether "
        "each query of the window-8 layer attends exactly its window (**extra**: queries seeing keys outside it).",
        "",
        "| finding | as shipped | with its fix | with all.diff |",
        "|---|---|---|---|",
    ]
    for n in ORDER:
        mine = runs.get(n)
        lines.append(f"| {at.CLASSES[n].title} | {at.cell(shipped, n)['state']} | "
                     f"{at.cell(mine, n)['state'] if mine else '(nothing to apply)'} | {at.cell(runs['all'], n)['state']} |")
    lines += list(prs)  # the PR series and the review response (pr_readme)
    for n in ORDER:
        f = FIXES[n]
        lines += ["", f"## {n}: {at.CLASSES[n].title}", "", f"**Problem.** {probs[n]}", ""]
        if st[n].state == "applied":
            lines.append(f"**Fix.** Nothing to do in {VERSION}: already fixed upstream (PR #31501). No diff.")
        elif f.requires:
            lines.append(f"**Fix.** No diff of its own: it is {' + '.join(f'`{r}.diff`' for r in f.requires)} "
                         "(captures plan through the same code; a `fast_decode_plan` replay takes the cap, a "
                         "`fast_prefill_plan` replay keeps the module captured with it).")
        else:
            added = ds[n].count("\n+") - 1
            lines.append(f"**Fix** (`{n}.diff`, {added} line{'' if added == 1 else 's'} added): {f.summary}. "
                         f"{DETAIL.get(n, '')}".rstrip())
        lines += ["", f"- audit as shipped: {cell_text(shipped, n)}"]
        if n in runs:
            lines.append(f"- audit with `--fix {n}`: {cell_text(runs[n], n)}")
        lines.append(f"- audit with all fixes: {cell_text(runs['all'], n)}")
        lines += ["", upstream_section(n)]
    lines += ["", "## Limits", "",
              "- The soft cap is read from the model's attention layers at start-up (their `logit_cap`, so "
              "grok.py's fallback of 30 without `attn_logit_softcapping` is planned); layers of different caps "
              "are refused at start-up, a layer with another method than tanh, or (a runner whose model holds no "
              "layer, as the attention test kit's) a layer whose cap is not the planned one, at its first forward "
              "with a ValueError naming both caps (`swa_repro/sglang/fix/cap_safety.py` "
              "drives each on 0.5.23: shipped computes them silently, fixed refuses them).",
              "- EAGLE / NGRAM verify with the sliding-window KV pool: wrapper 0's whole-sequence indices also name "
              "slots outside the window. The planned (widened) window skips the tiles before it and the mask "
              "masks the rest, but the indices are listed (the cost of exact keys without re-slicing the tree mask).",
              "- Where a layer has no window or no cap, the ragged and decode plans now pass `window_left=-1` / "
              "`logits_soft_cap=0.0` explicitly: the defaults they planned with before."]
    from swa_repro.sglang.fix.kit_tree import TREE_DECISION

    lines += ["", "## The kit's window for a tree draft token (Triton apart)", "", *TREE_DECISION]
    lines += alternative_lines(runs, cost)
    stale = stale_live(text, live_diff) if after is not None else None
    also = live_fix_set(text, live_diff) if after is not None else None
    lines += ["", "## Live on an H200", "", *([stale, ""] if stale else []), *([also, ""] if also else []),
              *live_lines(before, after),
              *regress_lines(regress_log, kit, stale=stale is not None)]
    return "\n".join(lines) + "\n"


def commit_body(texts: dict, name: str) -> str:
    """A commit message body: the problem (file:line in the release; ``texts``: sglang-package file
    -> 0.5.23's text), the fix, the upstream threads on the same finding (``fix.upstream_refs``),
    wrapped at 72 as git wants. No tool is advertised in it (a maintainer's review, issue #40)."""
    import textwrap

    from swa_repro.sglang.fix import BACKEND
    from swa_repro.sglang.fix import upstream_family as uf
    from swa_repro.sglang.fix.family_fixes import FAMILY_ORDER
    from swa_repro.sglang.fix.upstream_refs import REFS

    f = FIXES[name]
    if name in FAMILY_ORDER:
        problem = uf.problem(name, {n: texts[FIXES[n].file] for n in FAMILY_ORDER})
    else:
        problem = problems(texts[BACKEND])[name]
    paras = [f"Problem: {problem}", f"Fix: {f.summary}. {DETAIL.get(name, '')}".rstrip()]
    refs = REFS.get(name, ())
    if refs:
        paras.append("Upstream: " + "; ".join(f"{r.repo}#{r.number} ({r.kind}, {r.state})" for r in refs) + ".")
    return "\n\n".join(textwrap.fill(p, 72, break_on_hyphens=False, break_long_words=False) for p in paras)


def series_texts() -> dict[str, str]:
    """sglang-package file -> 0.5.23's text, for every file a fix of the series edits."""
    from swa_repro.sglang.fix import ALL
    return {f: release_file(f) for f in dict.fromkeys(FIXES[n].file for n in ALL)}


def write(out: Path, *, command: str, note=print) -> list[Path]:
    from swa_repro.sglang.fix import BACKEND, pr_readme, pr_series
    from swa_repro.sglang.fix.series import fix_names
    from swa_repro.sglang.provision import provision

    texts = series_texts()
    text = texts[BACKEND]
    ds = diffs(text)
    runs = audits(note=note)
    prov = at.provenance(command, list(runs.values()))
    prov["flashinfer_pin"] = provision(VERSION)[1].get("flashinfer_pin")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, d in ds.items():
        p = out / f"{name}.diff"
        if d is None:
            p.unlink(missing_ok=True)
            continue
        write_atomic(p, d.encode())  # never through a link
        written.append(p)
    from swa_repro.sglang.fix import kit_edits

    written += kit_edits.write(out)  # kit_*.diff, kit.diff: the attention test kit's side of the change
    written += pr_series.write(out, lambda n: commit_body(texts, n))  # pr-*/: the separate PR series
    from swa_repro.sglang.fix import upstream_family

    written += upstream_family.write(out, note=note)  # the family- and GPU-class-level fixes
    md = out / "README.md"
    regress, kit, cost = LIVE / "regress.log", LIVE / "kit-after.json", LIVE / "alt-cost.json"
    live_diff = LIVE / "fix.diff"
    from swa_repro.sglang.fix.family_fixes import FAMILY_ORDER

    family = tuple(n for n in fix_names(texts) if n in FAMILY_ORDER)
    write_atomic(md, readme(text, ds, runs, prov, load_live(LIVE / "audit-live-before.json.xz"),
                         load_live(LIVE / "audit-live-after.json.xz"),
                         regress.read_text() if regress.is_file() else None,
                         json.loads(kit.read_text()) if kit.is_file() else None,
                         live_diff=live_diff.read_text() if live_diff.is_file() else None,
                         cost=json.loads(cost.read_text()) if cost.is_file() else None, family=family,
                         prs=pr_readme.pr_lines(out) + pr_readme.review_lines()).encode())
    return written + [md]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m swa_repro.sglang.fix.upstream", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "upstream")
    a = p.parse_args(argv)
    for f in write(a.out, command="python -m swa_repro.sglang.fix.upstream --out " + str(a.out)):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
