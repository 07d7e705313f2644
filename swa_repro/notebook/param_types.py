"""The declared type and range of every notebook parameter: what ``swa-repro run --parameters``
accepts, checked before any notebook starts, whatever the default says (a default of ``None`` or
``[]`` says nothing about what a user may pass).

One table by parameter name (``COMMON``: the names several notebooks share mean the same thing in
each), and per notebook where one differs (``NOTEBOOK``). ``tests/test_param_types.py`` holds it
complete: every name of every ``parameters`` cell is declared here and its default fits. A
notebook not of this project (``--notebooks-dir``) is typed by its defaults (``params.infer``).
Ranges follow ``core.case`` (what a case may hold) where a parameter becomes part of a case; the
case's own cross-checks (heads divisible, window inside the KV, ...) stay in the notebook.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from swa_repro.core.case import MAX_BATCH, MAX_HEADS, MAX_KV_LEN
from swa_repro.engine.families import GPU_CLASSES

SEED_MAX = 2**32 - 1  # numpy's seed range


@dataclass(frozen=True)
class Param:
    """``kind``: int, float, bool, str, or ``list[int]`` / ``list[str]`` (``kind="list"`` with
    ``item``); ``lo``/``hi``: a number's (or each list item's) bounds, inclusive; ``choices``: the
    values a string (or a list's items) may take; ``optional``: ``None`` is accepted too;
    ``max_len``: a list's most items; ``non_empty``: a list needs one."""
    kind: type | str
    lo: float | None = None
    hi: float | None = None
    optional: bool = False
    choices: tuple | None = None
    item: type | None = None
    max_len: int | None = None
    non_empty: bool = False

    def describe(self) -> str:
        if self.kind == "list":
            what = f"a list of {self.item.__name__}" + (" (at least one)" if self.non_empty else "")
            what += _range_text(self)
        else:
            what = {int: "an int", float: "a number", bool: "true or false", str: "a string"}[self.kind]
            what += _range_text(self)
        return what + (" or None" if self.optional else "")

    def problem(self, value) -> str | None:
        """Why ``value`` does not fit (one phrase), or None."""
        if value is None:
            return None if self.optional else "None is not allowed"
        if self.kind == "list":
            if not isinstance(value, list):
                return "not a list"
            if self.non_empty and not value:
                return "an empty list"
            if self.max_len is not None and len(value) > self.max_len:
                return f"{len(value)} items, more than {self.max_len}"
            for x in value:
                why = _scalar_problem(self.item, self, x)
                if why:
                    return f"item {_short(json.dumps(x))}: {why}"
            return None
        return _scalar_problem(self.kind, self, value)


def _range_text(p: Param) -> str:
    if p.choices is not None:
        return " (one of " + ", ".join(str(c) for c in p.choices) + ")"
    if p.lo is not None and p.hi is not None:
        return f" in {_num(p.lo)}..{_num(p.hi)}"
    if p.lo is not None:
        return f" >= {_num(p.lo)}"
    return ""


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _scalar_problem(kind, p: Param, x) -> str | None:
    if kind is bool:
        ok = isinstance(x, bool)
    elif kind is int:
        ok = isinstance(x, int) and not isinstance(x, bool)
    elif kind is float:
        ok = isinstance(x, (int, float)) and not isinstance(x, bool)
    else:
        ok = isinstance(x, kind)
    if not ok:
        t = type(x).__name__
        return f"{'an' if t[0] in 'aeiou' else 'a'} {t}, not {Param(kind).describe()}"
    if p.choices is not None and x not in p.choices:
        return "not one of " + ", ".join(str(c) for c in p.choices)
    if p.lo is not None and x < p.lo or p.hi is not None and x > p.hi:
        return "out of range" + _range_text(Param(kind, p.lo, p.hi))
    return None


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _ints(lo, hi=MAX_KV_LEN, *, optional=True, non_empty=True, max_len=MAX_BATCH) -> Param:
    return Param("list", lo, hi, optional=optional, item=int, non_empty=non_empty, max_len=max_len)


WINDOW = dict(lo=-1, hi=MAX_KV_LEN)  # -1: no window (core.reference.visible)
HEADS = dict(lo=1, hi=MAX_HEADS)
COMMON: dict[str, Param] = {
    "recordings_dir": Param(str),  # a folder; "" is the committed recordings/
    "prefix_lens": _ints(0),
    "extend_lens": _ints(1),
    "window_left": Param(int, **WINDOW, optional=True),
    "num_qo_heads": Param(int, **HEADS, optional=True),
    "num_kv_heads": Param(int, **HEADS, optional=True),
    "head_dim": Param(int, optional=True, choices=(64, 128, 256)),
    "page_size": Param(int, 1, MAX_KV_LEN, optional=True),
    "backend": Param(str, choices=("fa2", "fa3", "auto")),
    "seed": Param(int, 0, SEED_MAX),
    # 01: a multi-tile case and a split-KV one
    "tile_prefix_lens": _ints(0, optional=False), "tile_extend_lens": _ints(1, optional=False),
    "tile_window_left": Param(int, **WINDOW), "tile_num_qo_heads": Param(int, **HEADS),
    "tile_num_kv_heads": Param(int, **HEADS),
    "split_prefix": Param(int, 0, MAX_KV_LEN), "split_extend": Param(int, 1, MAX_KV_LEN),
    "split_window_left": Param(int, **WINDOW),
    # 02
    "gqa_num_qo_heads": Param(int, **HEADS, optional=True), "gqa_num_kv_heads": Param(int, **HEADS, optional=True),
    "gqa_prefix": Param(int, 0, MAX_KV_LEN, optional=True), "gqa_extend": Param(int, 1, MAX_KV_LEN, optional=True),
    "gqa_window_left": Param(int, **WINDOW, optional=True),
    "long_extend": Param(int, 1, MAX_KV_LEN, optional=True), "long_window_left": Param(int, **WINDOW, optional=True),
    "plot_recordings": Param(bool),
    "fuzz_selftest_cases": Param(int, 0, 10_000),
    # 03, 04: which release and fixes (their names are checked where they are used)
    "sglang_release": Param(str),
    "fixes": Param(str),
    # 04
    "cases": Param("list", item=str, max_len=64),
    "failing_case": Param(str),
    "peer": Param(bool),
    "save_traces": Param(bool),
    # 05
    "prompts": _ints(1, optional=False, max_len=64),
    "prefixes": _ints(0, optional=False, max_len=64),
    # 06
    "live_seq_len": Param(int, 1, MAX_KV_LEN),
    "live_windows": _ints(1, optional=False, max_len=64),
    "live_backends": Param(str, choices=("fa2", "fa3", "fa2,fa3", "fa3,fa2")),
    "live_budget_s": Param(float, 1, 86400),
    "gpu_results": Param(str),
    "cpu_results": Param(str),
    # 07: my model, my GPU, my release
    "model": Param(str),  # a family of FAMILIES or a checkpoint's config.json / its folder (params._model)
    "gpu": Param(str, choices=("auto", *GPU_CLASSES)),
}
NOTEBOOK: dict[str, dict[str, Param]] = {}  # a notebook whose parameter of a shared name differs


# The project's notebooks (notebooks/NN_*.py; tests/test_param_types.py holds the list equal): the
# table is theirs. Another notebook (``--notebooks-dir``) is typed by its defaults.
PROJECT = ("00_overview", "01_plan_with_and_without_window_left", "02_masks_and_cta_skips", "03_apply_backend_patch",
           "04_rerun_checks", "05_backend_matrix_and_audit", "06_performance",
           "07_my_model_my_gpu", "08_vllm")


def declared(notebook: str, name: str) -> Param | None:
    """The declared type and range of ``name`` in ``notebook`` (a stem), or None: not one of the
    project's notebooks, or not in the table."""
    if notebook not in PROJECT:
        return None
    return NOTEBOOK.get(notebook, {}).get(name) or COMMON.get(name)
