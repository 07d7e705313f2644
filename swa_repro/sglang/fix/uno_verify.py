"""Why the window gate of the spec-verify fixes does not list ``UNO_VERIFY`` (issue #40's review:
"``UNO_VERIFY`` missing from a hard-coded spec list"), read from the release's own files.

A UNO verify reaches FlashInfer's backend as a ``TARGET_VERIFY`` batch whose ``spec_info`` is a
``UnoForwardInput`` (0.5.23 ``speculative/uno_worker_v2.py:294-301``). The backend's verify plan asks
every non-DFlash verify input for its ``generate_attn_arg_prefill`` (0.5.23
``layers/attention/flashinfer_backend.py:2285``; DFlash's own call is :2273); ``UnoForwardInput``
(``uno_info.py:242``) and its base ``SpecInput`` (``spec_info.py:397``) define none, so the plan raises
``AttributeError`` before any window is planned: FlashInfer cannot serve a UNO verify in that
release (only FA3's backend knows UNO: ``flashattention_backend.py:1819``). Listing ``UNO_VERIFY``
in the gate would claim a fix for a path that does not run. When a release gives UNO that method,
:func:`reading` says so, and the gate must take it (a chain at logical positions: no tree mask).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

UNO_INFO = "srt/speculative/uno_info.py"
SPEC_INFO = "srt/speculative/spec_info.py"
BACKEND = "srt/layers/attention/flashinfer_backend.py"
INPUT, BASE, METHOD = "UnoForwardInput", "SpecInput", "generate_attn_arg_prefill"
CALL = f"spec_info.{METHOD}("


@dataclass(frozen=True)
class UnoReading:
    """What a release's files say of a UNO verify on FlashInfer; lines are 1-based."""

    input_line: int  # class UnoForwardInput
    base_line: int  # class SpecInput
    has_method: bool  # either defines generate_attn_arg_prefill
    call_lines: tuple[int, ...]  # the backend's calls of spec_info.generate_attn_arg_prefill(

    def flashinfer_serves_it(self) -> bool:
        return self.has_method

    def text(self) -> str:
        calls = ", ".join(f":{n}" for n in self.call_lines)
        where = (f"`{INPUT}` (`speculative/uno_info.py:{self.input_line}`) and its base `{BASE}` "
                 f"(`spec_info.py:{self.base_line}`)")
        if self.has_method:
            return (f"{where} define `{METHOD}`, which the backend's verify plan calls (`flashinfer_backend.py"
                    f"{calls}`): FlashInfer serves a UNO verify here, and the window gate must list `UNO_VERIFY`.")
        return (f"`UNO_VERIFY` is not listed on purpose: the backend's verify plan calls `{METHOD}` on every "
                f"verify input (`flashinfer_backend.py{calls}`), and {where} define none, so a UNO "
                "verify on FlashInfer raises `AttributeError` before any window is planned. Listing it would claim "
                "a fix for a path that does not run; the gate takes it when UNO gains that method.")


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _defines(cls: ast.ClassDef) -> bool:
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == METHOD for n in cls.body)


def reading(read: Callable[[str], str]) -> UnoReading | None:
    """``read(rel)`` -> the release's text of ``sglang/<rel>``; ``None`` where the release has no UNO
    verify input (no ``uno_info.py`` or no ``UnoForwardInput`` in it)."""
    try:
        uno = ast.parse(read(UNO_INFO))
    except FileNotFoundError:
        return None
    cls, base = _class(uno, INPUT), _class(ast.parse(read(SPEC_INFO)), BASE)
    if cls is None or base is None:
        return None
    calls = tuple(i for i, ln in enumerate(read(BACKEND).splitlines(), 1) if CALL in ln)
    return UnoReading(cls.lineno, base.lineno, _defines(cls) or _defines(base), calls)
