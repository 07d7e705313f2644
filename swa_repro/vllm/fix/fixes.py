"""``swa-repro audit --vllm X --fix cap-route``: the soft-cap finding's fix, opt-in, on a copy.

The finding (``docs/audit/vllm-releases.md``): layers with a logits soft cap (gemma2) are routed to
kernels vLLM calls directly, trtllm-gen (sm100: ``trtllm_batch_context_with_kv_cache``,
``trtllm_batch_decode_with_kv_cache``) and XQA (sm90 decode), which take no soft-cap argument;
the planned wrappers take it. The fix keeps soft-capped layers off those kernels. As a vLLM
maintainer asked (issue #40), the rule lives where vLLM decides: ``vllm/utils/flashinfer.py``'s
``use_trtllm_attention`` and ``can_use_trtllm_attention`` take ``has_logits_soft_cap`` and with a
cap say no, with a ``logger.warning_once`` (``fix_utils``). Every release 0.20.0-0.34.0 (all 20,
each checked: both files edited, ``git apply`` and ``ruff format`` at vLLM's 88 columns clean) has
both functions and every anchor below; each edit is found by its anchor or its ``ast`` node in
that release's own ``vllm/v1/attention/backends/flashinfer.py``:

* ``FlashInferMetadataBuilder.__init__``: the decode route's ``can_use_trtllm_attention(...)`` call
  passes ``has_logits_soft_cap=self.logits_soft_cap is not None``, the builder's own cap: its block
  of global hyperparameters (``infer_global_hyperparameters(get_per_layer_parameters(...))``, which
  every release computes after the route) is moved above the route, so the cap is read once;
* ``build``: the prefill route's ``use_trtllm_attention(...)`` passes the same;
* 0.24.0+ ``FlashInferBackend.get_supported_kernel_block_sizes``: pages over 64 run only on
  trtllm-gen (the builder asserts it), so its ``can_use_trtllm_attention(...)`` gets
  ``has_logits_soft_cap=model_has_logits_soft_cap()``: the cap known from the config, not from
  built layers (the maintainer: no ``static_forward_context`` read in a static method called
  before the model exists). Why the config: the method is static and called both before the model
  exists (0.34.0 ``vllm/platforms/interface.py:739,915,1083``) and after (``vllm/v1/worker/utils.py:475,
  494,540``: ``customize_attention_spec``, ``select_common_block_size``;
  ``model_executor/layers/attention/attention.py:122``: ``_largest_kernel_block_within``); the
  later callers pass the layer's KV-cache spec (0.31.0+), but ``AttentionSpec``
  (``vllm/v1/kv_cache_interface.py:559-580``) carries no cap, and adding one would change the specs'
  equality that groups layers. No release has a place where the decision is made with the model
  built and the cap at hand, so the narrowest correct form is the config, current at every caller
  (the method already reads ``model_config`` there, :590-596) and the same answer before and after
  the model is built. Its limit: a model whose layers take a cap from elsewhere than
  ``attn_logit_softcapping`` (none of 0.34.0's that reach FlashInfer with a cap) would be offered
  large pages, and the builder's page assertion stops it at start-up (loud, never a wrong result);
* the NVFP4 cache that only trtllm-gen reads (sm100: ``self.nvfp4_trtllm`` from 0.32.0, before that
  ``self.is_kvcache_nvfp4``) with a soft cap: flashinfer's wrappers with ``backend="trtllm-gen"``
  refuse a cap at ``plan`` (the audit's ``nvfp4_kv_mixed`` path found the fixed builder reaching
  them). 0.32.0+: refused at backend selection, ``FlashInferBackend.supports_combination`` (0.34.0
  ``flashinfer.py:669``) returns the reason, which ``AttentionBackend.validate_configuration``
  (``vllm/v1/attention/backend.py:282``, the call at :359) reports and the selector
  (``vllm/platforms/cuda.py:442,474``) lists; the config is current there (the layers' ``Attention``
  asks while the model is built). 0.20.0-0.31.0 have no ``supports_combination``: the builder
  refuses it at construction (after load), as before;
* 0.20.0-0.24.x only, where ``FlashInferImpl.__init__`` has it: ``self.supports_quant_query_input =
  (self.support_trtllm_attn ...`` also requires ``not self.logits_soft_cap``. There the impl offers
  to take an fp8 query whenever trtllm-gen could run (``Attention.forward`` then quantizes it, with
  an fp8 KV cache), while the builder, which the route edits keep off trtllm-gen, expects the
  model's dtype: without this edit the fixed release asserts ``Query dtype mismatch`` on sm100 with
  ``--kv-cache-dtype fp8`` (the audit's ``fp8_kv_mixed`` path found it). From 0.25.0 the impl's
  condition is another one, and the audit finds no mismatch.

The fixed copy is ``<cache>/vllm-fixed/X-cap-route`` (the overlay's files hard-linked, the two
edited files written anew); ``--diff`` prints both edits as a unified diff against the release
(the upstream diff) with vLLM's unit test of the rule as a new file (``fix_pytest``), after a
preamble citing the upstream threads (``upstream_refs``). Nothing installed changes.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.vllm.fix.flashinfer_utils import HELPER
from swa_repro.vllm.provision import BACKEND, MARKER

FIXES = {"cap-route": "soft-capped layers stay on the planned wrappers (trtllm-gen and XQA take no soft cap)"}
_DECODE = re.compile(r"^(?P<i>[ ]+)self\.use_trtllm_decode_attention = (?P<var>can_use_\w+)$", re.MULTILINE)
_PREFILL = re.compile(r"^(?P<head>[ ]+prefill_use_trtllm = (causal and )?)use_trtllm_attention\($", re.MULTILINE)
_PAGES = re.compile(r"^(?P<i>[ ]+)and can_use_trtllm_attention\(num_qo_heads, num_kv_heads\)\n(?P<j>[ ]+)\)\n"
                    r"(?P<k>[ ]+)if not use_large_pages:", re.MULTILINE)
_NVFP4 = ("self.nvfp4_trtllm", "self.is_kvcache_nvfp4")  # 0.32.0+: sm100's NVFP4 cache; before: any (sm100 only)
_QUERY = re.compile(r"^(?P<i>[ ]+)self\.supports_quant_query_input = \(\n(?P<j>[ ]+)self\.support_trtllm_attn\n", re.MULTILINE)
# The one edit whose comment stays (the impl's condition says nothing of the builder otherwise).
NOTE = {"quantized query": "# A soft-capped layer runs on the FlashInfer wrappers, which"}
# The builder's per-layer hyperparameters (every release 0.20.0-0.34.0 has this block after the decode
# route); moved before it so the route reads ``self.logits_soft_cap`` instead of computing it twice.
_HYPER = re.compile(r"^(?P<i>[ ]+)# Global hyperparameters shared by all attention layers\n(?:.*\n)*?"
                    r"(?P=i)self\.logits_soft_cap = self\.global_hyperparameters\.logits_soft_cap\n", re.MULTILINE)


def check(names: str | None) -> str:
    if names not in FIXES:
        raise UsageError(f"--fix {names!r} with --vllm: choose {', '.join(FIXES)}")
    return names


def _anchors(text: str, version: str):
    d = list(_DECODE.finditer(text))
    p = list(_PREFILL.finditer(text))
    h = list(_HYPER.finditer(text))
    if len(d) != 1 or len(p) != 1 or len(h) != 1:
        raise UsageError(f"--fix cap-route: vllm {version}'s {BACKEND} has {len(d)} decode, {len(p)} prefill and "
                         f"{len(h)} hyperparameter anchors (1 each expected): not a structure this fix knows")
    return d[0], h[0]


def _hoist(text: str, d, h) -> str:
    """The hyperparameter block moved above the decode route's first assignment (and the comment lines
    over it), so the route reads ``self.logits_soft_cap`` (the builder's own, not a second
    ``infer_global_hyperparameters``); a release that has it there already keeps it."""
    first = re.search(rf"^[ ]+{re.escape(d['var'])} = ", text, re.MULTILINE)
    if h.start() < first.start():
        return text
    at = text.rfind("\n", 0, first.start()) + 1
    while True:  # over the comment lines right above the assignment
        prev = text.rfind("\n", 0, at - 1) + 1
        if at == 0 or not text[prev:at].lstrip().startswith("#"):
            break
        at = prev
    block, before, after = h.group(0), text[:h.start()], text[h.end():]
    if before.endswith("\n\n") and after.startswith("\n"):  # a blank line either side: one stays
        before = before[:-1]
    rest = before + after
    return rest[:at] + block + "\n" + rest[at:]


def _calls(node, name: str):
    return [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == name]


def _offset(text: str, line: int, col: int) -> int:
    """The character offset of an ``ast`` position (1-based line, byte column)."""
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    head = text[starts[line - 1]:]
    return starts[line - 1] + len(head.encode()[:col].decode())


def _exploded(text: str, call: ast.Call, indent: str, kwarg: str) -> str:
    """``text`` with ``call`` written one argument a line (its magic trailing comma: ``ruff format``
    keeps it so), ``kwarg`` last; ``indent``: the statement's."""
    a, b = _offset(text, call.lineno, call.col_offset), _offset(text, call.end_lineno, call.end_col_offset)
    args = [ast.get_source_segment(text, x) for x in (*call.args, *call.keywords)] + [kwarg]
    body = "".join(f"{indent}    {x},\n" for x in args)
    return text[:a] + f"{ast.unparse(call.func)}(\n{body}{indent})" + text[b:]


