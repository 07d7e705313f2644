"""The fixes of the family- and GPU-class-level findings (``swa-repro audit --model FAMILY --gpu G``),
each an AST-anchored edit of the one file of sglang 0.5.14-0.5.23 it names (line numbers: 0.5.23's).

* ``commandr_window_hook`` (``srt/models/commandr.py``): the model class has no
  ``get_attention_sliding_window_size`` (:429-430, ``pass``), so the runner's window stays ``None``
  (load_model_utils.py:144-157: Cohere2 is not in ``is_hybrid_swa_model``'s list) and the FlashInfer
  backend builds no sliding-window wrapper: every ragged, paged and decode plan is windowless while
  the sliding layers ask for ``sliding_window_size=config.sliding_window`` (:206-218). The fix adds the
  hook on ``Cohere2ForCausalLM`` (not on v1's ``CohereForCausalLM``, which has no window), as
  sglang#4823 did for Gemma-3, returning what the layers pass, so the runner plans what they ask.
  That is HF's count, which includes the query (transformers: ``kv_idx > q_idx - sliding_window``),
  one key more than transformers' mask in ``RadixAttention``'s count (keys left of the query); vLLM
  keeps it on purpose (commandr.py:237-243, Cohere's training convention), so the layers are left
  as they are and the audit reports the difference as ``layer != HF``, as vLLM's table does.
* ``sm100_no_cutlass_window`` (``flashinfer_backend.py``): on sm100 the shared ragged wrapper is built
  with ``backend="cutlass"`` (:501-522; 0.5.14 :427-432 without the head-dim gate), and FlashInfer's
  cutlass prefill plans neither ``window_left`` nor ``logits_soft_cap`` (flashinfer 0.7.2 prefill.py
  ``plan``: the cutlass branch takes no window or cap). The window is the ragged fixes' business:
  their sliding-window wrapper is built with fa2 where the shared one is cutlass (``fix.fixes``
  ``_swa_backend``), so the full layers keep cutlass (issue #40: forcing the shared wrapper off it
  slowed every full layer's prefill on B200). This fix keeps ``fa2`` on the shared wrapper only where
  the model's layers cap (``_fmha_plans_cap``: their ``logit_cap``, as the soft-cap fixes read it),
  in a statement after the release's own choice, so its head-dim and piecewise-graph gates stay.
* ``ragged_prefix_full_layers`` (``flashinfer_backend.py``, 0.5.14-0.5.20): where the runner has a
  window, ``update_sliding_window`` plans wrapper 1 (the full layers) over ``seq_lens`` for ragged
  prefill with a prefix too (0.5.20 :1970-1974), while the full layers' paged pass runs before the
  extend's K/V is written and unmasked (``causal=False``), merged with the ragged causal pass: each
  query also sees the extend's keys through the paged pass (the audit: every full-layer query of
  ``extend_ragged_prefix`` extra). 0.5.21 plans it over ``prefix_lens`` (0.5.23 :2045-2052); the fix
  adds that branch; on 0.5.21+ it reads applied.
"""

from __future__ import annotations

import ast

from swa_repro.sglang.fix.anchors import BACKEND, PREFILL, USW, Fix, Unknown, _need
from swa_repro.sglang.fix.source import Edit, Source, keyword

COMMANDR = "srt/models/commandr.py"
HOOK = "get_attention_sliding_window_size"
CUTLASS_GATE = "_fmha_plans_cap"


# ----------------------------------------------------------------------------- commandr.py
def _radix_window_kw(src: Source):
    init = _need(src.method("CohereAttention", "__init__"), "CohereAttention.__init__")
    calls = [c for c in ast.walk(init) if isinstance(c, ast.Call) and ast.unparse(c.func) == "RadixAttention"]
    if len(calls) != 1:
        raise Unknown(f"CohereAttention.__init__ makes {len(calls)} RadixAttention(...) calls, expected 1")
    kw = _need(keyword(calls[0], "sliding_window_size"), "sliding_window_size= in CohereAttention's RadixAttention(...)")
    return kw


