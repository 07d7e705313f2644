"""Helpers shared by the sglang tests (not a test module)."""

import ast
import difflib
from pathlib import Path

import pytest

from swa_repro.sglang.patch.classify import REL_PATH, classify, method_spans

MEMBER = "sglang/" + REL_PATH.as_posix()


def changed_lines(old, new):
    """Lines of ``old`` replaced/deleted and lines of ``new`` inserted, 1-based."""
    a, b = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(),
                                                       autojunk=False).get_opcodes():
        if tag != "equal":
            a += range(i1 + 1, max(i2, i1 + 1) + 1)
            b += range(j1 + 1, max(j2, j1 + 1) + 1)
    return a, b


def normalized_methods(text):
    """ast dump of the two patched methods with call keywords sorted (order is not behaviour)."""
    s = classify(text)
    out = []
    for fn in (s.usw, s.cbf):
        fn = ast.parse(ast.unparse(fn))
        for n in ast.walk(fn):
            if isinstance(n, ast.Call):
                n.keywords.sort(key=lambda k: k.arg or "")
        out.append(ast.dump(fn))
    return out


def changed_outside_the_methods(old, new):
    """Lines changed outside the two patched methods (``[]``: none), numbered in ``old`` / ``new``."""
    a, b = changed_lines(old, new)
    return [n for lines, text in ((a, old), (b, new)) for n in lines
            if not any(lo <= n <= hi for lo, hi in method_spans(text).values())]


def backend_file(version: str) -> Path:
    """flashinfer_backend.py of sglang==version: the release's overlay (``provision``: installed once
    into the user's cache, shared with every audit, kit run and checkout), read only."""
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang.provision import provision

    try:
        overlay, _ = provision(version, any_release=True)
    except UsageError as e:
        pytest.fail(f"sglang=={version}: {e}")
    return overlay / MEMBER