def _statement(tree, line: int):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.stmt) and n.lineno == line)


def _method(tree, cls: str, name: str):
    for c in tree.body:
        if isinstance(c, ast.ClassDef) and c.name == cls:
            return next((f for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name), None)
    return None


def _decode_call(text: str):
    """The ``can_use_trtllm_attention`` call that sets the decode route's variable (its last
    assignment before ``self.use_trtllm_decode_attention = <var>``), with its statement."""
    d = _DECODE.search(text)
    line = text.count("\n", 0, d.start()) + 1
    tree = ast.parse(text)
    found = [(n, c) for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno < line
             and any(isinstance(t, ast.Name) and t.id == d["var"] for t in n.targets)
             for c in _calls(n.value, "can_use_trtllm_attention")]
    return max(found, key=lambda nc: nc[0].lineno) if found else (None, None)


def _import(text: str) -> str:
    """``model_has_logits_soft_cap`` added, in order, to ``from vllm.utils.flashinfer import (...)``."""
    m = re.search(r"^from vllm\.utils\.flashinfer import \(\n((?:    \w+,\n)+)\)\n", text, re.MULTILINE)
    if m is None:
        raise UsageError(f"--fix cap-route: {BACKEND} has no `from vllm.utils.flashinfer import (...)` block: not "
                         "a structure this fix knows")
    names = sorted({*re.findall(r"\w+", m[1]), HELPER})
    return text[:m.start(1)] + "".join(f"    {n},\n" for n in names) + text[m.end(1):]


