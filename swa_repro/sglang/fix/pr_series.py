"""The fixes as the separate PR series an sglang maintainer asked for (issue #40), against 0.5.23.

One series per finding group (``PRS``), each in ``docs/upstream/pr-<key>-<slug>/``: ``git am`` of its
patches applies alone in a clean 0.5.23 checkout, and every commit is bisectable: it carries its
fix, the attention-kit expectation that fix needs (a piece of ``kit_edits``: the kit's SWA cases
past the window go in with the ragged fix that makes them pass, the DFlash per-element window with
the DFlash fix, ...) and the registered-test methods it makes pass (``pr_tests``), so the kit and the
series' own test pass after each commit, not only after the last (review point 6). A series'
state after commit ``k`` is ``apply_fixes`` of its first ``k`` fixes on the release's files and
its first ``k`` kit pieces on the release's kit: each patch is the difference of two such states.
``pr_check`` applies the patches commit by commit and runs the kit on the CPU stand-ins.
"""

from __future__ import annotations

from dataclasses import dataclass

from swa_repro.sglang.fix import FIXES, apply_fixes, pr_tests
from swa_repro.sglang.fix import kit_edits as ke

TEST_DIR = "test/registered/attention/unittests/swa"


@dataclass(frozen=True)
class Step:
    fix: str  # the finding whose fix this commit is (``fix.FIXES``)
    kit: tuple[str, ...] = ()  # kit pieces (``PIECES``) the fix's tests need
    tests: tuple[str, ...] = ()  # ``pr_tests.METHODS`` this commit adds to the series' test
    sm100: bool = False  # the series' test also registers on the B200 runner from here on


@dataclass(frozen=True)
class PR:
    key: str
    slug: str
    title: str
    steps: tuple[Step, ...]
    test: str  # the registered test's file name under TEST_DIR
    twin: str  # the upstream PR this series is the counterpart of, and how they relate
    review: str  # what the review asked of this group
    precondition: bool = True  # its test checks its case lists put keys outside the window (a window PR)

    @property
    def dir(self) -> str:
        return f"pr-{self.key}-{self.slug}"

    @property
    def test_path(self) -> str:
        return f"{TEST_DIR}/{self.test}"


