"""Helpers shared by the sglang tests (not a test module)."""

import ast
import difflib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from swa_repro.sglang import patch as sp

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "sglang-wheels"
MEMBER = "sglang/" + sp.REL_PATH.as_posix()


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
    s = sp.classify(text)
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
            if not any(lo <= n <= hi for lo, hi in sp.method_spans(text).values())]


def backend_file(version: str) -> Path:
    """flashinfer_backend.py of sglang==version, fetched once and cached."""
    out = CACHE / "src" / version / "flashinfer_backend.py"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64",
             "--disable-pip-version-check", "-q", "-d", str(CACHE), f"sglang=={version}"],
            capture_output=True, text=True, timeout=900)
        wheels = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
        if not wheels:
            pytest.fail(f"pip download sglang=={version} failed:\n"
                        f"{r.stdout[-1500:]}{r.stderr[-1500:]}")
    with zipfile.ZipFile(wheels[0]) as z:
        data = z.read(MEMBER)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out
