"""docs/upstream/README.md's "PR series" and "Review response" sections (issue #40).

Each PR's row comes from ``pr_series.PRS`` and its committed folder; each review point's answer
names the fix's own summary (``fix.FIXES``: the code's words, so a changed fix changes the answer)
and where its test is. The bisect table is ``pr_check``'s recorded run (``pr-check.json``), shown
only if it ran on the committed patches (their digest); otherwise the README says it has not.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from swa_repro.sglang.fix import FIXES
from swa_repro.sglang.fix import kit_edits as ke
from swa_repro.sglang.fix import uno_verify
from swa_repro.sglang.fix.pr_series import PRS, kit_pieces_known, test_path
from swa_repro.sglang.fix.pr_tests import NOT_ON_CPU
from swa_repro.sglang.fix.upstream_diff import DETAIL, release_file

RECORD = "pr-check.json"
_BISECT = "### Bisect check on a CPU"


def patches_digest(out: Path) -> str:
    """sha256 over every PR folder's ``series`` and patches, in order."""
    h = hashlib.sha256()
    for pr in PRS:
        d = out / pr.dir
        names = (d / "series").read_text().split() if (d / "series").is_file() else []
        for n in ["series", *names]:
            h.update(n.encode())
            h.update((d / n).read_bytes())
    return h.hexdigest()


def pr_lines(out: Path) -> list[str]:
    lines = ["", "## PR series", "",
             "Each applies alone on a clean 0.5.23 checkout (`git am --keep-non-patch docs/upstream/pr-<x>/*.patch`); "
             "landing one after another may need a rebase where two touch the same lines of the backend. A "
             "commit carries its fix, the kit expectation it needs and the test methods it makes pass.", "",
             "| PR | commits | kit changes, in the commit of their fix | its test | upstream twin |", "|---|---|---|---|---|"]
    for pr in PRS:
        names = (out / pr.dir / "series").read_text().split() if (out / pr.dir / "series").is_file() else []
        kit = ", ".join(f"`{p}` (with `{s.fix}`)" for s in pr.steps for p in kit_pieces_known(s.kit)) or "none"
        lines.append(f"| [`{pr.dir}`]({pr.dir}/PR.md): {pr.title} | {len(names)}: "
                     + ", ".join(f"`{n}`" for n in names) + f" | {kit} | `{test_path(pr)}` | {pr.twin.split('. ')[0]} |")
    return lines + bisect_lines(out)


def bisect_lines(out: Path) -> list[str]:
    rec = out / RECORD
    head = ["", _BISECT, "",
            "`python -m swa_repro.sglang.fix.pr_check --record` applies each series alone to 0.5.23's files, one "
            "commit at a time, and after each runs `ruff format --check` on the files it touches, the series' "
            "registered test as it stands and the kit's FlashInfer cases (`tests/sglang_kit_flashinfer_cases.py`) "
            "on the CPU stand-ins; and, without the commit's fix, the test methods it adds, which must fail there "
            "(`make test-matrix` runs it: `tests/test_upstream_pr_check.py`)."]
    if not rec.is_file():
        return head + ["", "Not recorded yet for these patches."]
    doc = json.loads(rec.read_text())
    if doc.get("patches_sha256") != patches_digest(out):
        return head + ["", f"`{RECORD}` is from other patches than these: run it again."]
    lines = head + ["", f"Recorded {doc['date']} (swa-repro {doc['swa_repro_commit']}):", "",
                    "| PR | commit | touched | tests after it | its tests without its fix | verdict |",
                    "|---|---|---|---|---|---|"]
    for d, rows in doc["results"].items():
        for r in rows:
            after = sum(len(v["subtests"]) or len(v["tests"]) for v in r["after"].values())
            before = r.get("before")
            bad = sum(1 for v in (before or {}).values() for s in v["tests"].values() if s != "pass")
            lines.append(f"| `{d}` | `{r['commit']}` | {len(r['touched'])} files | {after} cases | "
                         f"{f'{bad} failing' if before else '(adds no test)'} | {r['verdict']} |")
    return lines + [""] + [f"Not judged on a CPU (GPU only): `{m}`: {why}." for m, why in NOT_ON_CPU.items()]