def _refusal(text: str, d, nvfp4: str | None) -> str:
    """An NVFP4 cache that only trtllm-gen reads, with a soft cap: refused where vLLM's selector asks
    (``FlashInferBackend.supports_combination``, 0.32.0+: its reason string is what the selector
    reports, ``AttentionBackend.validate_configuration``, 0.32.0 ``vllm/v1/attention/backend.py:353``)
    on the GPUs where ``_nvfp4_kv_on_fa2`` is false (sm100); before 0.32.0, by the builder."""
    tree = ast.parse(text)
    sc = _method(tree, "FlashInferBackend", "supports_combination")
    if sc is not None:
        last = sc.body[-1]
        if not (isinstance(last, ast.Return) and ast.unparse(last.value) == "None"):
            raise UsageError(f"--fix cap-route: {BACKEND}'s supports_combination does not end in `return None`: "
                             "not a structure this fix knows")
        at = _offset(text, last.lineno, 0)
        return text[:at] + _SELECT + text[at:]
    if nvfp4 is None:
        return text
    i, at = d["i"], d.start()
    while text[text.rfind("\n", 0, at - 1) + 1:at].lstrip().startswith("#"):  # above the route's comment
        at = text.rfind("\n", 0, at - 1) + 1
    return (text[:at] + f"{i}# Only trtllm-gen reads this NVFP4 KV cache, and it takes no logits soft cap.\n"
            f"{i}if self.logits_soft_cap is not None and {nvfp4}:\n"
            f"{i}    raise NotImplementedError(\n"
            f'{i}        "--kv-cache-dtype nvfp4 runs on trtllm-gen only on this GPU, and "\n'
            f'{i}        "trtllm-gen takes no logits soft cap: use another --kv-cache-dtype."\n'
            f"{i}    )\n\n" + text[at:])