def _commandr_hook(src: Source) -> list[Edit]:
    """``Cohere2ForCausalLM.get_attention_sliding_window_size``: the window the sliding layers pass to
    RadixAttention (``config.sliding_window``, unchanged: Cohere's convention, which vLLM's commandr.py
    also keeps), so the runner plans what the layers ask. The layers are not edited."""
    kw = _radix_window_kw(src)
    if ast.unparse(kw.value) != "self.sliding_window_size":
        raise Unknown(f"CohereAttention passes sliding_window_size={ast.unparse(kw.value)}, not self.sliding_window_size")
    v2 = _need(src.cls("Cohere2ForCausalLM"), "class Cohere2ForCausalLM")
    if src.method("Cohere2ForCausalLM", HOOK) is not None:
        return []
    body = [f"def {HOOK}(self):",
            "    # The window the sliding layers pass to RadixAttention (CohereAttention:",
            "    # config.sliding_window), so the runner plans the window the layers ask.",
            "    return self.config.sliding_window"]
    if len(v2.body) == 1 and isinstance(v2.body[0], ast.Pass):
        ind = src.indent_of(v2.body[0])
        return [src.replace(v2.body[0], body[0] + "".join(f"{src.nl}{ind}{ln}" for ln in body[1:]))]
    return [src.insert_lines_after(v2.body[-1], ["", *body], indent=src.indent_of(v2.body[-1]))]


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
            '    """Whether the model\'s attention layers cap their logits: FlashInfer\'s cutlass',
            "    prefill plans no logits_soft_cap, so the shared ragged wrapper keeps fa2 then.",
            "    Read from the layers (their logit_cap); a runner whose model holds none (the",
            '    attention test kit\'s) names it in its config."""',
            '    model = getattr(model_runner, "model", None)',
            "    caps = [",
            "        module.logit_cap",
            "        for module in (model.modules() if model is not None else ())",
            '        if hasattr(module, "logit_cap")',
            "    ]",
            "    if not caps:",
            '        config = getattr(model_runner.model_config, "hf_text_config", None)',
            '        caps = [getattr(config, "attn_logit_softcapping", None)]',
            "    return any(cap is not None and cap > 0 for cap in caps)",
            "",
            ""], indent=""))
    block, after = _cutlass_block(src)
    if isinstance(after, ast.If) and ast.unparse(after).startswith(FALLBACK):
        return edits
    edits.append(src.insert_lines_after(block, [
        "# FlashInfer's cutlass prefill takes no logits_soft_cap.",
        f'if fmha_backend == "cutlass" and {CUTLASS_GATE}(model_runner):',
        '    fmha_backend = "fa2"']))
    return edits


# ----------------------------------------------------------------------------- full layers, ragged with prefix
def _full_wrapper_branch(src: Source):
    """``update_sliding_window``'s ``if wrapper_id == 0: ... else: <full attention>``."""
    usw = _need(src.method(PREFILL, USW), f"{PREFILL}.{USW}")
    ifs = [n for n in ast.walk(usw) if isinstance(n, ast.If) and ast.unparse(n.test) == "wrapper_id == 0"]
    if len(ifs) != 1 or not ifs[0].orelse:
        raise Unknown(f"{USW} has no single `if wrapper_id == 0: ... else: ...`")
    return ifs[0]


def _full_prefix_only(src: Source) -> list[Edit]:
    branch = _full_wrapper_branch(src)
    first = branch.orelse[0]
    if len(branch.orelse) == 1 and isinstance(first, ast.If) and ast.unparse(first.test) == "use_ragged":
        return []  # 0.5.21+: the release plans the full layers' paged pass over the prefix
    if ast.unparse(first) != "paged_kernel_lens = seq_lens":
        raise Unknown(f"{USW}'s full-attention branch does not start with paged_kernel_lens = seq_lens")
    ind = src.indent_of(branch)
    at = next((k for k in range(first.lineno - 2, branch.lineno - 1, -1) if src.lines[k].strip() == "else:"
               and src.lines[k].startswith(ind) and not src.lines[k][len(ind)].isspace()), None)
    if at is None:
        raise Unknown(f"no `else:` of {USW}'s `if wrapper_id == 0`")
    return [src.insert_lines_before(_line_at(at), [
        "elif use_ragged:",
        "    # Extend K/V lands after the paged pass: plan over the prefix only.",
        "    paged_kernel_lens = prefix_lens",
        "    paged_kernel_lens_sum = prefix_lens.sum().item()",
        "    kv_start_idx = prefix_lens - paged_kernel_lens"], indent=ind)]


def _line_at(index: int):
    """A stand-in statement at 0-based line ``index`` (``Source.insert_lines_before`` reads ``lineno``)."""
    return ast.Pass(lineno=index + 1, col_offset=0, end_lineno=index + 1, end_col_offset=0)


FAMILY_FIXES = {f.name: f for f in (
    Fix("commandr_window_hook", "Cohere2 (Command R7B): the model's get_attention_sliding_window_size hook, "
        "returning the window its sliding layers pass (config.sliding_window), so the runner plans what the "
        "layers ask and FlashInfer builds its sliding-window wrappers (as gemma2.py's hook does)",
        edits=_commandr_hook, file=COMMANDR),
    Fix("ragged_prefix_full_layers", "0.5.14-0.5.20, ragged prefill with a cached prefix in a model with "
        "sliding-window layers: the full layers' paged pass is planned over the prefix only (0.5.21's own "
        "branch), not the whole sequence, whose extend part it would see unmasked", edits=_full_prefix_only),
    Fix("sm100_no_cutlass_window", "sm100: the shared ragged prefill wrapper keeps fa2 only where the model's "
        "layers cap their logits (FlashInfer's cutlass prefill plans no cap); the full layers keep cutlass",
        edits=_sm100_no_cutlass),
)}
FAMILY_ORDER = tuple(FAMILY_FIXES)
