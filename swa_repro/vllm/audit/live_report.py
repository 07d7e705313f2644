"""A live vLLM document (``vllm.audit.live``) in words: one line per layer kind and path, and the answer
per family and site (``python -m swa_repro.vllm.audit.live_report FILE...``; a recording's SUMMARY.md).

A row's words come from its numbers only: the kernels that ran and what they were told, the rows
whose keys are not the window the layer asks for (and not transformers' mask), the rows off the
float64 reference at what the layer asks past ``ATOL``, and whether every row agrees with the
reference at what its kernel was told (the audit's claim, held to the kernel).
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

from swa_repro.core.outputs import write_atomic


def load(path) -> dict:
    p = Path(path)
    raw = lzma.decompress(p.read_bytes()) if p.suffix == ".xz" else p.read_bytes()
    return json.loads(raw)


def row_line(r: dict) -> str:
    """One layer kind on one path, in words."""
    head = f"{r.get('layer')} / {r.get('path')}"
    if "cap" not in r:
        return f"- {head}: {r.get('error') or r.get('not_run') or 'no result'}"
    ks = ", ".join(f"{k['kernel']} (told window {k['told_window_left']}, cap {k['told_logits_soft_cap']:g})"
                   for k in r["kernels"])
    c, k = r["cap"], r["keys"]
    rows = sum(x["rows"] for x in c["requests"])
    a = r["asked"]
    parts = [f"asks window {a['window_left']}, cap {a['logits_soft_cap']:g}; ran {ks}",
             (f"keys: not read ({k['not_run']})" if "not_run" in k else
              f"keys: {k['rows_off_asked']} of {rows} rows off the asked window, {k['rows_off_hf']} off transformers' mask"),
             f"outputs: {c['wrong_rows']} of {rows} rows wrong (max {max(x['max_err_asked'] for x in c['requests']):.3g})",
             "the kernel does what it is told" if c["told_agrees"] else "**the kernel does not do what it is told**"]
    return f"- {head}: " + "; ".join(parts)


def verdict(fam: dict) -> str:
    """The family on this site: wrong where a row is off the reference or its keys are off the asked window."""
    rows = [r for r in fam["rows"] if "cap" in r]
    if not rows:
        return "not run"
    wrong = sum(r["cap"]["wrong_rows"] for r in rows) + sum(r["keys"].get("rows_off_asked", 0) for r in rows)
    hf = sum(r["keys"].get("rows_off_hf", 0) for r in rows)
    told = all(r["cap"]["told_agrees"] for r in rows)
    undone = len(fam["rows"]) - len(rows)
    unread = sum("not_run" in r["keys"] for r in rows)
    words = [f"{wrong} wrong rows" if wrong else "every row as the layers ask",
             (f"{hf} rows attend other keys than transformers' mask" if hf else
              "keys not read" if unread == len(rows) else "keys as transformers' mask"),
             "every kernel does what it is told" if told else "a kernel does not do what it is told"]
    if undone:
        words.append(f"{undone} paths not run")
    return "; ".join(words)


def render(docs: dict) -> list[str]:
    """``{site name: document}`` -> Markdown lines."""
    out = []
    for site, d in docs.items():
        sm = "".join(map(str, d.get("arch", [])))
        out += [f"## {site}: vLLM {d.get('vllm')} on {d.get('device')} (sm{sm}), flashinfer {d.get('flashinfer')}, "
                + str(d.get("kernels")), ""]
        for name, fam in d["families"].items():
            out += [f"### {name}: {verdict(fam)}", ""] + [row_line(r) for r in fam["rows"]] + [""]
    return out


def merge(docs: list[dict]) -> dict:
    """Several children's documents of one site (each a share of the families and paths, run at once
    so that their JIT builds overlap) -> one, rows in ``live.LIVE_PATHS`` order per layer kind."""
    from swa_repro.vllm.audit.live import LIVE_PATHS

    if not docs:
        raise ValueError("nothing to merge")
    keys = ("vllm", "device", "arch", "flashinfer", "kernels", "torch")
    for d in docs[1:]:
        diff = [k for k in keys if d.get(k) != docs[0].get(k)]
        if diff:
            raise ValueError(f"the documents differ in {', '.join(diff)}: not one site's run")
    out = {**docs[0], "families": {}, "merged_from": len(docs)}
    for d in docs:
        for name, fam in d["families"].items():
            have = out["families"].setdefault(name, {**fam, "rows": []})
            have["rows"] += fam["rows"]
    order = {p: i for i, p in enumerate(LIVE_PATHS)}
    for fam in out["families"].values():
        fam["rows"].sort(key=lambda r: (r.get("layer", ""), order.get(r.get("path"), len(order))))
    return out


HEAD_KEYS = ("date -u:", "GPU ", "driver:", "torch:", "code digest:", "steps:")


def summary(call: Path) -> list[str]:
    """A recorded call (``scripts/gpu_vllm.sh``'s files, unchanged) -> its SUMMARY.md: the provenance
    lines of its gpu.txt, then each site's document in words."""
    head = [ln.strip() for ln in (call / "gpu.txt").read_text().splitlines() if ln.strip().startswith(HEAD_KEYS)]
    docs = {site: load(call / f"live-{site}.json.xz") for site in ("shipped", "fixed")
            if (call / f"live-{site}.json.xz").is_file()}
    said = f"Generated by `python -m swa_repro.vllm.audit.live_report --summary {call.name}` from this folder's files. Do not edit."
    return [f"# vLLM live, {call.name}", "", said, ""] + [f"- {ln}" for ln in head] + [""] + render(docs)


def main(argv=None) -> int:
    """``FILE...`` -> Markdown on stdout; ``--merge OUT FILE...`` -> one site's document in OUT;
    ``--summary CALL...`` -> each recorded call's SUMMARY.md."""
    args = list(argv if argv is not None else sys.argv[1:])
    if args[:1] == ["--summary"]:
        for call in map(Path, args[1:]):
            write_atomic(call / "SUMMARY.md", ("\n".join(summary(call)) + "\n").encode())  # never through a link
            print(call / "SUMMARY.md")
        return 0
    if args[:1] == ["--merge"]:
        if len(args) < 3:
            print("usage: python -m swa_repro.vllm.audit.live_report --merge OUT.json FILE...", file=sys.stderr)
            return 2
        write_atomic(args[1], json.dumps(merge([load(f) for f in args[2:]])).encode())
        return 0
    docs = {Path(f).name.split(".")[0]: load(f) for f in args}
    print("\n".join(render(docs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
