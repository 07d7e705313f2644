"""The two methods run without torch, flashinfer or a GPU: compiled from source text (or taken
from a loaded class) onto stub globals, so :func:`plan_window_lefts` can say which paged wrapper
a source plans with a window. Also the compiler the in-memory swap (``patch.swap``) uses.
"""

from __future__ import annotations

import __future__
import ast
import builtins
import inspect
import types
from unittest import mock

from swa_repro.engine.patching import PatchError
from swa_repro.sglang.patch.classify import CBF, CLASS, USW, classify, names_in


class _StubMeta(type):
    def __getattr__(cls, name):
        return mock.MagicMock(name=f"{cls.__name__}.{name}")

    def __getitem__(cls, item):
        return cls


class Stubs(dict):
    """Globals for running the two methods without torch/flashinfer: builtins are real,
    Capitalised names are stub classes (isinstance works), the rest are MagicMocks."""

    def __missing__(self, name):
        if hasattr(builtins, name):
            return getattr(builtins, name)
        v = _StubMeta(name, (), {}) if name[:1].isupper() else mock.MagicMock(name=name)
        self[name] = v
        return v


def _top_level(tree):
    """Module-level statements, also inside top-level if/try/with blocks (not defs)."""
    todo = list(tree.body)
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for f in ("body", "orelse", "finalbody", "handlers"):
                todo += [c for c in getattr(n, f, []) if isinstance(c, ast.stmt)
                         or isinstance(c, ast.excepthandler)]


def compile_methods(text, glb, filename):
    """The two methods of ``text`` compiled in ``glb`` (at their own lines, with the file's
    ``__future__`` flags, so code objects compare equal to the loaded ones)."""
    cls = compile_class(text, glb, filename)
    return cls.__dict__[USW], cls.__dict__[CBF]


def compile_class(text, glb, filename, whole=False):
    """``FlashInferIndicesUpdaterPrefill`` of ``text`` compiled in ``glb`` without running the
    rest of the module: the two methods only, or (``whole``) the class as written."""
    s = classify(text)
    if s.usw is None:
        raise PatchError(f"no {CLASS}.{USW}/{CBF} in {filename}")
    flags = 0
    for n in s.tree.body:
        if isinstance(n, ast.ImportFrom) and n.module == "__future__":
            for a in n.names:
                flags |= getattr(__future__, a.name).compiler_flag
    if {"super", "__class__"} & (names_in(s.usw) | names_in(s.cbf)):
        raise PatchError(f"{USW}/{CBF} use super(); they cannot be swapped in memory")
    cls = next(n for n in s.tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    if not whole:
        cls = ast.ClassDef(CLASS, [], [], [s.usw, s.cbf], [], lineno=s.usw.lineno, col_offset=0,
                           end_lineno=max(s.usw.end_lineno, s.cbf.end_lineno), end_col_offset=0)
    # The module's imports, never run (`if False:`), so names like `torch` count as imported
    # as they do in the real module: CPython 3.11 then emits LOAD_ATTR, not LOAD_METHOD, for
    # `torch.f(...)` (compile.c is_import_originated) and the code objects compare equal.
    imports = [n for n in _top_level(s.tree) if isinstance(n, (ast.Import, ast.ImportFrom))
               and getattr(n, "module", None) != "__future__"]
    never = ast.If(ast.Constant(False, lineno=1, col_offset=0, end_lineno=1, end_col_offset=0),
                   imports, [], lineno=1, col_offset=0, end_lineno=1, end_col_offset=0)
    body = ([never] if imports else []) + [cls]
    code = compile(ast.Module(body=body, type_ignores=[]), filename, "exec", flags=flags,
                   dont_inherit=True)
    ns = {}
    exec(code, glb, ns)  # noqa: S102 - a class statement only (the imports never run)
    return ns[CLASS]


def _rebind(fn, glb):
    out = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    return out


def plan_window_lefts(source, *, use_ragged=False, window=64) -> dict:
    """Run ``update_sliding_window`` -> ``call_begin_forward`` on stubs and return
    ``{wrapper_id: window_left given to that paged wrapper's plan, or None}``.

    ``source`` is flashinfer_backend.py text or a loaded ``FlashInferIndicesUpdaterPrefill``
    class (the code its two methods have now); either runs on stub globals (MagicMock torch,
    wrappers and tensors). A behavioural check without a GPU: fixed
    code gives ``{0: window, 1: None}`` on the paged-only path and ``{0: None, 1: None}`` with
    ragged; unfixed code never passes a window.
    """
    # eager path: no piecewise-CUDA-graph context (0.5.10 call_begin_forward pads for one)
    stubs = Stubs(get_forward_context=lambda: None, is_in_piecewise_cuda_graph=lambda: False)
    if isinstance(source, str):
        usw, cbf = compile_methods(source, stubs, "<swa-repro stub>")
    else:  # the class's current code, rebound to stub globals
        usw, cbf = (_rebind(source.__dict__[n], stubs) for n in (USW, CBF))
    wrappers = [mock.MagicMock(name=f"paged_wrapper_{i}") for i in range(2)]
    self = mock.MagicMock(name="self", sliding_window_size=window, _swa_kv_pool=None,
                          token_to_kv_pool_allocator=None, wrappers_paged=wrappers)
    self.call_begin_forward = types.MethodType(cbf, self)
    special = {"prefill_wrappers": wrappers, "use_ragged": use_ragged, "spec_info": None}
    kwargs = {}
    for name, p in list(inspect.signature(usw).parameters.items())[1:]:
        if name in special:
            kwargs[name] = special[name]
        elif p.default is inspect.Parameter.empty:
            kwargs[name] = mock.MagicMock(name=name)
    usw(self, **kwargs)
    out = {}
    for i, w in enumerate(wrappers):
        calls = w.begin_forward.call_args_list + w.plan.call_args_list
        if len(calls) != 1:
            raise AssertionError(f"paged wrapper {i} planned {len(calls)} times")
        out[i] = calls[0].kwargs.get("window_left")
    return out
