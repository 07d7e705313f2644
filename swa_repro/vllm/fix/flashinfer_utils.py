"""The cap-route fix's edit of vLLM's ``vllm/utils/flashinfer.py``: the rule where vLLM decides.

A vLLM maintainer's review (issue #40) asked for the rule in the module that decides trtllm-gen /
XQA, not beside each caller: ``use_trtllm_attention`` (the prefill route) and its decode twin
``can_use_trtllm_attention`` (the builder's decode route, the large-page offer, the impl's
``support_trtllm_attn``) take a ``has_logits_soft_cap`` argument (default ``False``: every other
caller unchanged) and with a cap return ``False`` after a ``logger.warning_once``, the file's own
style (0.34.0 ``vllm/utils/flashinfer.py:789``: "TRTLLM prefill does not support DCP, reverting to
FlashInfer"). Every release 0.20.0-0.34.0 defines both functions at module level; each is found by
its ``ast`` node, never by a line number.

``model_has_logits_soft_cap()`` is added beside them for the callers that run before any layer
exists (backend selection, the kernel page sizes): it reads the config key every model file of
0.34.0 hands ``Attention`` as its cap (``attn_logit_softcapping`` of the text config: gemma2.py:202,
gemma4.py:613, gemma4_mtp.py:282, gemma4_dspark.py:67, transformers/base.py:625), from the config
that ``force_use_trtllm_attention`` reads too (``get_current_vllm_config_or_none``, in every
release from 0.20.0).
"""

from __future__ import annotations

import ast

from swa_repro.core.errors import UsageError

UTILS = "vllm/utils/flashinfer.py"
ARG = "has_logits_soft_cap"
HELPER = "model_has_logits_soft_cap"
ROUTES = ("can_use_trtllm_attention", "use_trtllm_attention")
CHECK = ("    if has_logits_soft_cap:\n"
         "        logger.warning_once(\n"
         '            "TRTLLM does not support logits soft-capping, reverting to FlashInfer"\n'
         "        )\n"
         "        return False\n")
HELPER_DEF = (f"def {HELPER}() -> bool:\n"
              '    """Whether the model\'s attention layers apply a logits soft cap, from the\n'
              "    config key the model files pass to Attention. For callers that run before\n"
              '    the layers exist (backend selection, kernel block sizes)."""\n'
              "    from vllm.config import get_current_vllm_config_or_none\n\n"
              "    vllm_config = get_current_vllm_config_or_none()\n"
              "    if vllm_config is None or vllm_config.model_config is None:\n"
              "        return False\n"
              "    text_config = vllm_config.model_config.hf_text_config\n"
              '    return getattr(text_config, "attn_logit_softcapping", None) is not None\n\n\n')


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _signature(lines: list[str], fn: ast.FunctionDef) -> tuple[int, int]:
    """The 0-based line span ``[start, end)`` of ``fn``'s ``def`` up to its body."""
    return fn.lineno - 1, fn.body[0].lineno - 1


def _with_arg(lines: list[str], fn: ast.FunctionDef) -> list[str]:
    """``fn``'s signature with ``has_logits_soft_cap: bool = False`` last, as ``ruff format`` writes
    it at 88 columns: an exploded one (its magic trailing comma) gets one more line, a short one is
    written on one line, or its parameters on one indented line, or one per line."""
    start, end = _signature(lines, fn)
    sig = lines[start:end]
    if len(sig) > 1 and sig[-2].rstrip().endswith(","):
        return sig[:-1] + [f"    {ARG}: bool = False,\n", sig[-1]]
    if "#" in "".join(sig):
        raise UsageError(f"--fix cap-route: {UTILS}'s {fn.name} has a comment in a short signature: "
                         "not a structure this fix knows")
    args = fn.args
    defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    params = [f"{a.arg}: {ast.unparse(a.annotation)}" + (f" = {ast.unparse(d)}" if d is not None else "")
              for a, d in zip(args.args, defaults)] + [f"{ARG}: bool = False"]
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns is not None else ""
    one = f"def {fn.name}({', '.join(params)}){ret}:\n"
    if len(one) <= 89:
        return [one]
    middle = f"    {', '.join(params)}\n"
    if len(middle) <= 89:
        return [f"def {fn.name}(\n", middle, f"){ret}:\n"]
    return [f"def {fn.name}(\n"] + [f"    {p},\n" for p in params] + [f"){ret}:\n"]


def _check_at(lines: list[str], fn: ast.FunctionDef) -> tuple[int, list[str]]:
    """Where the cap check goes (a 0-based line) and its lines: after the docstring and, where the
    function starts with it, the "force off" test (the CLI's 0 is respected first, as the DCP check
    in ``use_trtllm_attention`` is); a blank line between it and the code around it."""
    body = list(fn.body)
    if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    first = body[0]
    if isinstance(first, ast.If) and "force_use_trtllm" in ast.unparse(first.test) and (
            isinstance(first.body[-1], ast.Return)):
        at = first.end_lineno
        return at, ["\n", CHECK] + (["\n"] if lines[at].strip() else [])
    at = first.lineno - 1
    while lines[at - 1].lstrip().startswith("#"):  # the comment over the first statement stays with it
        at -= 1
    return at, [CHECK, "\n"]


def edit(text: str, version: str) -> str:
    """The release's ``vllm/utils/flashinfer.py`` with the argument, the check and the helper; one
    line if a route function is not there."""
    fns = _functions(text)
    missing = [f for f in ROUTES if f not in fns]
    if missing:
        raise UsageError(f"--fix cap-route: vllm {version}'s {UTILS} has no {', '.join(missing)}: not a structure "
                         "this fix knows")
    lines = text.splitlines(True)
    for fn in sorted((fns[f] for f in ROUTES), key=lambda n: -n.lineno):  # bottom up: spans stay valid
        at, new = _check_at(lines, fn)
        lines[at:at] = new
        start, end = _signature(lines, fn)
        lines[start:end] = _with_arg(lines, fn)
    can = fns["can_use_trtllm_attention"]
    top = (can.decorator_list[0].lineno if can.decorator_list else can.lineno) - 1
    if HELPER not in fns:
        lines[top:top] = [HELPER_DEF]
    return "".join(lines)


def hunks(text: str) -> dict[str, bool]:
    """Each of this file's edits -> whether it is there, read from the functions' ``ast``: the
    argument in the signature and an ``if has_logits_soft_cap:`` that returns ``False``; the helper
    defined. Empty where the file has neither route function."""
    fns = _functions(text)
    out = {}
    for name in ROUTES:
        fn = fns.get(name)
        if fn is None:
            continue
        has_arg = any(a.arg == ARG for a in fn.args.args + fn.args.kwonlyargs)
        checks = any(isinstance(n, ast.If) and ast.unparse(n.test) == ARG and isinstance(n.body[-1], ast.Return)
                     and ast.unparse(n.body[-1].value) == "False" for n in fn.body)
        out[f"{name} argument"] = has_arg and checks
    if out:
        out[f"{HELPER} helper"] = HELPER in fns
    return out
