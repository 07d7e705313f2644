"""What state a flashinfer_backend.py is in, read from its structure with ``ast`` (never from a
version string): ``unfixed`` (sglang <= 0.5.15.post1), ``fixed`` (PR #31501) or ``unknown``, and
the ast nodes the text edits (``patch.edit``) work at. The package docstring says what the bug
and the fix are, with their source lines.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

from swa_repro.engine.patching import PatchError

MODULE = "sglang.srt.layers.attention.flashinfer_backend"
REL_PATH = Path("srt/layers/attention/flashinfer_backend.py")  # under the sglang package
CLASS, USW, CBF = "FlashInferIndicesUpdaterPrefill", "update_sliding_window", "call_begin_forward"
OTHER = {"unfixed": "fixed", "fixed": "unfixed"}
# What a state means, as the audit's and doctor's first lines say it: "fixed" is PR #31501's paged
# path only (the window on extend_paged), never the backend, whose other paths may still drop a
# window or the cap (issue #42: 0.5.23's gemma2 read "backend fixed" above "affected on the default path").
STATE_TEXT = {"fixed": "PR #31501 applied (the window on the paged-only prefill, extend_paged, only; "
                       "the other paths and the soft cap are audited on their own)",
              "unfixed": "PR #31501 not applied (the paged-only prefill, extend_paged, plans no window; "
                         "the other paths and the soft cap are audited on their own)"}


def state_text(state: str) -> str:
    """``backend <this>``: what :func:`classify`'s state covers, in words (:data:`STATE_TEXT`)."""
    return STATE_TEXT.get(state, f"{state} (PR #31501's structure not recognised)")


@functools.lru_cache(maxsize=32)
def parse(text: str) -> ast.Module:
    """``ast.parse``, memoized on the text: the fixes read one file many times over (each fix's
    state, each edit's check; 324 parses of ~0.05 s for one release's fixes, measured). The tree is
    shared: read it, never modify it."""
    return ast.parse(text)


@dataclass
class Structure:
    """What :func:`classify` found. ``state`` is unfixed / fixed / unknown, ``reasons`` say why."""

    state: str
    reasons: list = field(default_factory=list)
    plan_style: str = ""  # how call_begin_forward builds the paged plan call (for reports)
    # ast nodes for transform()
    tree: ast.Module | None = None
    usw: ast.FunctionDef | None = None
    cbf: ast.FunctionDef | None = None
    usw_call: ast.Call | None = None
    loop_var: str = "wrapper_id"
    plan_call: ast.Call | None = None
    plan_stmt: ast.stmt | None = None


def call_keyword(call, name):
    return next((k for k in call.keywords if k.arg == name), None)


