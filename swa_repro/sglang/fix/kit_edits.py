"""The changes sglang's attention test kit needs with the fixes, as anchored edits of 0.5.23's kit.

The kit (``sglang/test/kits/attention_unittest``, python/sglang/test/kits/... in sglang's repo) is
what sglang's own attention tests run (test/registered/attention/unittests/<method>/test_<backend>.py).
Four edits, each a small textual change found by anchors that must each occur exactly once where
they are looked for; a kit without one raises :class:`KitEditError` naming it (never a partial edit):

* ``kit_swa_cases`` (dense_attention.py): the SWA case lists gain a case whose keys fall outside the
  window. Window 4 makes keys ``i-4 .. i`` visible to the query at ``i``; the shipped lengths (3-5,
  prefixes 3-5 + 2) keep every key visible, so a backend that drops the window passes them.
* ``kit_logit_cap`` (dense_attention.py): the kit cannot express a logits soft cap. A case gets
  ``logit_cap`` (default 0.0: every existing case unchanged); the fixture gives it to the layer
  (``RadixAttention(logit_cap=...)``) and to the model config as ``attn_logit_softcapping`` (where
  gemma2.py takes its layers' cap from, and where the soft-cap fix reads it for plan()); both
  references cap the scores, ``cap * tanh(scores / cap)``.
* ``kit_dflash_swa_verify`` (speculative_target_verify_runner.py): the expected DFlash SWA verify
  masks encode the request-granular trim (keys from ``prefix_len - window`` for the whole draft
  block), which ``dflash_verify_window`` replaces by FlashInfer's per-element window planned in:
  the query at ``q_pos`` attends keys ``q_pos - window .. q_pos``.
* ``kit_tree_verify_window`` (dense_attention.py): the custom-mask reference windows a draft token
  from its index in the flattened draft, FlashInfer's kernel rule (variants.cuh:88-89) and Triton's,
  which for a tree (topk > 1) cuts keys inside the token's real window: its position is committed + its
  depth (build_tree_kernel_efficient's positions, eagle_utils.py:208-211), which ``eagle_verify_window``
  windows by. A chain's index and depth agree, so chain cases are unchanged. The backends that still
  count by index are declared in the kit (``TREE_WINDOW_BY_INDEX``: Triton), so their tests keep their
  expectation and the deviation stays visible: why depth is right, with the sources, is
  :data:`TREE_DECISION`.

A follow-up edit, not in ``kit.diff`` (``FOLLOW_UPS``): ``kit_tree_verify_triton`` empties
``TREE_WINDOW_BY_INDEX``: Triton's tree expectation becomes the tree position too, the kit side of the
Triton finding (its own PR, with a Triton fix); on 0.5.23's Triton it fails the tree cases past the
window.

``python -m swa_repro.sglang.fix.kit_edits --site DIR [--names ...]`` edits DIR/sglang's kit in place
(scripts/gpu_fix.sh); an edit already there is left as it is.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

from swa_repro.core.outputs import write_atomic
from swa_repro.sglang.fix.kit_anchor import Anchored, KitEditError, _lines
from swa_repro.sglang.fix.kit_tree import (
    FOLLOW_UPS,
    TREE,
    TRITON,
    TRITON_TREE,
)

KIT = "sglang/test/kits/attention_unittest"
DENSE = f"{KIT}/attention_methods/dense_attention.py"
VERIFY = f"{KIT}/runner_modes/speculative_target_verify_runner.py"
FILES = (DENSE, VERIFY)
ORDER = ("kit_swa_cases", "kit_logit_cap", "kit_dflash_swa_verify", "kit_tree_verify_window")
ALL = "kit"  # every edit, one diff over both files



_NO_PREFIX = "def make_swa_no_prefix_input_config_cases("
_PREFIX = "def make_swa_prefix_input_config_cases("


def _case_end(extend_lens: str, new_case: tuple[str, str, str] | None = None) -> str:
    """The end of a case list whose last case has ``extend_lens``, with ``new_case`` (name, prefix
    lens, extend lens; window 4, the list's other fields) appended."""
    head = (f"            extend_lens={extend_lens},", "            sliding_window_size=4,", "        ),")
    if new_case is None:
        return _lines(*head, "    )")
    name, prefix, extend = new_case
    fields = (f'name="{name}"', "backend=backend", "forward_mode=ForwardMode.EXTEND", "num_heads=4", "num_kv_heads=4",
              "page_size=16", f"prefix_lens={prefix}", f"extend_lens={extend}", "sliding_window_size=4")
    return _lines(*head, "        DenseAttentionCase(", *(f"            {f}," for f in fields), "        ),", "    )")


SWA_CASES = [
    Anchored(
        "no-prefix SWA case list",
        _lines('    """SWA no-prefix cases with lengths below, exactly at, and above the window."""'),
        _lines('    """SWA no-prefix cases with lengths below, exactly at, and above the window,',
               "    and lengths well past it: keys outside the window of later queries.\"\"\""),
        after=_NO_PREFIX, before=_PREFIX),
    Anchored("no-prefix SWA case past the window", _case_end("(3, 4, 5)"),
             _case_end("(3, 4, 5)", ("swa_extend_no_prefix_past_window", "(0, 0, 0)", "(6, 9, 17)")),
             after=_NO_PREFIX, before=_PREFIX),
    Anchored(
        "prefix SWA case list",
        _lines('    """SWA prefix cases with prefix lengths below, at, and above the window."""'),
        _lines('    """SWA prefix cases with prefix lengths below, at, and above the window, and',
               "    prefixes and extends past it: prefix and extend keys outside the window.\"\"\""),
        after=_PREFIX, before="class TinyModelConfig"),
    Anchored("prefix SWA case past the window", _case_end("(2, 2, 2)"),
             _case_end("(2, 2, 2)", ("swa_extend_prefix_past_window", "(9, 5, 17)", "(2, 6, 8)")),
             after=_PREFIX, before="class TinyModelConfig"),
]

_SCORES = "            scores = torch.einsum(\"hd,hkd->hk\", query, keys) * module.scaling\n"
_CAPPED = _SCORES + _lines(
    '            logit_cap = getattr(case, "logit_cap", 0.0)',
    "            if logit_cap > 0:",
    "                scores = logit_cap * torch.tanh(scores / logit_cap)")
_REF = "def _dense_attention_reference("
_REF_MASK = "def dense_attention_reference_with_custom_mask("
_FIXTURE = "def build_dense_attention_fixture("

def _adds(what: str, lines: tuple[str, ...], at: int, *added: str, after: str, before: str) -> Anchored:
    """``added`` inserted before ``lines[at]``, ``lines`` the anchor."""
    return Anchored(what, _lines(*lines), _lines(*lines[:at], *added, *lines[at:]), after=after, before=before)


_ARG = ("        sliding_window_size: int | None = None,", "    ):")
_CASE_WINDOW = "        sliding_window_size=case.sliding_window_size,"
LOGIT_CAP = [
    _adds("DenseAttentionCase.logit_cap",
          ("    extend_lens: tuple[int, ...] = ()", "    sliding_window_size: int | None = None", ""), 2,
          "    # Logits soft cap of the layer and the model (gemma2: attn_logit_softcapping).",
          "    logit_cap: float = 0.0", after="class DenseAttentionCase:", before="def make_dense_input_config_cases("),
    _adds("TinyModelConfig logit_cap argument", _ARG, 1, "        logit_cap: float = 0.0,",
          after="class TinyModelConfig:", before="class MockModelRunner("),
    _adds("TinyModelConfig attn_logit_softcapping",
          ("            head_dim=head_dim,", "        )",
           "        self.hf_config.get_text_config = lambda: self.hf_config"),
          1, "            attn_logit_softcapping=logit_cap if logit_cap > 0 else None,",
          after="class TinyModelConfig:", before="class MockModelRunner("),
    _adds("ProjectedDenseAttention logit_cap argument", _ARG, 1, "        logit_cap: float = 0.0,",
          after="class ProjectedDenseAttention(", before="class ReferenceDenseAttention("),
    _adds("ProjectedDenseAttention RadixAttention(logit_cap=...)",
          ("            layer_id=0,", "            sliding_window_size=("), 1, "            logit_cap=logit_cap,",
          after="class ProjectedDenseAttention(", before="class ReferenceDenseAttention("),
    Anchored("_dense_attention_reference cap", _SCORES, _CAPPED, after=_REF, before=_REF_MASK),
    Anchored("dense_attention_reference_with_custom_mask cap", _SCORES, _CAPPED,
             after=_REF_MASK, before="def _copy_dense_weights("),
    _adds("build_dense_attention_fixture model config cap",
          ("        context_len=max_context_len,", _CASE_WINDOW, "    )"), 2, "        logit_cap=case.logit_cap,",
          after=_FIXTURE, before="actual_module = ProjectedDenseAttention("),
    _adds("build_dense_attention_fixture layer cap", ("        device=device,", _CASE_WINDOW, "    )"), 2,
          "        logit_cap=case.logit_cap,",
          after="actual_module = ProjectedDenseAttention(", before="reference_module = ReferenceDenseAttention("),
    _adds("make_dense_case_with_prefix_lens keeps the cap", (_CASE_WINDOW, "    )"), 1,
          "        logit_cap=case.logit_cap,", after="def make_dense_case_with_prefix_lens(",
          before="def dense_fixture_inputs("),
]

DFLASH = [
    Anchored(
        "DFlash SWA verify masks: per-element window", _lines(
            '    """Mirror FlashInfer DFLASH verify\'s production no-custom-mask path."""'),
        _lines(
            '    """Mirror FlashInfer DFLASH verify\'s production no-custom-mask path: causal',
            "    over the draft block, and the window planned in (window_left), per element:",
            '    the query at q_pos attends keys q_pos - window .. q_pos."""'),
        after="def _make_flashinfer_dflash_swa_builtin_masks(", before="def _expected_case_and_masks_for_spec_verify("),
    Anchored(
        "DFlash SWA verify masks: key start per query", _lines(
            "        seq_len = prefix_len + draft_token_num",
            "        prefix_start = max(0, int(prefix_len) - window)",
            "        k_idx = torch.arange(seq_len, dtype=torch.int32, device=device).unsqueeze(0)",
            "        masks_by_req.append((k_idx >= prefix_start) & (k_idx <= prefix_len + q_idx))"),
        _lines(
            "        seq_len = prefix_len + draft_token_num",
            "        q_pos = prefix_len + q_idx",
            "        k_idx = torch.arange(seq_len, dtype=torch.int32, device=device).unsqueeze(0)",
            "        masks_by_req.append((k_idx >= q_pos - window) & (k_idx <= q_pos))"),
        after="def _make_flashinfer_dflash_swa_builtin_masks(", before="def _expected_case_and_masks_for_spec_verify("),
    Anchored(
        "DFlash verify input comment", _lines(
            "            # backends. SWA metadata clips the cached prefix; the backend causal",
            "            # path handles the draft block."),
        _lines(
            "            # backends. The window planned in (window_left) masks each query's",
            "            # keys; the backend causal path handles the draft block."),
        after="def _make_spec_verify_input(", before="def _make_eagle_verify_input("),
]

EDITS: dict[str, tuple[str, list[Anchored]]] = {
    "kit_swa_cases": (DENSE, SWA_CASES),
    "kit_logit_cap": (DENSE, LOGIT_CAP),
    "kit_dflash_swa_verify": (VERIFY, DFLASH),
    "kit_tree_verify_window": (DENSE, TREE),
    TRITON: (DENSE, TRITON_TREE),
}


def _follow_ups_off(texts: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``(texts with every applied follow-up read off, each follow-up's state)``: the edits under a
    follow-up are judged and applied on the kit as they made it (a follow-up rewrites their text)."""
    view, out = dict(texts), {}
    for name in FOLLOW_UPS:
        path, edits = EDITS[name]
        try:
            got = {e.state(view[path], path) for e in edits}
        except KitEditError:  # its anchor comes with its base: not there yet
            got = {"needed"}
        out[name] = got.pop() if len(got) == 1 else "mixed"
        if out[name] == "applied":
            for e in edits:
                view[path] = view[path].replace(e.new, e.old, 1)
    return view, out


def edit(texts: dict[str, str], names=ORDER) -> dict[str, str]:
    """``{kit path: text}`` (paths as in a site: sglang/test/kits/...) with ``names`` applied (a follow-up,
    ``FOLLOW_UPS``, after the edits it goes on top of; one already applied stays); only the files they
    touch are in the result. Raises :class:`KitEditError` before changing anything."""
    unknown = set(names) - set(EDITS)
    if unknown:
        raise KitEditError(f"unknown kit edit(s): {', '.join(sorted(unknown))}; choose from {', '.join(EDITS)}")
    for name in set(names) & set(FOLLOW_UPS):
        missing = [b for b in FOLLOW_UPS[name] if b not in names]
        if missing:
            raise KitEditError(f"kit edit {name} goes on top of {', '.join(missing)}: name it too")
    view, fu = _follow_ups_off(texts)
    keep = {n for n, st in fu.items() if st == "applied"}
    out: dict[str, str] = {}
    for name in (*ORDER, *FOLLOW_UPS):
        if name not in names and name not in keep:
            continue
        path, edits = EDITS[name]
        text = out.get(path, view[path])
        for e in edits:
            text = e.apply(text, path)
        out[path] = text
    return out


def states(texts: dict[str, str]) -> dict[str, str]:
    """Each edit's state: needed / applied (all its anchored parts agree) or mixed. An applied follow-up
    is read off first and the edits under it judged without it; one whose base is not there: needed."""
    view, out = _follow_ups_off(texts)
    for name in ORDER:
        path, edits = EDITS[name]
        got = {e.state(view[path], path) for e in edits}
        out[name] = got.pop() if len(got) == 1 else "mixed"
    return {n: out[n] for n in EDITS}


def read(site: Path) -> dict[str, str]:
    return {p: (site / p).read_text() for p in FILES}


def unified(old: dict[str, str], new: dict[str, str]) -> str:
    """One diff over the changed files, paths as in sglang's repository (python/sglang/...)."""
    return "".join("".join(difflib.unified_diff(old[p].splitlines(keepends=True), new[p].splitlines(keepends=True),
                                                f"a/python/{p}", f"b/python/{p}"))
                   for p in FILES if p in new and new[p] != old[p])


def diffs(texts: dict[str, str]) -> dict[str, str]:
    """name -> diff against the kit ``texts`` (each edit alone; a follow-up against the kit with the
    edits it goes on top of), and ``kit``: every edit of ORDER (no follow-up)."""
    out = {n: unified(texts, edit(texts, (n,))) for n in ORDER}
    for n, base in FOLLOW_UPS.items():
        out[n] = unified({**texts, **edit(texts, base)}, edit(texts, (*base, n)))
    out[ALL] = unified(texts, edit(texts, ORDER))
    return out


def split(diff: str) -> dict[str, str]:
    """A multi-file diff -> ``{kit path: its single-file diff}`` (for ``upstream.plus_side``)."""
    out, cur = {}, None
    for ln in diff.splitlines(keepends=True):
        if ln.startswith("--- a/python/"):
            cur = ln[len("--- a/python/"):].rstrip("\n")
            out[cur] = ""
        out[cur] += ln
    return out


def write(out: Path, overlay: Path | None = None) -> list[Path]:
    """``out/<name>.diff`` for each edit and ``out/kit.diff``, against ``overlay``'s kit (default:
    the release the upstream diffs are made against, ``upstream_diff.VERSION``)."""
    if overlay is None:
        from swa_repro.sglang.fix.upstream_diff import VERSION
        from swa_repro.sglang.provision import provision

        overlay = provision(VERSION)[0]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, d in diffs(read(overlay)).items():
        p = out / f"{name}.diff"
        write_atomic(p, d.encode())  # never through a link
        written.append(p)
    return written


def apply_to_site(site: Path, names=ORDER) -> dict[str, str]:
    """Edit ``site``'s kit in place (each file replaced whole, after every edit succeeded); returns
    each edit's state before (``needed`` ones were applied, ``applied`` ones left as they were)."""
    texts = read(site)
    before = {n: s for n, s in states(texts).items() if n in names}
    if "mixed" in before.values():
        raise KitEditError(f"{site}: partly edited kit ({before}): reinstall it")
    for path, text in edit(texts, names).items():
        if text != texts[path]:
            f = site / path
            tmp = f.with_name(f".{f.name}.kit-edit")
            tmp.write_text(text)
            os.replace(tmp, f)  # a new inode: a hard-linked copy elsewhere keeps its text
    return before


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m swa_repro.sglang.fix.kit_edits", description=__doc__.splitlines()[0])
    p.add_argument("--site", type=Path, required=True, help="the directory holding the sglang package to edit")
    p.add_argument("--names", default=",".join(ORDER), help=f"comma-separated, of {','.join(ORDER)} (default: all)")
    a = p.parse_args(argv)
    names = tuple(n for n in a.names.split(",") if n)
    try:
        before = apply_to_site(a.site, names)
    except FileNotFoundError as e:  # bad input: one line, exit 2
        print(f"error: {e.filename or e}: no sglang kit there; give --site the directory holding the "
              "sglang package", file=sys.stderr)
        return 2
    except KitEditError as e:  # not the kit the edits know: nothing was written
        print(f"error: {e}", file=sys.stderr)
        return 1
    for n, s in before.items():
        print(f"{n}: {'applied now' if s == 'needed' else 'already applied'} in {a.site}/{KIT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