# kit piece -> (kit edit, which of its anchored parts: a prefix of ``Anchored.what``, "" for all)
PIECES = {
    "kit_swa_cases:no_prefix": ("kit_swa_cases", "no-prefix"),
    "kit_swa_cases:prefix": ("kit_swa_cases", "prefix"),
    "kit_logit_cap": ("kit_logit_cap", ""),
    "kit_dflash_swa_verify": ("kit_dflash_swa_verify", ""),
    "kit_tree_verify_window": ("kit_tree_verify_window", ""),
}
SWA_TEST = "test_flashinfer_{}.py"
PRS = (
    PR("a", "ragged-window", "[FlashInfer] SWA: plan the window on the ragged prefill",
       (Step("ragged_no_prefix_window", ("kit_swa_cases:no_prefix",), ("test_ragged_no_prefix_window",)),
        Step("ragged_prefix_window", ("kit_swa_cases:prefix",), ("test_ragged_prefix_window",)),
        Step("sm100_no_cutlass_window", sm100=True)),
       SWA_TEST.format("ragged_window"),
       "sglang #34093 plans the window on the ragged wrapper too (with the cap); #32062 plans per-group "
       "metadata. Ours gives sliding layers a ragged wrapper of their own, so full layers keep the "
       "shared one as planned before",
       "ragged_no_prefix + ragged_prefix + the sm100 change, moving only the sliding-window wrapper off "
       "cutlass (point 5)"),
    PR("b", "soft-cap", "[FlashInfer] plan logits_soft_cap (prefill, decode, CUDA graph)",
       (Step("soft_cap_prefill", ("kit_logit_cap",), ("test_ragged_no_prefix_soft_cap", "test_ragged_prefix_soft_cap",
                                                      "test_paged_window_soft_cap", "test_paged_soft_cap")),
        Step("soft_cap_decode", (), ("test_decode_window_soft_cap", "test_decode_soft_cap",
                                     "test_decode_window_soft_cap_cuda_graph"))),
       SWA_TEST.format("soft_cap"),
       "sglang #38525 (open) and #34093 (open) plan the same cap; #33987 (closed) read it from the layers. "
       "One of them should land: this series is the review's version of it, with its kit cases, to be "
       "folded into whichever the maintainers keep",
       "prefill + decode + CUDA graph, coordinated with #34093 / #38525, right for Grok (point 3)",
       precondition=False),
    PR("c", "dflash-window", "[FlashInfer] DFlash verify: plan window_left",
       (Step("dflash_verify_window", ("kit_dflash_swa_verify",),
             ("test_dflash_expectation", "test_dflash_verify_window")),),
       SWA_TEST.format("dflash_window"),
       "sglang #35208 (open) makes the same backend change (the window gate lets DFLASH_VERIFY plan "
       "window_left) and the same kit correction (the DFlash reference mask from `prefix_len - window` to "
       "`q_pos - window`, which turns `runner_dflash_verify_swa_chain` into its regression test). Where ours "
       "differs: the gate is a helper (`_plans_window`) rather than an inline condition; the kit's "
       "comment in `_make_spec_verify_input` is rewritten too (it still says the metadata clips the "
       "prefix); and a registered case with prefixes past the window (1, 4, 9, 17 at window 4) checks the "
       "reference itself. Review of #35208: approve; take its test, add ours",
       "a review of #35208, saying where theirs and ours differ"),
    PR("d", "spec-verify-window", "[FlashInfer] EAGLE / NGRAM verify: plan the window, a mask buffer per wrapper",
       (Step("eagle_verify_window", ("kit_tree_verify_window",),
             ("test_eagle_verify_window", "test_ngram_verify_window", "test_frozen_kv_mtp_verify_window",
              "test_eagle_verify_window_cuda_graph", "test_ngram_verify_window_cuda_graph",
              "test_frozen_kv_mtp_verify_window_cuda_graph")),),
       SWA_TEST.format("spec_verify_window"),
       "sglang #39160 (closed) named the per-wrapper packed-mask buffers; #39287 (open) compacts the tree "
       "mask to the window's keys, FlashInfer and Triton. Ours keeps the whole sequence and plans the "
       "window widened by the draft on a windowed copy of the tree mask",
       "EAGLE / NGRAM verify with per-wrapper mask buffers under CUDA graphs (point 1)"),
    PR("e", "cohere2-window", "[Model] Cohere2: give the runner the layers' sliding window",
       (Step("commandr_window_hook", (), ("cohere2",)),),
       "test_cohere2_runner_window.py",
       "sglang #4823 (merged) added the same hook to Gemma-3; #4570 (open) asks for Cohere2's interleaved "
       "sliding layers",
       "plan what the layers ask, no `- 1` (point 4)"),
)
COHERE2_TEST_DIR = "test/registered/models"


def test_path(pr: PR) -> str:
    return f"{COHERE2_TEST_DIR}/{pr.test}" if pr.key == "e" else pr.test_path


def pieces(pr: PR) -> tuple[str, ...]:
    return tuple(p for s in pr.steps for p in s.kit)


def kit_pieces_known(names) -> tuple[str, ...]:
    """The pieces whose kit edit ``kit_edits`` still has (an edit it dropped has no piece to place)."""
    return tuple(p for p in names if PIECES[p][0] in ke.EDITS)


def kit_state(kit: dict[str, str], names) -> dict[str, str]:
    """The release kit ``kit`` (``kit_edits.read``) with the pieces ``names`` applied, in ``kit_edits``'
    order; each piece's anchored parts as ``kit_edits`` defines them."""
    out = dict(kit)
    for name in kit_pieces_known(names):
        edit, part = PIECES[name]
        path, edits = ke.EDITS[edit]
        for e in edits:
            if e.what.startswith(part):
                out[path] = e.apply(out[path], path)
    return out


