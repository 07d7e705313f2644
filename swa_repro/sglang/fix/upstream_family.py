"""``docs/upstream/families.md`` and one diff per family- or GPU-class-level fix
(``fix.family_fixes``), against sglang 0.5.23's own files, written by ``fix.upstream`` (or alone:
``python -m swa_repro.sglang.fix.upstream_family --out docs/upstream``).

Audit cells: as shipped from the committed family table (``docs/audit/families.json``), with the
fixes from ``audit.family_companion.fixed_cells`` (0.5.23 with ``--fix all``, content-cached: the same
audits as the table's companion); the cells without a fix in sglang say what to do instead
(``audit.family_fix.remedy``). Nothing is typed by hand: regenerate, never edit.
"""

from __future__ import annotations

import argparse
import difflib
import json
from pathlib import Path

from swa_repro.core.outputs import write_atomic
from swa_repro.sglang.fix import FIXES, apply_fixes, states
from swa_repro.sglang.fix.family_fixes import FAMILY_ORDER
from swa_repro.sglang.fix.upstream_diff import ROOT, VERSION, release_file
from swa_repro.sglang.fix.upstream_refs import upstream_section

CELLS = {"commandr_window_hook": (("cohere2",), ("sm90", "sm100", "sm80")),  # the cells each fix answers
         "ragged_prefix_full_layers": ((), ()),  # 0.5.14-0.5.20 only: 0.5.23 has it
         "sm100_no_cutlass_window": (("gemma2",), ("sm100",))}
PROBLEM = {
    "commandr_window_hook": "`Cohere2ForCausalLM` ({cls}) has no `get_attention_sliding_window_size`, so the "
    "model runner derives no sliding window for it (Cohere2 is not in `is_hybrid_swa_model`'s list either) and "
    "the FlashInfer backend builds no sliding-window wrapper: ragged, paged and decode plans of the sliding "
    "layers are windowless, while the layers ask for `config.sliding_window` ({kw}). The hook returns that "
    "window, so the runner plans what the layers ask; the layers are unchanged. Their window is HF's count, "
    "which includes the query, one key more than transformers' mask in `RadixAttention`'s count (keys left of "
    "the query): vLLM keeps it on purpose (vLLM's commandr.py:237-243, Cohere's training convention), and the audit "
    "reports it as `layer != HF`, as vLLM's table does, not as a backend finding.",
    "ragged_prefix_full_layers": "Fixed in sglang 0.5.21 ({full}: `elif use_ragged:` plans the full layers' "
    "paged pass over `prefix_lens`). In 0.5.14-0.5.20 a model with sliding-window layers (Gemma-2, Gemma-3; "
    "Cohere2 with `commandr_window_hook`) plans it over `seq_lens` under ragged prefill with a cached prefix, "
    "so the unmasked paged pass of every full layer also sees the extend's own keys (the family table's "
    "`F ragged+prefix`, 0.5.15-0.5.20 on the default path, 0.5.14 with flags).",
    "sm100_no_cutlass_window": "On sm100 the ragged prefill wrapper is built with `backend=\"cutlass\"` ({gate}) "
    "for head dims 64/128 and 192/128, and FlashInfer's cutlass prefill plans neither `window_left` nor "
    "`logits_soft_cap` (flashinfer 0.7.2 prefill.py `plan`); sglang names the backend explicitly, which "
    "FlashInfer never rewrites. The sliding layers' window is the ragged-window fix's: its own wrapper is "
    "built with fa2 where the shared one is cutlass, so the full layers keep cutlass. A model whose layers "
    "cap their logits (Gemma-2) still runs the full layers' ragged prefill uncapped on cutlass: the shared "
    "wrapper keeps fa2 for such a model only.",
}
NO_FIX = ("Refused families never reach the FlashInfer backend (sglang's own server code refuses "
          "`--attention-backend flashinfer` for them, the reason and file:line below). Mistral and Qwen2 with a "
          "sliding window are not a FlashInfer-backend finding: sglang's llama.py / mistral.py / qwen2.py read no "
          "`sliding_window` in any release 0.5.14-0.5.23 (no warning either), so every backend serves them "
          "with full attention; adding the window is model support, as "
          "[sglang #22528](https://github.com/sgl-project/sglang/issues/22528) (issue, open) asks for Qwen3, "
          "and is not offered here.")


def diff_of(name: str, text: str) -> str:
    rel = FIXES[name].file
    path = f"python/sglang/{rel}"
    new = apply_fixes(text, (name,), rel)
    return "".join(difflib.unified_diff(text.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))


def _line(text: str, needle: str) -> int:
    return next(i + 1 for i, ln in enumerate(text.splitlines()) if needle in ln)


def _short(c) -> str:
    from swa_repro.sglang.audit.family_table import main_cell_text

    return main_cell_text(c)


def release_texts() -> dict[str, str]:
    """fix name -> 0.5.23's text of the file it edits."""
    return {n: release_file(FIXES[n].file) for n in FAMILY_ORDER}


def problem(name: str, texts: dict) -> str:
    """The finding's problem, its lines found in 0.5.23's files (``texts``: :func:`release_texts`)."""
    cmd, be = texts["commandr_window_hook"], texts["sm100_no_cutlass_window"]
    where = {"cls": f"`commandr.py:{_line(cmd, 'class Cohere2ForCausalLM')}`",
             "kw": f"`commandr.py:{_line(cmd, 'sliding_window_size=self.sliding_window_size')}`",
             "gate": f"`flashinfer_backend.py:{_line(be, 'fmha_backend = ' + chr(34) + 'cutlass')}`",
             "full": f"`flashinfer_backend.py:{_line(be, 'elif use_ragged:')}`"}
    return PROBLEM[name].format(**where)


