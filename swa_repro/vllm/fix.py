"""``swa-repro audit --vllm X --fix cap-route``: the soft-cap finding's fix, opt-in, on a copy.

The finding (``docs/audit/vllm-releases.md``): layers with a logits soft cap (gemma2) are routed to
kernels vLLM calls directly, trtllm-gen (sm100: ``trtllm_batch_context_with_kv_cache``,
``trtllm_batch_decode_with_kv_cache``) and XQA (sm90 decode), which take no soft-cap argument;
the planned wrappers take it. The fix keeps soft-capped layers off those kernels, edits to the
release's ``vllm/v1/attention/backends/flashinfer.py``, each found by its anchor in that release's
own file (every release from 0.20.0 to 0.34.0 has the first two), written as ``ruff format`` writes
it at vLLM's 88 columns (the upstream diff is held to it):

* ``FlashInferMetadataBuilder.__init__``: the decode route (``self.use_trtllm_decode_attention =
  can_use_...``) also requires no soft cap, ``self.logits_soft_cap``: the builder's block of global
  hyperparameters (``infer_global_hyperparameters(get_per_layer_parameters(...))``, which every
  release computes after the route) is moved above the route, so the cap is read once (a vLLM
  maintainer's review, issue #40; the comments say what the code does, no tool's tag). Where the release has an
  NVFP4 cache that only trtllm-gen reads (sm100: ``self.nvfp4_trtllm`` from 0.32.0, before that
  ``self.is_kvcache_nvfp4``), a soft-capped model with it is refused there with a message: flashinfer's
  wrappers with ``backend="trtllm-gen"`` refuse a cap at ``plan`` (the audit's ``nvfp4_kv_mixed``
  path found the fixed builder reaching them);
* ``build``: after ``prefill_use_trtllm = [causal and] use_trtllm_attention(...)``,
  ``prefill_use_trtllm = prefill_use_trtllm and not self.logits_soft_cap``;
* 0.24.0+ ``FlashInferBackend.get_supported_kernel_block_sizes``: pages over 64 run only on
  trtllm-gen (the builder asserts it), so they are not offered where a built layer has a soft cap.
  Every caller that can pick a page over 64 asks after the model is built (0.34.0: the worker's
  ``select_common_block_size`` and ``customize_attention_spec``, ``Attention.get_kv_cache_spec``'s
  ``_largest_kernel_block_within``); the platform's config-time callers take the smallest size. The
  worker then splits a 128-token KV-cache block into pages of 64 (the audit's ``large_page_mixed``);
* 0.20.0-0.24.x only, where ``FlashInferImpl.__init__`` has it: ``self.supports_quant_query_input =
  (self.support_trtllm_attn ...`` also requires ``not self.logits_soft_cap``. There the impl offers
  to take an fp8 query whenever trtllm-gen could run (``Attention.forward`` then quantizes it, with
  an fp8 KV cache), while the builder, which the first two edits keep off trtllm-gen, expects the
  model's dtype: without this edit the fixed release asserts ``Query dtype mismatch`` on sm100 with
  ``--kv-cache-dtype fp8`` (the audit's ``fp8_kv_mixed`` path found it). From 0.25.0 the impl's
  condition is another one, and the audit finds no mismatch.

The fixed copy is ``<cache>/vllm-fixed/X-cap-route`` (the overlay's files hard-linked, the one
edited file written anew); ``--diff`` prints the edit as a unified diff against the release (the
upstream diff), after a preamble citing the upstream threads (``upstream_refs``). Nothing
installed changes.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
from pathlib import Path

from swa_repro.core.errors import UsageError
from swa_repro.vllm.provision import BACKEND, MARKER

FIXES = {"cap-route": "soft-capped layers stay on the planned wrappers (trtllm-gen and XQA take no soft cap)"}
_DECODE = re.compile(r"^(?P<i>[ ]+)self\.use_trtllm_decode_attention = (?P<var>can_use_\w+)$", re.MULTILINE)
_PREFILL = re.compile(r"^(?P<head>[ ]+prefill_use_trtllm = (causal and )?)use_trtllm_attention\($", re.MULTILINE)
_PAGES = re.compile(r"^(?P<i>[ ]+)and can_use_trtllm_attention\(num_qo_heads, num_kv_heads\)\n(?P<j>[ ]+)\)\n"
                    r"(?P<k>[ ]+)if not use_large_pages:", re.MULTILINE)
_NVFP4 = ("self.nvfp4_trtllm", "self.is_kvcache_nvfp4")  # 0.32.0+: sm100's NVFP4 cache; before: any (sm100 only)
_QUERY = re.compile(r"^(?P<i>[ ]+)self\.supports_quant_query_input = \(\n(?P<j>[ ]+)self\.support_trtllm_attn\n", re.MULTILINE)
# Each edit's comment, first line (vLLM's voice: no tool's name in the upstream code). Tests find an
# edit by it; :func:`hunks` reads the code, never these.
NOTE = {"decode route": "# trtllm-gen and XQA take no logits soft cap: soft-capped layers",
        "prefill route": "# trtllm-gen context attention takes no logits soft cap.",
        "large pages": "# Pages over 64 run only on trtllm-gen, which soft-capped layers",
        "quantized query": "# A soft-capped layer runs on the FlashInfer wrappers, which"}
# The builder's per-layer hyperparameters (every release 0.20.0-0.34.0 has this block after the decode
# route); moved before it so the route reads ``self.logits_soft_cap`` instead of computing it twice.
_HYPER = re.compile(r"^(?P<i>[ ]+)# Global hyperparameters shared by all attention layers\n(?:.*\n)*?"
                    r"(?P=i)self\.logits_soft_cap = self\.global_hyperparameters\.logits_soft_cap\n", re.MULTILINE)
_PAGES_DONE = 'getattr(getattr(layer, "impl", None), "logits_soft_cap", None)'  # the large-page edit's new text


def check(names: str | None) -> str:
    if names not in FIXES:
        raise UsageError(f"--fix {names!r} with --vllm: choose {', '.join(FIXES)}")
    return names


def _assign(indent: str, name: str, value: str) -> str:
    """``name = value`` as ruff format writes it at vLLM's 88 columns (the upstream diff is held to it)."""
    line = f"{indent}{name} = {value}\n"
    return line if len(line) <= 89 else f"{indent}{name} = (\n{indent}    {value}\n{indent})\n"


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