def names_in(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def params_of(fn):
    a = fn.args
    return a.posonlyargs + a.args + a.kwonlyargs


def _default(fn, name):
    a = fn.args
    pos = a.posonlyargs + a.args
    defs = dict(zip([p.arg for p in pos[len(pos) - len(a.defaults):]], a.defaults))
    defs.update({p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None})
    d = defs.get(name)
    return ast.literal_eval(d) if d is not None else None


def _mentions_window_left(fn):
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and n.id == "window_left" or (
                isinstance(n, ast.arg) and n.arg == "window_left") or (
                isinstance(n, ast.keyword) and n.arg == "window_left") or (
                isinstance(n, ast.Constant) and n.value == "window_left"):
            return True
    return False


def _plan_calls(cbf):
    """The paged wrapper's ``begin_forward``/``plan`` calls: on the parameter named
    ``wrapper_paged`` (every release so far), else the third positional parameter."""
    names = [p.arg for p in cbf.args.args]
    paged = "wrapper_paged" if "wrapper_paged" in names else (names[2] if len(names) > 2 else "")
    return [n for n in ast.walk(cbf) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr in ("begin_forward", "plan")
            and isinstance(n.func.value, ast.Name) and n.func.value.id == paged]


def splat_window_if(cbf, call):
    """``if window_left >= 0: X["window_left"] = window_left`` with ``**X`` in the plan call."""
    splats = {k.value.id for k in call.keywords if k.arg is None and isinstance(k.value, ast.Name)}
    for n in ast.walk(cbf):
        if (isinstance(n, ast.If) and len(n.body) == 1 and isinstance(n.body[0], ast.Assign)
                and "window_left" in names_in(n.test)):
            t = n.body[0].targets[0]
            if (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                    and t.value.id in splats and isinstance(t.slice, ast.Constant)
                    and t.slice.value == "window_left"
                    and names_in(n.body[0].value) == {"window_left"}):
                return n, t.value.id
    return None, None


def _stmt_of(fn, call):
    for n in ast.walk(fn):
        if isinstance(n, ast.Expr) and n.value is call:
            return n
    return None


def classify(text: str) -> Structure:
    """Classify flashinfer_backend.py source by its structure (never by a version string)."""
    try:
        tree = parse(text)
    except SyntaxError as e:
        return Structure("unknown", [f"does not parse: {e}"])
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS), None)
    if cls is None:
        return Structure("unknown", [f"no class {CLASS}"])
    fns = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if USW not in fns or CBF not in fns:
        return Structure("unknown", [f"{CLASS} lacks {USW} or {CBF}"])
    s = Structure("unknown", tree=tree, usw=fns[USW], cbf=fns[CBF])
    calls = [n for n in ast.walk(s.usw) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == CBF]
    loops = [n for n in ast.walk(s.usw) if isinstance(n, ast.For) and isinstance(n.target, ast.Name)
             and any(c in ast.walk(n) for c in calls)]
    plans = _plan_calls(s.cbf)
    if len(calls) != 1 or len(loops) != 1 or len(plans) != 1:
        s.reasons.append(f"expected one self.{CBF}(...) in a wrapper loop of {USW} and one paged "
                         f"begin_forward/plan call in {CBF}; found {len(calls)}, {len(loops)}, "
                         f"{len(plans)}")
        return s
    s.usw_call, s.loop_var, s.plan_call = calls[0], loops[0].target.id, plans[0]
    s.plan_stmt = _stmt_of(s.cbf, s.plan_call)
    branch = any(isinstance(n, ast.Compare) and names_in(n) == {s.loop_var}
                 and isinstance(n.comparators[0], ast.Constant) and n.comparators[0].value == 0
                 for n in ast.walk(loops[0]))
    if not branch or s.plan_stmt is None:
        s.reasons.append(f"no `if {s.loop_var} == 0:` sliding-window branch in {USW}, "
                         "or the plan call is not a statement")
        return s
    splats = [k.value for k in s.plan_call.keywords if k.arg is None]
    s.plan_style = (f"{s.plan_call.func.attr}({len(s.plan_call.args)} positional, "
                    f"{len(s.plan_call.keywords) - len(splats)} keywords"
                    + "".join(f", **{ast.unparse(v)}" for v in splats) + ")")
    usw_kw = call_keyword(s.usw_call, "window_left")
    has_param = "window_left" in [p.arg for p in params_of(s.cbf)]
    if usw_kw is None and not _mentions_window_left(s.cbf):
        s.state = "unfixed"
        s.reasons.append(f"paged-only branch calls {CBF} without window_left and {CBF} never "
                         "plans the paged wrapper with one")
        return s
    direct = call_keyword(s.plan_call, "window_left")
    plumbed = (direct is not None and names_in(direct.value) == {"window_left"}) or (
        splat_window_if(s.cbf, s.plan_call)[0] is not None)
    usw_params = {p.arg for p in params_of(s.usw)}
    need = {s.loop_var, "use_ragged"} | ({"spec_info"} & usw_params)
    gated = usw_kw is not None and need <= names_in(usw_kw.value)
    default = _default(s.cbf, "window_left") if has_param else None
    checks = {f"{CBF} has `window_left: int = -1`": default == -1,
              f"{CBF} puts window_left into the paged plan": plumbed,
              f"{USW} passes window_left gated on {sorted(need)}": gated}
    if all(checks.values()):
        s.state = "fixed"
        s.reasons.append("; ".join(checks))
    else:
        s.reasons.append("partly patched or unrecognised: missing " +
                         "; ".join(k for k, ok in checks.items() if not ok))
    return s


def method_spans(text: str) -> dict:
    """``{method: (def_line, last_line)}`` of the two methods."""
    s = classify(text)
    if s.usw is None:
        raise PatchError(f"no {CLASS}.{USW}/{CBF} in this source")
    return {f.name: (f.lineno, f.end_lineno) for f in (s.usw, s.cbf)}