_SELECT = ("        if (\n"
           "            kv_cache_dtype is not None\n"
           '            and kv_cache_dtype.startswith("nvfp4")\n'
           "            and device_capability.major not in (8, 9, 12)\n"
           f"            and {HELPER}()\n"
           "        ):\n"
           '            return "trtllm-gen, the only NVFP4 KV cache reader here, takes no soft cap"\n')
_CAP_ARG = "has_logits_soft_cap=self.logits_soft_cap is not None"


def edit(text: str, version: str) -> str:
    """The release's backend file with the edits (the last ones where the release has their anchors);
    one line if a required anchor is not there. The rule itself is ``vllm/utils/flashinfer.py``'s
    (``fix_utils``): this file passes the cap to it."""
    d, h = _anchors(text, version)
    text = _hoist(text, d, h)
    d = _DECODE.search(text)
    nvfp4 = next((a for a in _NVFP4 if f"{a} = " in text[:d.start()]), None)
    stmt, call = _decode_call(text)
    if call is None:
        raise UsageError(f"--fix cap-route: vllm {version}'s {BACKEND} sets {d['var']} without "
                         "can_use_trtllm_attention(...): not a structure this fix knows")
    ind = text[_offset(text, stmt.lineno, 0):_offset(text, stmt.lineno, stmt.col_offset)]
    out = _exploded(text, call, ind, _CAP_ARG)
    out = _refusal(out, _DECODE.search(out), nvfp4)
    m = _PREFILL.search(out)
    ind = m["head"][:len(m["head"]) - len(m["head"].lstrip())]
    close = out.index(f"\n{ind})\n", m.end()) + 1  # the call's closing line
    if not out[:close].rstrip("\n").endswith(","):
        raise UsageError(f"--fix cap-route: vllm {version}'s use_trtllm_attention(...) call for the prefill route "
                         "is not one argument a line: not a structure this fix knows")
    out = out[:close] + f"{ind}    {_CAP_ARG},\n" + out[close:]
    g = list(_PAGES.finditer(out))
    if len(g) > 1:
        raise UsageError(f"--fix cap-route: vllm {version}'s {BACKEND} has {len(g)} large-page anchors "
                         "(at most 1 expected): not a structure this fix knows")
    for m in g:  # 0.24.0+: pages over 64 run only on trtllm-gen, which takes no soft cap
        j = m["i"]
        out = (out[:m.start()] + f"{j}and can_use_trtllm_attention(\n{j}    num_qo_heads,\n{j}    num_kv_heads,\n"
               f"{j}    has_logits_soft_cap={HELPER}(),\n{j})\n" + out[m.start("j"):])
    if g or _method(ast.parse(out), "FlashInferBackend", "supports_combination") is not None:
        out = _import(out)
    q = list(_QUERY.finditer(out))
    if len(q) > 1:
        raise UsageError(f"--fix cap-route: vllm {version}'s {BACKEND} has {len(q)} query-quantization anchors "
                         "(at most 1 expected): not a structure this fix knows")
    for m in q:  # 0.20.0-0.24.x: the impl would take an fp8 query the builder no longer plans for
        j = m["j"]
        out = (out[:m.end()] + f"{j}{NOTE['quantized query']}\n{j}# plan a model-dtype query.\n"
               f"{j}and not self.logits_soft_cap\n" + out[m.end():])
    return out


def _has_kwarg(call: ast.Call, value: str) -> bool:
    return any(k.arg == "has_logits_soft_cap" and ast.unparse(k.value) == value for k in call.keywords)


