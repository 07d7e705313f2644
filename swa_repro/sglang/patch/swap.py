"""In memory: ``with patched():`` / ``with unpatched():`` swap the two methods of the loaded
``FlashInferIndicesUpdaterPrefill`` for their fixed / unfixed form, restored on exit; nothing on
disk changes.
"""

from __future__ import annotations

import contextlib
import importlib
import linecache
from pathlib import Path

from swa_repro.engine.patching import PatchError
from swa_repro.sglang.patch.classify import CBF, CLASS, MODULE, OTHER, USW, classify
from swa_repro.sglang.patch.edit import transform
from swa_repro.sglang.patch.stubs import Stubs, compile_methods

_BASE: dict = {}  # class -> (text its loaded methods come from, that text's state, methods)


def _loaded_module(module):
    if module is not None:
        return module
    try:
        return importlib.import_module(MODULE)
    except ImportError as e:
        raise PatchError(f"cannot import {MODULE} ({e}); install sglang "
                         "(`pip install sglang==0.5.15.post1`)") from e


def _base_of(module, cls):
    """The text and state the loaded (not swapped) methods come from: the file on disk, or its
    transform if the file was patched in place after import."""
    if cls in _BASE:
        return _BASE[cls]
    path = Path(module.__file__)
    disk = path.read_bytes().decode()
    s = classify(disk)
    if s.state == "unknown":
        raise PatchError(f"{path} is in an unknown state ({'; '.join(s.reasons)})")
    loaded = (cls.__dict__[USW].__code__, cls.__dict__[CBF].__code__)
    for text, state in ((disk, s.state), (transform(disk, OTHER[s.state]), OTHER[s.state])):
        fns = compile_methods(text, Stubs(), str(path))
        if (fns[0].__code__, fns[1].__code__) == loaded:
            _BASE[cls] = (text, state, {USW: cls.__dict__[USW], CBF: cls.__dict__[CBF]})
            return _BASE[cls]
    raise PatchError(f"the loaded {CLASS} matches neither {path} nor its patched form (changed "
                     "since import?); restart Python and try again")


@contextlib.contextmanager
def _swapped(target, module=None):
    module = _loaded_module(module)
    cls = getattr(module, CLASS)
    saved = {n: cls.__dict__[n] for n in (USW, CBF)}
    base, base_state, originals = _base_of(module, cls)
    current = getattr(saved[USW], "__swa_repro_state__", base_state)
    if current != target and base_state == target:
        for n, fn in originals.items():
            setattr(cls, n, fn)
    elif current != target:
        text = transform(base, target)
        fname = f"<swa-repro {target} {module.__file__}>"
        linecache.cache[fname] = (len(text), None, text.splitlines(True), fname)
        for fn in compile_methods(text, originals[USW].__globals__, fname):
            fn.__module__, fn.__qualname__ = module.__name__, f"{CLASS}.{fn.__name__}"
            fn.__swa_repro_state__ = target
            setattr(cls, fn.__name__, fn)
    try:
        yield cls
    finally:
        for n, fn in saved.items():
            setattr(cls, n, fn)


def patched(module=None):
    """``with patched():`` the loaded FlashInferIndicesUpdaterPrefill behaves fixed (PR #31501);
    the original methods come back on exit, also on error. Nesting is safe."""
    return _swapped("fixed", module)


def unpatched(module=None):
    """``with unpatched():`` it behaves like sglang <= 0.5.15.post1 (plan without window_left),
    also on releases that have the fix; restored on exit."""
    return _swapped("unfixed", module)