def sliding_backend() -> str:
    """The ``backend=`` the ragged fix gives the sliding-window wrapper, read from the fix's own
    edit of 0.5.23's file (an added ``backend=...`` line)."""
    import re

    from swa_repro.sglang.fix import BACKEND, apply_fixes

    text = release_file(BACKEND)
    old = set(text.splitlines())
    added = [ln.strip() for ln in apply_fixes(text, ("ragged_no_prefix_window",)).splitlines() if ln not in old]
    return next((m.group(1) for ln in added if (m := re.fullmatch(r"backend=(.+?),?", ln))),
                "the shared wrapper's backend")


def review_lines() -> list[str]:
    """Per point of the review (issue #40), what changed."""
    tree = "kit_tree_verify_window" in ke.EDITS
    pts = [
        ("EAGLE / NGRAM verify under CUDA graphs",
         f"PR d: {FIXES['eagle_verify_window'].summary}. Its test runs the CUDA-graph verify past the window, "
         "topk 1 and 2, for EAGLE, NGRAM and Frozen-KV MTP, through the kit's `run_dense_spec_verify_cuda_graph_case`; "
         "on the CPU stand-ins with FlashInfer's graph-mode buffers it fails as shipped and with the fix before "
         "#40 (`tests/test_upstream_kit.py`)."),
        ("The kit's tree reference and the other backends",
         ("PR d carries the kit's tree-position reference (`kit_tree_verify_window`) in the fix's own commit, "
          "not in a last kit commit"
          + ("; the backends the kit declares as counting a tree token by its flattened index "
             "(`TREE_WINDOW_BY_INDEX`: Triton) keep their expectation, and "
             + ", ".join(f"`{n}.diff`" for n in getattr(ke, "FOLLOW_UPS", {}))
             + " (in no PR here) is the kit side of that backend's own fix" if getattr(ke, "FOLLOW_UPS", None) else "")
          if tree else
          "The kit's reference is kept: PR d changes no kit expectation and the fix is expressed against it")
         + "; whether the kit's expectation holds for its other SWA backends (Triton, FA3) takes their GPU "
         "run (the live section, where recorded)."),
        ("Grok-1 and the soft cap", f"PR b: {FIXES['soft_cap_prefill'].summary}; "
         f"{FIXES['soft_cap_decode'].summary}. {DETAIL['soft_cap_prefill'].split('; ', 1)[0]}."),
        ("Cohere2's window", f"PR e: {FIXES['commandr_window_hook'].summary}. Its test "
         "(`test_cohere2_runner_window.py`) asserts the runner's window is `config.sliding_window`, the value "
         "the layers are given."),
        ("sm100 and full layers", f"PR a, its last commit: {FIXES['sm100_no_cutlass_window'].summary}. The "
         "sliding-window ragged wrapper of its first commit (`ragged_no_prefix_window`) is built with "
         f"`{sliding_backend()}`. PR a's test is registered on the B200 runner too (`1-gpu-b200`)."),
        ("Bisectable", "The one stacked series (kit changes last) is replaced by five PRs; each commit carries its "
         "kit expectation and test methods (the table above), and `pr_check` runs the kit after every commit. "
         "`est_time` is the recorded seconds per test method on an H100/H200 times the file's GPU methods "
         "(`pr_tests.seconds_per_test`), not a guess."),
    ]
    lines = ["", "## Review response (issue #40)", ""]
    lines += [f"{k}. **{title}.** {text}" for k, (title, text) in enumerate(pts, 1)]
    uno = uno_verify.reading(release_file)
    if uno is not None:
        lines += ["", f"Non-blocking, `UNO_VERIFY` and the window gate: {uno.text()}"]
    return lines


def record(out: Path, results: dict, commit: str, date: str) -> list[Path]:
    """``out/pr-check.json``, and README.md's bisect section rewritten from it (the section is
    ``bisect_lines``' whatever ran the generator; the rest of the README is left as it is)."""
    from swa_repro.core.outputs import write_atomic

    p = out / RECORD
    write_atomic(p, json.dumps({"date": date, "swa_repro_commit": commit, "patches_sha256": patches_digest(out),
                                "results": results}, indent=1).encode())
    md = out / "README.md"
    text = md.read_text()
    head, rest = text.split(_BISECT, 1)
    tail = rest[rest.index("\n## "):]
    write_atomic(md, (head + "\n".join(bisect_lines(out)[1:]) + "\n" + tail).encode())
    return [p, md]