def edit(text: str, version: str) -> str:
    """The release's backend file with the edits (the last two where the release has their anchors);
    one line if a required anchor is not there."""
    d, h = _anchors(text, version)
    text = _hoist(text, d, h)
    d = _DECODE.search(text)
    i, var = d["i"], d["var"]
    nvfp4 = next((a for a in _NVFP4 if f"{a} = " in text[:d.start()]), None)
    refuse = (f"{i}if self.logits_soft_cap and {nvfp4}:\n"
              f"{i}    raise NotImplementedError(\n"
              f'{i}        "--kv-cache-dtype nvfp4 runs on trtllm-gen only on this GPU, and "\n'
              f'{i}        "trtllm-gen takes no logits soft cap: use another --kv-cache-dtype."\n'
              f"{i}    )\n") if nvfp4 else ""
    decode = (f"{i}{NOTE['decode route']}\n"
              f"{i}# decode on the FlashInfer wrapper, which applies it.\n"
              + refuse + _assign(i, var, f"{var} and not self.logits_soft_cap"))
    out = text[:d.start()] + decode + text[d.start():]
    m = _PREFILL.search(out)
    ind = m["head"][:len(m["head"]) - len(m["head"].lstrip())]
    end = out.index(f"\n{ind})\n", m.end()) + len(ind) + 3  # past the call's closing line
    out = (out[:end] + f"{ind}{NOTE['prefill route']}\n"
           + _assign(ind, "prefill_use_trtllm", "prefill_use_trtllm and not self.logits_soft_cap") + out[end:])
    g = list(_PAGES.finditer(out))
    if len(g) > 1:
        raise UsageError(f"--fix cap-route: vllm {version}'s {BACKEND} has {len(g)} large-page anchors "
                         "(at most 1 expected): not a structure this fix knows")
    for m in g:  # 0.24.0+: pages over 64 run only on trtllm-gen, which a soft-capped layer no longer takes
        j = m["i"]
        out = (out[:m.start("j")] + f"{j}{NOTE['large pages']}\n"
               f"{j}# no longer take.\n"
               f"{j}and not any(\n"
               f'{j}    getattr(getattr(layer, "impl", None), "logits_soft_cap", None)\n'
               f"{j}    for layer in (\n"
               f"{j}        vllm_config.compilation_config.static_forward_context.values()\n"
               f"{j}    )\n"
               f"{j})\n" + out[m.start("j"):])
    q = list(_QUERY.finditer(out))
    if len(q) > 1:
        raise UsageError(f"--fix cap-route: vllm {version}'s {BACKEND} has {len(q)} query-quantization anchors "
                         "(at most 1 expected): not a structure this fix knows")
    for m in q:  # 0.20.0-0.24.x: the impl would take an fp8 query the builder no longer plans for
        j = m["j"]
        out = (out[:m.end()] + f"{j}{NOTE['quantized query']}\n{j}# plan a model-dtype query.\n"
               f"{j}and not self.logits_soft_cap\n" + out[m.end():])
    return out


