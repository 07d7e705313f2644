"""The diffs of ``docs/upstream`` against sglang 0.5.23's own file: where the file is, its text
(the provisioned overlay; any file of the release: ``release_file``), a unified diff with sglang's
repository paths, one per fix, why each has its shape (``DETAIL``), and the plus side of a diff
applied strictly (what ``patch -p1`` would make, without fuzz).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from swa_repro.sglang.fix import FIXES, apply_fixes, states
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.patch.classify import REL_PATH

VERSION = "0.5.23"
REPO_PATH = f"python/sglang/{REL_PATH}"
ROOT = Path(__file__).resolve().parents[3]
LIVE = ROOT / "recordings" / "sglang-live" / f"fix-{VERSION}"
TEST = "test/registered/attention/unittests/swa/test_flashinfer_plan_time_params.py"  # sglang's layout


def release_file(rel: str) -> str:
    """0.5.23's text of ``rel`` (under the sglang package), from the provisioned overlay."""
    from swa_repro.sglang.provision import provision

    return (provision(VERSION)[0] / "sglang" / rel).read_text()


def source(version: str = VERSION) -> str:
    from swa_repro.sglang.provision import provision

    overlay, _ = provision(version)
    return (overlay / "sglang" / REL_PATH).read_text()


def unified(old: str, new: str, path: str = REPO_PATH) -> str:
    """``old`` -> ``new`` as a unified diff of ``path`` (sglang's repository path; default the backend)."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))


def diffs(text: str) -> dict[str, str | None]:
    """name -> diff against ``text`` (None: nothing of its own to change); plus ``all``."""
    st = states(text)
    out = {n: None if st[n].state == "applied" or FIXES[n].requires else unified(text, apply_fixes(text, (n,)))
           for n in ORDER}
    out["all"] = unified(text, apply_fixes(text, ORDER))
    return out


def plus_side(text: str, diff: str) -> str:
    """``text`` with ``diff`` applied, hunk by hunk, every context and removed line checked (what
    ``patch -p1`` would do to the file, without fuzz)."""
    old, new, i = text.splitlines(keepends=True), [], 0
    lines = diff.splitlines(keepends=True)
    for k, ln in enumerate(lines):
        if ln.startswith("@@"):
            start = int(ln.split()[1].split(",")[0][1:]) - 1 if ln.split()[1] != "-0,0" else 0
            new += old[i:start]
            i = start
        elif ln.startswith((" ", "-")) and not ln.startswith("--- "):
            if old[i] != ln[1:]:
                raise ValueError(f"diff line {k + 1} does not match the file at line {i + 1}")
            if ln[0] == " ":
                new.append(old[i])
            i += 1
        elif ln.startswith("+") and not ln.startswith("+++ "):
            new.append(ln[1:])
    return "".join(new + old[i:])


DETAIL = {  # why each fix has the shape it has (what a reviewer asks first)
    "ragged_no_prefix_window": "The full layers keep the shared wrapper, planned as before: a runtime "
    "`window_left=-1` on a window-compiled kernel is not full attention everywhere (fa3 on sm90 skips KV tiles "
    "from the planned window, and split-KV sizes its chunks from it), so one wrapper cannot serve both kinds.",
    "ragged_prefix_window": "Same wrapper as `ragged_no_prefix_window` (the two diffs share those hunks; "
    "`all.diff` has them once).",
    "eagle_verify_window": "Wrapper 0 keeps the whole sequence and its tree mask, like wrapper 1. The window on "
    "each draft token's tree position (committed length + its strict ancestors in the mask, as sglang computes "
    "positions) is ANDed into a copy of the tree mask (`_spec_tree_mask_in_window`, which touches only the keys "
    "near the window's start and the tree keys), and plan and `forward()` both take the window widened by "
    "`draft_token_num - 1` (`_spec_verify_window_left`): wider than any node's real window, so it cuts no key "
    "the mask keeps (nor does fa2's per-tile start, which reads the run's value), while older KV tiles are "
    "still skipped. Under CUDA graphs each verify wrapper gets its own packed-mask buffer "
    "(`cuda_graph_custom_mask[i]`, the shipped size each): FlashInfer's graph-mode `plan()` copies a wrapper's "
    "mask to offset 0 of the buffer it was given and the captured kernel reads it there, so on the one shared "
    "buffer the sliding-window wrapper would read the full wrapper's unwindowed mask (the cure #39160 named).",
    "dflash_verify_window": "The window is planned in, so the request-granular trim no longer decides which "
    "keys a query sees.",
    "soft_cap_prefill": "The cap is the one the model's attention layers use (each `RadixAttention.logit_cap`: "
    "Gemma-2's from `attn_logit_softcapping`, Grok's with its fallback of 30), read at start-up; a `fast_prefill_plan` replay takes no cap and "
    "keeps the module captured with it. A layer whose cap is not the planned one is refused (ValueError "
    "naming both) instead of running with a module planned for another cap: a capped module divides by a "
    "layer cap of 0, and FlashInfer applies tanh only (`logit_capping_method`).",
    "soft_cap_decode": "The cap comes from the same helper as `soft_cap_prefill`; `fast_decode_plan` replays "
    "take it too; `forward_decode` refuses a layer with another cap, as `forward_extend` does.",
}