def test_doc(pr: PR) -> str:
    findings = ", ".join(f"`{s.fix}`" for s in pr.steps)
    return (f"{pr.title.split('] ', 1)[1][0].upper()}{pr.title.split('] ', 1)[1][1:]}.\n\n"
            "FlashInfer compiles a layer's sliding window and logits soft cap in at\n"
            "plan(); forward() only overwrites them on the wrapper. These cases drive\n"
            f"the paths this change plans ({findings}) with keys\n"
            "outside the window, against the attention kit's references.")


def state(pr: PR, k: int, texts: dict[str, str], kit: dict[str, str]) -> dict[str, str]:
    """sglang-repository path -> text after the series' first ``k`` commits (only paths some commit
    of the series touches; a path absent before its first commit is absent)."""
    steps = pr.steps[:k]
    out = {}
    files = dict.fromkeys(FIXES[s.fix].file for s in pr.steps)
    for f in files:
        out[f"python/sglang/{f}"] = apply_fixes(texts[f], tuple(s.fix for s in steps if FIXES[s.fix].file == f), f)
    for path, text in kit_state(kit, [p for s in steps for p in s.kit]).items():
        if any(PIECES[p][0] in ke.EDITS and ke.EDITS[PIECES[p][0]][0] == path for p in pieces(pr)):
            out[f"python/{path}"] = text
    methods = tuple(m for s in steps for m in s.tests)
    if methods:
        out[test_path(pr)] = pr_tests.test_text(test_doc(pr), methods, sm100=any(s.sm100 for s in steps),
                                                precondition=pr.precondition)
    return out


# ----------------------------------------------------------------------------- commits
def file_diff(old: str | None, new: str, path: str) -> str:
    """``old`` -> ``new`` of sglang-repository ``path`` (``old`` None: a new file, as git writes it)."""
    import difflib

    if old is None:
        lines = new.splitlines(keepends=True)
        return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
                f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{ln}" for ln in lines))
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))


def step_body(pr: PR, k: int, body) -> str:
    """The commit message: the fix's (``body(name)``, as ``upstream.commit_body``), then what the
    commit changes in the kit and the test, so a reader of one commit sees why its tests pass."""
    import textwrap

    s = pr.steps[k - 1]
    extra = []
    kit = kit_pieces_known(s.kit)
    if kit:
        extra.append("Kit: " + "; ".join(PIECE_TEXT[p] for p in kit) + ".")
    if s.tests == ("cohere2",):
        extra.append(f"Test: {test_path(pr)}, a CPU unit test: the runner's window is the one the layers get.")
    elif s.tests:
        extra.append(f"Test: {test_path(pr)} gains " + ", ".join(f"`{m}`" for m in s.tests) + ".")
    if s.sm100:
        extra.append(f"Test: {test_path(pr)} is registered on the B200 runner too (sm100's cutlass "
                     "ragged prefill; the kit's head dim 64 selects it).")
    wrapped = [textwrap.fill(p, 72, break_on_hyphens=False, break_long_words=False) for p in extra]
    return "\n\n".join([body(s.fix).rstrip(), *wrapped])


PIECE_TEXT = {
    "kit_swa_cases:no_prefix": "the SWA no-prefix case list gains a case past the window "
    "(extend lengths 6, 9, 17 at window 4), which a ragged extend without the window fails",
    "kit_swa_cases:prefix": "the SWA prefix case list gains a case past the window (prefixes 9, 5, 17, "
    "extends 2, 6, 8), whose new tokens attend each other past the window",
    "kit_logit_cap": "DenseAttentionCase gets logit_cap (default 0.0: every existing case unchanged), "
    "given to the layer and the model config; both references cap the scores",
    "kit_dflash_swa_verify": "the DFlash SWA verify reference is the per-element window (the query at "
    "q_pos attends q_pos - window .. q_pos), not the request-granular trim; "
    "runner_dflash_verify_swa_chain becomes this fix's regression test",
    "kit_tree_verify_window": "the custom-mask reference windows a draft token from its position in "
    "the tree (committed length + depth), not its index in the flattened draft; chains are unchanged; "
    "the backends that still count by index are declared (TREE_WINDOW_BY_INDEX: Triton, a finding of its "
    "own) and keep their expectation",
}