def hunks(text: str) -> dict[str, bool]:
    """Each edit this file has a place for -> whether its new text is there, read from the code's
    structure (a comment is only a comment: a file missing one edit's lines but keeping its
    comment is not applied; issue #43). The decode and prefill routes always (their anchors
    stay in a fixed file); the large-page and query edits where the release has their place."""
    out = {}
    d = _DECODE.search(text)
    if d:
        var = re.escape(d["var"])
        h = _HYPER.search(text)
        out["decode route"] = bool(re.search(rf"^[ ]+{var} = \(?\s*{var} and not self\.logits_soft_cap$", text,
                                             re.MULTILINE) and h and h.start() < d.start())
    if _PREFILL.search(text):
        out["prefill route"] = bool(re.search(r"^[ ]+prefill_use_trtllm = \(?\s*prefill_use_trtllm and not "
                                              r"self\.logits_soft_cap$", text, re.MULTILINE))
    if _PAGES.search(text) or _PAGES_DONE in text:
        out["large pages"] = _PAGES_DONE in text
    for m in _QUERY.finditer(text):
        after = [ln.strip() for ln in text[m.end():].splitlines()[:6] if not ln.strip().startswith("#")]
        out["quantized query"] = bool(after) and after[0] == "and not self.logits_soft_cap"
    return out


def state(text: str) -> tuple[str, list[str]]:
    """``(applied | needed | partly applied, the edits missing)`` from :func:`hunks`."""
    h = hunks(text)
    missing = [k for k, ok in h.items() if not ok]
    return ("applied" if h and not missing else "needed" if len(missing) == len(h) else "partly applied"), missing


def upstream_diff(version: str, overlay: Path) -> str:
    """The edit as a unified diff against the release, after a preamble that cites the upstream
    threads on each finding (``upstream_refs.header``)."""
    from swa_repro.vllm.upstream_refs import header

    before = (overlay / BACKEND).read_text()
    after = edit(before, version)
    return header() + "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{BACKEND}",
                                                   f"b/{BACKEND}"))


def fixed_overlay(version: str, overlay: Path) -> Path:
    """The release's overlay with the fix, in the shared cache (made once)."""
    import hashlib

    from swa_repro.core.cache import cache_root, locked
    from swa_repro.engine.record import damaged, marker

    target = cache_root() / "vllm-fixed" / f"{version}-cap-route"
    text = edit((overlay / BACKEND).read_text(), version)
    fixed = {BACKEND: hashlib.sha256(text.encode()).hexdigest()}  # every other file the release's (its RECORD)
    if marker(target / MARKER) is not None and not damaged(target, "vllm-*.dist-info", replaced=fixed,
                                                           skip=lambda rel: rel.endswith(".so")):
        return target
    with locked(target.with_name(f".{version}-cap-route.lock")):
        partial = target.with_name(f".{target.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(overlay, partial, copy_function=os.link, symlinks=True)
        (partial / BACKEND).unlink()  # a hard link to the release's file: never write through it
        (partial / BACKEND).write_text(text)
        info = json.loads((overlay / MARKER).read_text())
        (partial / MARKER).write_text(json.dumps({**info, "fix": "cap-route"}, indent=1))
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    return target
