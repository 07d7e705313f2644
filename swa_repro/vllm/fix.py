"""``swa-repro audit --vllm X --fix cap-route``: the soft-cap finding's fix, opt-in, on a copy.

The finding (``docs/audit/vllm-releases.md``): layers with a logits soft cap (gemma2) are routed to
kernels vLLM calls directly, trtllm-gen (sm100: ``trtllm_batch_context_with_kv_cache``,
``trtllm_batch_decode_with_kv_cache``) and XQA (sm90 decode), which take no soft-cap argument;
the planned wrappers take it. The fix keeps soft-capped layers off those kernels, two edits to the
release's ``vllm/v1/attention/backends/flashinfer.py``, each found by its anchor in that release's
own file (every release from 0.20.0 to 0.34.0 has both):

* ``FlashInferMetadataBuilder.__init__``: the decode route (``self.use_trtllm_decode_attention =
  can_use_...``, decided before the builder reads the layers' cap) also requires no soft cap,
  read from the layers as the builder reads it a few lines later
  (``infer_global_hyperparameters(get_per_layer_parameters(...))``);
* ``build``: ``prefill_use_trtllm = [causal and] use_trtllm_attention(`` also requires
  ``not self.logits_soft_cap``;
* 0.20.0-0.24.x only, where ``FlashInferImpl.__init__`` has it: ``self.supports_quant_query_input =
  (self.support_trtllm_attn ...`` also requires ``not self.logits_soft_cap``. There the impl offers
  to take an fp8 query whenever trtllm-gen could run (``Attention.forward`` then quantizes it, with
  an fp8 KV cache), while the builder, which the first two edits keep off trtllm-gen, expects the
  model's dtype: without this edit the fixed release asserts ``Query dtype mismatch`` on sm100 with
  ``--kv-cache-dtype fp8`` (the audit's ``fp8_kv_mixed`` path found it). From 0.25.0 the impl's
  condition is another one, and the audit finds no mismatch.

The fixed copy is ``<cache>/vllm-fixed/X-cap-route`` (the overlay's files hard-linked, the one
edited file written anew); ``--diff`` prints the edit as a unified diff against the release (the
upstream diff). Nothing installed changes.
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
_QUERY = re.compile(r"^(?P<i>[ ]+)self\.supports_quant_query_input = \(\n(?P<j>[ ]+)self\.support_trtllm_attn\n", re.MULTILINE)
TAG = "# swa-repro cap-route:"


def check(names: str | None) -> str:
    if names not in FIXES:
        raise UsageError(f"--fix {names!r} with --vllm: choose {', '.join(FIXES)}")
    return names


def edit(text: str, version: str) -> str:
    """The release's backend file with the edits (the third where the release has its anchor); one
    line if a required anchor is not there."""
    d = list(_DECODE.finditer(text))
    p = list(_PREFILL.finditer(text))
    if len(d) != 1 or len(p) != 1:
        raise UsageError(f"--fix cap-route: vllm {version}'s {BACKEND} has {len(d)} decode and {len(p)} prefill "
                         "route anchors (1 each expected): not a structure this fix knows")
    i, var = d[0]["i"], d[0]["var"]
    decode = (f"{i}{TAG} trtllm-gen and XQA take no logits soft cap; soft-capped layers\n"
              f"{i}# decode on the planned wrapper, which does.\n"
              f"{i}{var} = {var} and not infer_global_hyperparameters(\n"
              f"{i}    get_per_layer_parameters(vllm_config, layer_names, FlashInferImpl)\n"
              f"{i}).logits_soft_cap\n")
    out = text[:d[0].start()] + decode + text[d[0].start():]
    m = _PREFILL.search(out)
    head = m["head"]
    out = (out[:m.start()] + f"{' ' * (len(head) - len(head.lstrip()))}{TAG} trtllm-gen context takes no soft cap\n"
           + head + "not self.logits_soft_cap and use_trtllm_attention(" + out[m.end():])
    q = list(_QUERY.finditer(out))
    if len(q) > 1:
        raise UsageError(f"--fix cap-route: vllm {version}'s {BACKEND} has {len(q)} query-quantization anchors "
                         "(at most 1 expected): not a structure this fix knows")
    for m in q:  # 0.20.0-0.24.x: the impl would take an fp8 query the builder no longer plans for
        j = m["j"]
        out = (out[:m.end()] + f"{j}{TAG} a soft-capped layer runs on the planned wrappers (model-dtype query)\n"
               f"{j}and not self.logits_soft_cap\n" + out[m.end():])
    return out


def upstream_diff(version: str, overlay: Path) -> str:
    before = (overlay / BACKEND).read_text()
    after = edit(before, version)
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{BACKEND}",
                                        f"b/{BACKEND}"))


def fixed_overlay(version: str, overlay: Path) -> Path:
    """The release's overlay with the fix, in the shared cache (made once)."""
    from swa_repro.core.cache import cache_root, locked

    target = cache_root() / "vllm-fixed" / f"{version}-cap-route"
    text = edit((overlay / BACKEND).read_text(), version)
    if (target / MARKER).is_file() and (target / BACKEND).read_text() == text:
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
