"""`swa-repro patch` on the real flashinfer_backend.py of released sglang wheels.

Wheels come from PyPI (`pip download --no-deps`) into .cache/sglang-wheels/ (kept between runs);
only srt/layers/attention/flashinfer_backend.py is read out of each.

Pre-fix structures covered: 0.4.10 (wrapper 0 always paged, begin_forward with 8 positional +
4 keywords, no kwargs dict), 0.5.5 and 0.5.10 (multi-item scoring keywords; 0.5.10 adds the
piecewise-CUDA-graph padding), 0.5.15.post1 (ragged/paged-only split of wrapper 0, begin_forward
with ``**paged_plan_kwargs``). Post-fix: 0.5.16 (PR #31501), 0.5.19, 0.5.23 (``plan=`` keyword
after ``window_left``, kw-only parameters after it in the signature).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from swa_repro.sglang import patch as sp
from swa_repro.cli import main
from difftools import changed_lines  # tests/difftools.py

pytestmark = pytest.mark.network

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "sglang-wheels"
PRE_FIX = ["0.4.10", "0.5.5", "0.5.10", "0.5.15.post1"]
POST_FIX = ["0.5.16", "0.5.19", "0.5.23"]
MEMBER = "sglang/" + sp.REL_PATH.as_posix()


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


def assert_only_the_two_methods_change(old, new):
    a, b = changed_lines(old, new)
    assert a and b
    for lines, spans in ((a, sp.method_spans(old)), (b, sp.method_spans(new))):
        outside = [n for n in lines if not any(lo <= n <= hi for lo, hi in spans.values())]
        assert not outside, f"lines changed outside {sorted(spans)}: {outside[:5]}"


def normalized_methods(text):
    """ast dump of the two methods with call keywords sorted (order is not behaviour)."""
    s = sp.classify(text)
    out = []
    for fn in (s.usw, s.cbf):
        fn = ast.parse(ast.unparse(fn))
        for n in ast.walk(fn):
            if isinstance(n, ast.Call):
                n.keywords.sort(key=lambda k: k.arg or "")
        out.append(ast.dump(fn))
    return out


def status(path, capsys):
    assert main(["patch", "status", "--source", str(path)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("version", PRE_FIX)
def test_pre_fix_release(version, tmp_path, capsys):
    path = backend_file(version)
    original = path.read_bytes()
    text = original.decode()
    assert status(path, capsys) == "unfixed\n"
    fixed = sp.transform(text, "fixed")
    assert sp.classify(fixed).state == "fixed"
    compile(fixed, f"{version}-patched", "exec")
    assert sp.transform(fixed, "unfixed").encode() == original  # byte-exact way back
    assert_only_the_two_methods_change(text, fixed)
    # behaviour on stubs: only the paged-only plan of wrapper 0 gets the window
    assert sp.plan_window_lefts(text, window=128) == {0: None, 1: None}
    assert sp.plan_window_lefts(fixed, window=128) == {0: 128, 1: None}
    assert sp.plan_window_lefts(fixed, window=128, use_ragged=True) == {0: None, 1: None}
    out = tmp_path / "patched.py"
    assert main(["patch", "apply", "--source", str(path), "--out", str(out)]) == 0
    assert out.read_text() == fixed and path.read_bytes() == original


@pytest.mark.parametrize("version", POST_FIX)
def test_post_fix_release(version, tmp_path, capsys):
    path = backend_file(version)
    original = path.read_bytes()
    text = original.decode()
    assert status(path, capsys) == "fixed\n"
    unfixed = sp.transform(text, "unfixed")
    assert sp.classify(unfixed).state == "unfixed"
    compile(unfixed, f"{version}-unfixed", "exec")
    assert_only_the_two_methods_change(text, unfixed)
    refixed = sp.transform(unfixed, "fixed")
    assert sp.transform(refixed, "unfixed") == unfixed  # byte-exact way back
    assert normalized_methods(refixed) == normalized_methods(text)  # the upstream fix again
    assert sp.plan_window_lefts(text, window=128) == {0: 128, 1: None}
    assert sp.plan_window_lefts(text, window=128, use_ragged=True) == {0: None, 1: None}
    assert sp.plan_window_lefts(unfixed, window=128) == {0: None, 1: None}
    out = tmp_path / "unfixed.py"
    assert main(["patch", "apply", "--reverse", "--source", str(path), "--out", str(out)]) == 0
    assert out.read_text() == unfixed and path.read_bytes() == original
    assert main(["patch", "apply", "--source", str(path), "--out", str(out)]) == 0  # already
    assert "already fixed" in capsys.readouterr().err