def commits(pr: PR, texts: dict[str, str], kit: dict[str, str], body) -> list:
    """``series.Commit`` per step: the difference of the states before and after it."""
    from swa_repro.sglang.fix.series import SUBJECTS, Commit

    out, prev = [], state(pr, 0, texts, kit)
    for k in range(1, len(pr.steps) + 1):
        cur = state(pr, k, texts, kit)
        diff = "".join(file_diff(prev.get(p), t, p) for p, t in cur.items() if prev.get(p) != t)
        s = pr.steps[k - 1]
        out.append(Commit(s.fix, SUBJECTS[s.fix], step_body(pr, k, body), diff))
        prev = cur
    return out


def release_texts() -> tuple[dict[str, str], dict[str, str]]:
    """(sglang-package file -> 0.5.23's text for every file a series edits, 0.5.23's kit)."""
    from swa_repro.sglang.fix.upstream_diff import VERSION, release_file
    from swa_repro.sglang.provision import provision

    files = dict.fromkeys(FIXES[s.fix].file for pr in PRS for s in pr.steps)
    return {f: release_file(f) for f in files}, ke.read(provision(VERSION)[0])


def write(out, body) -> list:
    """``out/<pr.dir>/000k-*.patch``, ``series`` and ``PR.md`` for each series; the stacked
    ``out/series/`` of before #40 is removed (it was not bisectable)."""
    import shutil

    from swa_repro.core.outputs import write_atomic
    from swa_repro.sglang.fix.series import write_series

    texts, kit = release_texts()
    shutil.rmtree(out / "series", ignore_errors=True)
    written = []
    for pr in PRS:
        cs = commits(pr, texts, kit, body)
        written += write_series(out / pr.dir, cs)
        md = out / pr.dir / "PR.md"
        write_atomic(md, pr_description(pr, cs).encode())
        written.append(md)
    return written


def pr_description(pr: PR, cs) -> str:
    """The PR's description: title, what, why, upstream twin, test plan."""
    from swa_repro.sglang.fix.pr_tests import NOT_ON_CPU
    from swa_repro.sglang.fix.upstream_refs import REFS

    refs = list(dict.fromkeys(r for s in pr.steps for r in REFS.get(s.fix, ())))
    lines = [f"# {pr.title}", "", "Do not edit: regenerate (`python -m swa_repro.sglang.fix.upstream --out docs/upstream`).",
             "", "## What", ""]
    lines += [f"{k}. `{c.subject}`: {FIXES[s.fix].summary}." for k, (s, c) in enumerate(zip(pr.steps, cs), 1)]
    lines += ["", "## Why", "", f"Review of `docs/upstream` (issue #40) asked for {pr.review}. Each commit carries "
              "the attention-kit expectation its fix needs and the test methods it makes pass, so every commit "
              "passes `swa/test_flashinfer.py` and this PR's test on its own.", "", "## Upstream twin", "",
              f"{pr.twin}.", ""]
    lines += [f"- [{r.label}]({r.url}) ({r.kind}, {r.state}): {r.title}" for r in refs]
    cmd = f"python -m swa_repro.sglang.fix.pr_check --series {pr.key}"
    lines += ["", "## Test plan", "",
              f"- `git am --keep-non-patch docs/upstream/{pr.dir}/*.patch` in a clean sglang 0.5.23 checkout "
              f"({len(cs)} commit{'s' if len(cs) > 1 else ''}; `series` lists them).",
              f"- After each commit: `python {test_path(pr)}`"
              + ("" if pr.key == "e" else " and the kit's `swa/test_flashinfer.py`") + " (CUDA + FlashInfer), "
              "`ruff format --check` on the files it touches.",
              f"- On a CPU: `{cmd}` applies the commits one by one to 0.5.23's files and runs this test and "
              "the kit's FlashInfer cases after each, with swa-repro's plan-time stand-ins for FlashInfer's "
              "wrappers (graph-mode buffer rules included)"
              + "".join(f"; `{m}` is GPU-only ({why})" for m, why in NOT_ON_CPU.items()
                        if any(m in st.tests for st in pr.steps)) + ".", ""]
    return "\n".join(lines)
