"""The soft-cap fixes of ``fix.fixes``: ``soft_cap_prefill`` and ``soft_cap_decode`` (plans carry
the model's cap; a layer asking for another is refused); see that module's docstring.
"""

from __future__ import annotations

import ast

from swa_repro.sglang.fix.anchors import (BACKEND, CAP_HELPER, CBF, DECODE, PREFILL, Unknown, _assign_to, _need,
                                          _paged_plan, _ragged_plan, _stmt_holding)
from swa_repro.sglang.fix.source import Edit, Source, calls_on, keyword

def _cap_helper(src: Source) -> list[Edit]:
    if src.func(CAP_HELPER) is not None:
        return []
    anchor = _need(src.cls(DECODE), f"class {DECODE}")
    return [src.insert_lines_before(anchor, [
        f"def {CAP_HELPER}(model_runner) -> float:",
        '    """The attention logits soft cap to plan with: FlashInfer compiles it in at',
        "    plan(), and a cap passed only to forward() is never applied. Read once, at",
        "    start-up, from the model's attention layers (each RadixAttention's logit_cap,",
        "    as the model file set it: gemma2.py from attn_logit_softcapping, grok.py with",
        "    its fallback of 30); a runner whose model holds no attention layer (layers",
        '    built apart from it, as in the attention test kit) names it in its config."""',
        '    model = getattr(model_runner, "model", None)',
        "    caps = {",
        "        max(float(module.logit_cap or 0.0), 0.0)",
        "        for module in (model.modules() if model is not None else ())",
        '        if hasattr(module, "logit_cap")',
        "    }",
        "    if not caps:",
        '        config = getattr(model_runner.model_config, "hf_text_config", None)',
        '        cap = getattr(config, "attn_logit_softcapping", None)',
        "        caps = {float(cap) if cap is not None and cap > 0 else 0.0}",
        "    if len(caps) > 1:",
        "        raise ValueError(",
        '            f"the attention layers ask for logits soft caps {sorted(caps)}, but"',
        '            " FlashInfer compiles one cap in at plan(): use another attention backend"',
        "        )",
        "    return caps.pop()",
        "",
        ""], indent="")]


CAP_CHECK = "_check_logits_soft_cap"


def _cap_check_method(src: Source) -> list[Edit]:
    """A backend method that refuses a layer whose cap is not the one planned: FlashInfer compiles
    the cap in at plan(), so such a layer would run with the planned cap (a capped plan and a layer
    cap of 0: the kernel divides by it), and it applies tanh only (radix_attention.py:73 also lets
    a layer ask for another method, as grok.py:426 does)."""
    if src.method(BACKEND, CAP_CHECK) is not None:
        return []
    idx = _need(src.method(BACKEND, "_get_wrapper_idx"), f"{BACKEND}._get_wrapper_idx")
    return [src.insert_lines_before(idx, [
        f"def {CAP_CHECK}(self, layer: RadixAttention, planned: float):",
        '    """FlashInfer compiles the logits soft cap in at plan(): a layer asking for',
        "    another cap would silently run with the planned one (a capped plan divides",
        '    by a layer cap of 0), so refuse instead."""',
        "    cap = float(layer.logit_cap or 0.0)",
        '    method = getattr(layer, "logit_capping_method", "tanh")',
        '    if cap > 0 and method != "tanh":',
        "        raise ValueError(",
        '            f"layer {layer.layer_id} asks for a {method!r} logits soft cap;"',
        '            " FlashInfer applies tanh only: use another attention backend"',

        "        )",
        "    if cap != planned:",
        "        raise ValueError(",
        '            f"layer {layer.layer_id} asks for logits_soft_cap={cap}, but"',
        '            f" FlashInfer was planned with {planned}"',
        '            " (the model\'s layers\' cap at start-up) and compiles the cap in"',
        '            " at plan(): use another attention backend for this model"',
        "        )",
        ""], indent=src.indent_of(idx))]


def _checks_cap(fn, updater: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == CAP_CHECK
               for n in ast.walk(fn))


