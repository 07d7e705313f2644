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
  from its index in the flattened draft, FlashInfer's rule (variants.cuh:88-89), which for a tree
  (topk > 1) cuts keys inside the token's real window: its position is committed + its depth
  (build_tree_kernel_efficient's positions, eagle_utils.py:138-233), which ``eagle_verify_window``
  windows by. A chain's index and depth agree, so chain cases are unchanged.

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

KIT = "sglang/test/kits/attention_unittest"
DENSE = f"{KIT}/attention_methods/dense_attention.py"
VERIFY = f"{KIT}/runner_modes/speculative_target_verify_runner.py"
FILES = (DENSE, VERIFY)
ORDER = ("kit_swa_cases", "kit_logit_cap", "kit_dflash_swa_verify", "kit_tree_verify_window")
ALL = "kit"  # every edit, one diff over both files


class KitEditError(RuntimeError):
    """An anchor is missing or not unique: this is not the kit the edits were written against."""


class Anchored:
    """``old`` -> ``new``, ``old`` exactly once in the region from the first ``after`` to the next
    ``before`` (both optional)."""

    def __init__(self, what: str, old: str, new: str, *, after: str | None = None, before: str | None = None):
        self.what, self.old, self.new, self.after, self.before = what, old, new, after, before

    def _region(self, text: str, path: str) -> tuple[int, int]:
        a = 0
        if self.after is not None:
            a = text.find(self.after)
            if a < 0:
                raise KitEditError(f"{path}: {self.what}: anchor {self.after!r} is gone")
        b = len(text)
        if self.before is not None:
            b = text.find(self.before, a)
            if b < 0:
                raise KitEditError(f"{path}: {self.what}: anchor {self.before!r} is gone")
        return a, b

    def state(self, text: str, path: str) -> str:
        """``needed`` / ``applied``; raises when neither the old nor the new text is there once."""
        a, b = self._region(text, path)
        region = text[a:b]
        old, new = region.count(self.old), region.count(self.new)
        if new == 1 and old == (1 if self.old in self.new else 0):
            return "applied"
        if new == 0 and old == 1:
            return "needed"
        raise KitEditError(f"{path}: {self.what}: anchor {self.old.strip().splitlines()[0]!r} "
                           f"{'is gone' if old == 0 else f'occurs {old} times'}")

    def apply(self, text: str, path: str) -> str:
        if self.state(text, path) == "applied":
            return text
        a, b = self._region(text, path)
        i = text.index(self.old, a, b)
        return text[:i] + self.new + text[i + len(self.old):]


def _lines(*ls: str) -> str:
    return "".join(ln + "\n" for ln in ls)


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

TREE = [
    Anchored(
        "custom-mask reference: a draft token's window from its tree position", _lines(
            "                query_pos = case.prefix_lens[req_idx] + offset",
            "                # Target-verify draft tokens are appended through the extend",
            "                # kernel, which applies `kv_id >= q_id - sliding_window_size`",
            "                # (see `dense_attention_reference` note). The custom-mask",
            "                # reference must use the same rule."),
        _lines(
            "                # A draft token sits at its depth in the tree (its ancestors",
            "                # and itself in the draft part of its mask row), not at its",
            "                # index in the flattened draft: that is the position its",
            "                # window counts from (a chain's are the same).",
            "                draft = req_mask[offset, case.prefix_lens[req_idx] :]",
            "                query_pos = case.prefix_lens[req_idx] + int(draft.sum()) - 1"),
        after=_REF_MASK, before="def _copy_dense_weights("),
]

EDITS: dict[str, tuple[str, list[Anchored]]] = {
    "kit_swa_cases": (DENSE, SWA_CASES),
    "kit_logit_cap": (DENSE, LOGIT_CAP),
    "kit_dflash_swa_verify": (VERIFY, DFLASH),
    "kit_tree_verify_window": (DENSE, TREE),
}


def edit(texts: dict[str, str], names=ORDER) -> dict[str, str]:
    """``{kit path: text}`` (paths as in a site: sglang/test/kits/...) with ``names`` applied; only
    the files they touch are in the result. Raises :class:`KitEditError` before changing anything."""
    out: dict[str, str] = {}
    for name in ORDER:
        if name not in names:
            continue
        path, edits = EDITS[name]
        text = out.get(path, texts[path])
        for e in edits:
            text = e.apply(text, path)
        out[path] = text
    unknown = set(names) - set(ORDER)
    if unknown:
        raise KitEditError(f"unknown kit edit(s): {', '.join(sorted(unknown))}; choose from {', '.join(ORDER)}")
    return out


def states(texts: dict[str, str]) -> dict[str, str]:
    """Each edit's state: needed / applied (all its anchored parts agree) or mixed."""
    out = {}
    for name, (path, edits) in EDITS.items():
        got = {e.state(texts[path], path) for e in edits}
        out[name] = got.pop() if len(got) == 1 else "mixed"
    return out


def read(site: Path) -> dict[str, str]:
    return {p: (site / p).read_text() for p in FILES}


def unified(old: dict[str, str], new: dict[str, str]) -> str:
    """One diff over the changed files, paths as in sglang's repository (python/sglang/...)."""
    return "".join("".join(difflib.unified_diff(old[p].splitlines(keepends=True), new[p].splitlines(keepends=True),
                                                f"a/python/{p}", f"b/python/{p}"))
                   for p in FILES if p in new and new[p] != old[p])


def diffs(texts: dict[str, str]) -> dict[str, str]:
    """name -> diff against the kit ``texts`` (each edit alone), and ``kit``: all of them."""
    out = {n: unified(texts, edit(texts, (n,))) for n in ORDER}
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
    the release the upstream diffs are made against, ``upstream.VERSION``)."""
    if overlay is None:
        from swa_repro.sglang.fix.upstream import VERSION
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


def kit_overlay(overlay: Path, names=ORDER) -> Path:
    """``overlay`` with the kit edits ``names``: ``kit_copy.kit_overlay`` (made once, checked against its
    wheel's RECORD each time it is reused)."""
    from swa_repro.sglang.fix.kit_copy import kit_overlay as copy

    return copy(overlay, names)


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