def hunks(text: str) -> dict[str, bool]:
    """Each edit this file has a place for -> whether it is there, read from the code's ``ast`` (a
    comment is only a comment: issue #43): the decode and prefill routes always (their anchors
    stay in a fixed file), the large-page, NVFP4 and query edits where the release has their place."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    out = {}
    d = _DECODE.search(text)
    if d:
        _, call = _decode_call(text)
        h = _HYPER.search(text)
        out["decode route"] = bool(call and _has_kwarg(call, "self.logits_soft_cap is not None") and h
                                   and h.start() < d.start())
    if _PREFILL.search(text):
        calls = [c for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "prefill_use_trtllm" for t in n.targets)
                 for c in _calls(n.value, "use_trtllm_attention")]
        out["prefill route"] = any(_has_kwarg(c, "self.logits_soft_cap is not None") for c in calls)
    pages = _method(tree, "FlashInferBackend", "get_supported_kernel_block_sizes")
    calls = _calls(pages, "can_use_trtllm_attention") if pages else []
    if calls:
        out["large pages"] = any(_has_kwarg(c, f"{HELPER}()") for c in calls)
    sc = _method(tree, "FlashInferBackend", "supports_combination")
    if sc is not None:
        out["nvfp4 refusal"] = bool(_calls(sc, HELPER))
    elif d and any(f"{a} = " in text for a in _NVFP4):
        out["nvfp4 refusal"] = any(isinstance(n, ast.If) and "logits_soft_cap" in ast.unparse(n.test)
                                   and any(a.split(".")[1] in ast.unparse(n.test) for a in _NVFP4)
                                   and isinstance(n.body[0], ast.Raise) for n in ast.walk(tree))
    for m in _QUERY.finditer(text):
        after = [ln.strip() for ln in text[m.end():].splitlines()[:6] if not ln.strip().startswith("#")]
        out["quantized query"] = bool(after) and after[0] == "and not self.logits_soft_cap"
    return out


def state(text: str) -> tuple[str, list[str]]:
    """``(applied | needed | partly applied, the edits missing)`` from :func:`hunks`."""
    h = hunks(text)
    missing = [k for k, ok in h.items() if not ok]
    return ("applied" if h and not missing else "needed" if len(missing) == len(h) else "partly applied"), missing


def edited(version: str, overlay: Path) -> dict[str, tuple[str, str]]:
    """Each file the fix edits -> ``(the release's text, the fixed text)``: the backend, and
    ``vllm/utils/flashinfer.py`` where the rule lives (``fix_utils``)."""
    from swa_repro.vllm.fix import flashinfer_utils as fix_utils

    out = {}
    for rel, fn in ((fix_utils.UTILS, fix_utils.edit), (BACKEND, edit)):
        before = (overlay / rel).read_text()
        out[rel] = before, fn(before, version)
    return out


def upstream_diff(version: str, overlay: Path) -> str:
    """The edits as a unified diff against the release (both files, and vLLM's unit test of the rule
    as a new file: ``fix_pytest``), after a preamble that cites the upstream threads on each finding
    (``upstream_refs.header``)."""
    from swa_repro.vllm.fix.unit_test import TEST_PATH, TEST_TEXT
    from swa_repro.vllm.fix.upstream_refs import header

    parts = [header()]
    for rel, (before, after) in edited(version, overlay).items():
        parts += difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}")
    lines = TEST_TEXT.splitlines(True)
    parts += [f"--- /dev/null\n+++ b/{TEST_PATH}\n@@ -0,0 +1,{len(lines)} @@\n"] + [f"+{ln}" for ln in lines]
    return "".join(parts)


def fixed_overlay(version: str, overlay: Path) -> Path:
    """The release's overlay with the fix, in the shared cache (made once)."""
    import hashlib

    from swa_repro.core.cache import cache_root, locked
    from swa_repro.engine.record import damaged, marker

    target = cache_root() / "vllm-fixed" / f"{version}-cap-route"
    texts = {rel: after for rel, (_, after) in edited(version, overlay).items()}
    fixed = {rel: hashlib.sha256(t.encode()).hexdigest() for rel, t in texts.items()}  # the rest: its RECORD's
    info = marker(target / MARKER)  # made by this fix's code (its files' hashes: a changed fix is made anew)
    if info is not None and info.get("edited") == fixed and not damaged(target, "vllm-*.dist-info", replaced=fixed,
                                                           skip=lambda rel: rel.endswith(".so")):
        return target

    def edit(partial: Path) -> dict:
        for rel, text in texts.items():
            (partial / rel).unlink()  # a hard link to the release's file: never write through it
            (partial / rel).write_text(text)
        return {**json.loads((overlay / MARKER).read_text()), "fix": "cap-route", "edited": fixed}

    from swa_repro.engine.overlay import linked_copy

    with locked(target.with_name(f".{version}-cap-route.lock")):
        linked_copy(overlay, target, edit, MARKER, ignore=())
    return target