def _cap_attr(src: Source, cls: str) -> list[Edit]:
    init = _need(src.method(cls, "__init__"), f"{cls}.__init__")
    if _assign_to(init, "logits_soft_cap") is not None:
        return []
    after = _need(_assign_to(init, "sliding_window_size"), f"self.sliding_window_size = ... in {cls}.__init__")
    return [src.insert_lines_after(after, [f"self.logits_soft_cap = {CAP_HELPER}(model_runner)"])]


def _soft_cap_prefill(src: Source):
    cbf, ragged = _ragged_plan(src)
    _, paged = _paged_plan(src)
    splat = next((k for k in paged.keywords if k.arg is None), None)
    if splat is None or ast.unparse(splat.value) != "paged_plan_kwargs":
        raise Unknown("the paged plan call takes no **paged_plan_kwargs")
    done = keyword(ragged, "logits_soft_cap") is not None
    paged_done = '"logits_soft_cap"' in src.seg(cbf) or "'logits_soft_cap'" in src.seg(cbf)
    fe = _need(src.method(BACKEND, "forward_extend"), f"{BACKEND}.forward_extend")
    checked = _checks_cap(fe, "indices_updater_prefill")
    if done and paged_done and checked:
        return []
    edits = _cap_helper(src) + _cap_attr(src, PREFILL) + _cap_check_method(src)
    if not checked:
        read = _need(next((s for s in fe.body if isinstance(s, ast.Assign) and ast.unparse(s) ==
                           "logits_soft_cap = layer.logit_cap"), None),
                     "`logits_soft_cap = layer.logit_cap` in forward_extend")
        edits.append(src.insert_lines_after(read, [
            f"self.{CAP_CHECK}(layer, self.indices_updater_prefill.logits_soft_cap)"]))
    if not done:
        edits.append(src.add_keyword(ragged, "logits_soft_cap=self.logits_soft_cap"))
    if not paged_done:
        fast = "uses_fast_prefill" if any(isinstance(n, ast.Name) and n.id == "uses_fast_prefill"
                                          for n in ast.walk(cbf)) else None
        if fast is None:
            raise Unknown(f"{PREFILL}.{CBF} has no uses_fast_prefill")
        edits.append(src.insert_lines_before(_stmt_holding(cbf, paged), [
            f"if self.logits_soft_cap > 0 and not {fast}:",
            "    # plan() compiles the cap in; a fast_prefill_plan replay keeps the",
            "    # module it captured",
            '    paged_plan_kwargs["logits_soft_cap"] = self.logits_soft_cap']))
    return edits


def _soft_cap_decode(src: Source):
    cbf = _need(src.method(DECODE, CBF), f"{DECODE}.{CBF}")
    calls = calls_on(cbf, "wrapper")
    if not calls:
        raise Unknown(f"{DECODE}.{CBF} makes no wrapper.begin_forward call")
    todo = [c for c in calls if keyword(c, "logits_soft_cap") is None]
    fd = _need(src.method(BACKEND, "forward_decode"), f"{BACKEND}.forward_decode")
    checked = _checks_cap(fd, "indices_updater_decode")
    if not todo and checked:
        return []
    edits = _cap_helper(src) + _cap_attr(src, DECODE) + _cap_check_method(src) + [
        src.add_keyword(c, "logits_soft_cap=self.logits_soft_cap") for c in todo]
    if not checked:
        fwd = [c for c in ast.walk(fd) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
               and c.func.attr == "forward" and ast.unparse(c.func.value) == "decode_wrapper"]
        if len(fwd) != 1:
            raise Unknown(f"forward_decode makes {len(fwd)} decode_wrapper.forward(...) calls, expected 1")
        stmt = next(s for s in fd.body if any(n is fwd[0] for n in ast.walk(s)))
        edits.append(src.insert_lines_before(stmt, [
            f"self.{CAP_CHECK}(layer, self.indices_updater_decode.logits_soft_cap)"]))
    return edits
