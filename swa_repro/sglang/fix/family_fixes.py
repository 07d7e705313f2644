"""The fixes of the family- and GPU-class-level findings (``swa-repro audit --model FAMILY --gpu G``),
each an AST-anchored edit of the one file of sglang 0.5.14-0.5.23 it names (line numbers: 0.5.23's).

* ``commandr_window_hook`` (``srt/models/commandr.py``): Cohere2 (Command R7B) gives its sliding
  layers ``sliding_window_size=config.sliding_window`` (:206-218), HF's count, which includes the
  query (transformers' ``sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``), where
  ``RadixAttention`` takes keys left of the query (gemma2.py:52-53 subtracts 1); and the model class
  has no ``get_attention_sliding_window_size`` (:429-430, ``pass``), so the runner's window stays
  ``None`` (load_model_utils.py:144-157: Cohere2 is not in ``is_hybrid_swa_model``'s list) and the
  FlashInfer backend builds no sliding-window wrapper: every ragged, paged and decode plan is
  windowless. The fix does what gemma2.py / gemma3_causal.py do (sglang#4823 for Gemma-3): a
  module-level ``get_attention_sliding_window_size(config)`` (``sliding_window - 1``), the layer's
  window from it, and the hook on ``Cohere2ForCausalLM`` (not on v1's ``CohereForCausalLM``, which
  has no window). The rotary switch (:251, ``sliding_window_size > 0``) keeps HF's value.
* ``sm100_no_cutlass_window`` (``flashinfer_backend.py``): on sm100 the one ragged wrapper is built
  with ``backend="cutlass"`` (:501-522; 0.5.14 :427-432 without the head-dim gate), and FlashInfer's
  cutlass prefill plans neither ``window_left`` nor ``logits_soft_cap`` (flashinfer 0.7.2 prefill.py
  ``plan``: the cutlass branch takes no window or cap). The fix keeps ``fa2`` where the runner has a
  sliding window or the model config a soft cap (``_fmha_plans_window_or_cap``), in a statement
  after the release's own choice, so its head-dim and piecewise-graph gates stay as they are. The backend knows
  of sliding layers only through the runner's window, so Cohere2 needs ``commandr_window_hook`` too.
"""

from __future__ import annotations

import ast

from swa_repro.sglang.fix.anchors import BACKEND, Fix, Unknown, _need
from swa_repro.sglang.fix.source import Edit, Source, keyword

COMMANDR = "srt/models/commandr.py"
HOOK = "get_attention_sliding_window_size"
CUTLASS_GATE = "_fmha_plans_window_or_cap"


# ----------------------------------------------------------------------------- commandr.py
def _radix_window_kw(src: Source):
    init = _need(src.method("CohereAttention", "__init__"), "CohereAttention.__init__")
    calls = [c for c in ast.walk(init) if isinstance(c, ast.Call) and ast.unparse(c.func) == "RadixAttention"]
    if len(calls) != 1:
        raise Unknown(f"CohereAttention.__init__ makes {len(calls)} RadixAttention(...) calls, expected 1")
    kw = _need(keyword(calls[0], "sliding_window_size"), "sliding_window_size= in CohereAttention's RadixAttention(...)")
    return kw