def audit_command(name: str) -> str:
    """The family audit that finds ``name`` and reads it fixed (``--fix all``: the backend's
    plan-time fixes are part of what makes the family exact)."""
    fams, gpus = CELLS[name]
    return f"swa-repro audit --sglang {VERSION} --model {','.join(fams)} --gpu {gpus[0]} --fix all"


def series_text(family: tuple) -> tuple[str, str]:
    """What the series holds of the fixes here (``family``: those it has, in its order): the
    commits, then where the series ends and why the others are not in it (``VERSION``'s code has
    them: they read applied, ``fix.states``)."""
    have = ", ".join(f"`{n}` (`python/sglang/{FIXES[n].file}`)" for n in family)
    commits = (f"the family- and GPU-class-level findings of `families.md` that {VERSION} needs, one commit "
               f"each: {have or 'none'}")
    after = ""
    for n in (n for n in FAMILY_ORDER if n not in family):
        after += (f"Not in any PR: `{n}`, which {VERSION}'s code already has (the fix reads applied there); "
                  f"`swa-repro patch --fix {n}` backports it to the earlier releases that lack it (`families.md`). ")
    after = after.rstrip()
    return commits, after


def readme(texts: dict, shipped: dict, fixed: dict) -> str:
    from swa_repro.sglang.audit.family_fix import remedy, remedy_text

    lines = [f"# Family- and GPU-class-level findings in sglang {VERSION} (issue #25)", "",
             "Do not edit: regenerate (`python -m swa_repro.sglang.fix.upstream --out docs/upstream`).", "",
             "What `swa-repro audit --sglang X --model FAMILY --gpu G` finds beyond the backend's plan-time "
             "findings (`README.md`): one diff per finding, against sglang's own file (each applies alone; "
             "`all.diff` stays the backend's plan-time fixes). `swa-repro patch --fix NAME` makes the same "
             "edit on an installed sglang, on every release 0.5.14-0.5.23 whose file has the anchors. Cells: "
             f"as shipped from `docs/audit/families.json`; with the fixes: sglang {VERSION} audited with "
             f"`--fix all` ({fixed['command']}), the families' real windows and head dims on a CPU.", "",
             f"The PR series against {VERSION} (`README.md`, `pr-*/`) have each fix below that {VERSION} needs "
             "as a commit of its own, in the series of its finding; the others are "
             f"fixed in {VERSION}'s own code, so they have no diff here (every diff of this folder is against "
             f"{VERSION}, what upstream takes a PR against) and `swa-repro patch --fix NAME` is their backport.", ""]
    from swa_repro.sglang.fix.pr_series import PRS
    from swa_repro.sglang.fix.series import patch_name

    where = {s.fix: f"{pr.dir}/{patch_name(k, s.fix)}" for pr in PRS for k, s in enumerate(pr.steps, 1)}
    for name in FAMILY_ORDER:
        fams, gpus = CELLS[name]
        d = diff_of(name, texts[name])
        if not d:
            lines += [f"## {name}", "", f"**Problem.** {problem(name, texts)}", "",
                      f"**Fix.** Nothing to do in {VERSION}: no diff, and in no PR series. `swa-repro patch "
                      f"--fix {name}` backports it: {FIXES[name].summary}.", "", upstream_section(name), ""]
            continue
        lines += [f"## {name}", "", f"**Problem.** {problem(name, texts)}", "",
                  f"**Fix** (`{name}.diff`, `python/sglang/{FIXES[name].file}`, {d.count(chr(10) + '+') - 1} "
                  f"lines added; in `{where[name]}`): "
                  f"{FIXES[name].summary}.", "", "| family | GPU | as shipped | with --fix all |",
                  "|---|---|---|---|"]
        lines += [f"| {f} | {g} | {_short(shipped.get(g, {}).get(f))} | {_short(fixed['cells'].get(g, {}).get(f))} |"
                  for f in fams for g in gpus]
        lines += ["", upstream_section(name), ""]
    lines += ["## No fix in sglang (what to do instead)", "", NO_FIX, ""]
    for g, cells in shipped.items():
        for f, c in cells.items():
            r = remedy(f, c, g, VERSION)
            if r["instead"]:
                lines.append(f"- **{f}** on {g}: {remedy_text(r)}.")
    return "\n".join(lines) + "\n"


def shipped_cells() -> dict:
    """gpu -> family -> 0.5.23's cell of the committed family table."""
    t = json.loads((ROOT / "docs" / "audit" / "families.json").read_text())
    return {r["gpu"]: r["cells"] for r in t["rows"] if r["sglang"] == VERSION}


def write(out: Path, note=print) -> list[Path]:
    from swa_repro.sglang.audit.family_companion import fixed_cells

    texts = release_texts()
    assert all(states(texts[n], (n,), FIXES[n].file)[n].state != "unknown" for n in FAMILY_ORDER)
    shipped = shipped_cells()
    fixed = fixed_cells(list(shipped), note=note)
    written = []
    for n in FAMILY_ORDER:
        p, d = out / f"{n}.diff", diff_of(n, texts[n])
        if not d:  # the release has it
            p.unlink(missing_ok=True)
            continue
        write_atomic(p, d.encode())  # never through a link
        written.append(p)
    md = out / "families.md"
    write_atomic(md, readme(texts, shipped, fixed).encode())
    return written + [md]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m swa_repro.sglang.fix.upstream_family", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "upstream")
    for f in write(p.parse_args(argv).out):
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