def _commandr_hook(src: Source) -> list[Edit]:
    edits = []
    if src.func(HOOK) is None:
        anchor = _need(src.cls("CohereAttention"), "class CohereAttention")
        edits.append(src.insert_lines_before(anchor, [
            f"def {HOOK}(config):",
            "    # HF counts the window with the query (sliding_window keys in all); sglang's",
            "    # sliding_window_size counts the keys left of it, as gemma2.py does.",
            "    return config.sliding_window - 1",
            "",
            ""], indent=""))
    kw = _radix_window_kw(src)
    value = ast.unparse(kw.value)
    if f"{HOOK}(config)" not in value:
        if value != "self.sliding_window_size":
            raise Unknown(f"CohereAttention passes sliding_window_size={value}, not self.sliding_window_size")
        ind = src.indent_of(kw)
        edits.append(src.replace(kw.value, f"(\n{ind}    {HOOK}(config)\n{ind}    if self.sliding_window_size > 0\n"
                                           f"{ind}    else -1\n{ind})"))
    v2 = _need(src.cls("Cohere2ForCausalLM"), "class Cohere2ForCausalLM")
    if src.method("Cohere2ForCausalLM", HOOK) is None:
        body = [f"def {HOOK}(self):", f"    return {HOOK}(self.config)"]
        if len(v2.body) == 1 and isinstance(v2.body[0], ast.Pass):
            ind = src.indent_of(v2.body[0])
            edits.append(src.replace(v2.body[0], body[0] + "".join(f"{src.nl}{ind}{ln}" for ln in body[1:])))
        else:
            edits.append(src.insert_lines_after(v2.body[-1], ["", *body], indent=src.indent_of(v2.body[-1])))
    return edits


# ----------------------------------------------------------------------------- sm100 ragged backend
FALLBACK = f"if fmha_backend == 'cutlass' and {CUTLASS_GATE}(model_runner):"


def _cutlass_block(src: Source):
    """The statement of ``__init__``'s body that holds ``fmha_backend = "cutlass"`` (the sm100 ``if``)."""
    init = _need(src.method(BACKEND, "__init__"), f"{BACKEND}.__init__")
    hits = [s for s in init.body if any(isinstance(n, ast.Assign) and ast.unparse(n) == "fmha_backend = 'cutlass'"
                                        for n in ast.walk(s))]
    if len(hits) != 1:
        raise Unknown(f"{BACKEND}.__init__ has {len(hits)} statements setting fmha_backend = \"cutlass\", expected 1")
    after = init.body[init.body.index(hits[0]) + 1]
    return hits[0], after


def _sm100_no_cutlass(src: Source) -> list[Edit]:
    edits = []
    if src.func(CUTLASS_GATE) is None:
        anchor = _need(src.cls(BACKEND), f"class {BACKEND}")
        edits.append(src.insert_lines_before(anchor, [
            f"def {CUTLASS_GATE}(model_runner) -> bool:",
            '    """Whether prefill plans need a window or a soft cap: FlashInfer\'s cutlass',
            "    prefill plans neither, so the ragged wrapper keeps fa2 (the runner's window:",
            '    the layers slide; the config\'s attn_logit_softcapping: they cap)."""',
            '    config = getattr(model_runner.model_config, "hf_text_config", None)',
            '    cap = getattr(config, "attn_logit_softcapping", None)',
            "    return model_runner.sliding_window_size is not None or bool(cap and cap > 0)",
            "",
            ""], indent=""))
    block, after = _cutlass_block(src)
    if isinstance(after, ast.If) and ast.unparse(after).startswith(FALLBACK):
        return edits
    edits.append(src.insert_lines_after(block, [
        "# FlashInfer's cutlass prefill takes no window_left and no logits_soft_cap.",
        f'if fmha_backend == "cutlass" and {CUTLASS_GATE}(model_runner):',
        '    fmha_backend = "fa2"']))
    return edits


FAMILY_FIXES = {f.name: f for f in (
    Fix("commandr_window_hook", "Cohere2 (Command R7B): the sliding layers' window as sglang counts it "
        "(sliding_window - 1) and the model's get_attention_sliding_window_size hook, so the runner "
        "derives the window and FlashInfer builds its sliding-window wrappers (as gemma2.py does)",
        edits=_commandr_hook, file=COMMANDR),
    Fix("sm100_no_cutlass_window", "sm100: the ragged prefill wrapper keeps fa2 where the runner has a sliding "
        "window or the model a soft cap (FlashInfer's cutlass prefill plans neither)", edits=_sm100_no_cutlass),
)}
FAMILY_ORDER = tuple(FAMILY_FIXES)
