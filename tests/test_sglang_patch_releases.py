"""`swa-repro patch` on the real flashinfer_backend.py of released sglang wheels.

Releases come from PyPI (`difftools.backend_file`: the release's overlay in the user's cache, shared
with the audits, kept between runs); only srt/layers/attention/flashinfer_backend.py is read.

Pre-fix structures covered: 0.4.10 (wrapper 0 always paged, begin_forward with 8 positional +
4 keywords, no kwargs dict), 0.5.5 and 0.5.10 (multi-item scoring keywords; 0.5.10 adds the
piecewise-CUDA-graph padding), 0.5.15.post1 (ragged/paged-only split of wrapper 0, begin_forward
with ``**paged_plan_kwargs``). Post-fix: 0.5.16 (PR #31501), 0.5.19, 0.5.23 (``plan=`` keyword
after ``window_left``, kw-only parameters after it in the signature).
"""

from __future__ import annotations

import pytest

from swa_repro.cli import main
from swa_repro.sglang.patch.classify import classify
from swa_repro.sglang.patch.edit import transform
from swa_repro.sglang.patch.stubs import plan_window_lefts
from difftools import backend_file, changed_lines, changed_outside_the_methods, normalized_methods  # tests/difftools.py

pytestmark = pytest.mark.network

PRE_FIX = ["0.4.10", "0.5.5", "0.5.10", "0.5.15.post1"]
POST_FIX = ["0.5.16", "0.5.19", "0.5.23"]

def assert_only_the_two_methods_change(old, new):
    assert changed_lines(old, new) != ([], [])
    outside = changed_outside_the_methods(old, new)
    assert not outside, f"lines changed outside the two methods: {outside[:5]}"


def status(path, capsys):
    assert main(["patch", "status", "--source", str(path)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("version", PRE_FIX)
def test_pre_fix_release(version, tmp_path, capsys):
    path = backend_file(version)
    original = path.read_bytes()
    text = original.decode()
    assert status(path, capsys) == "unfixed\n"
    fixed = transform(text, "fixed")
    assert classify(fixed).state == "fixed"
    compile(fixed, f"{version}-patched", "exec")
    assert transform(fixed, "unfixed").encode() == original  # byte-exact way back
    assert_only_the_two_methods_change(text, fixed)
    # behaviour on stubs: only the paged-only plan of wrapper 0 gets the window
    assert plan_window_lefts(text, window=128) == {0: None, 1: None}
    assert plan_window_lefts(fixed, window=128) == {0: 128, 1: None}
    assert plan_window_lefts(fixed, window=128, use_ragged=True) == {0: None, 1: None}
    out = tmp_path / "patched.py"
    assert main(["patch", "apply", "--source", str(path), "--out", str(out)]) == 0
    assert out.read_text() == fixed and path.read_bytes() == original


@pytest.mark.parametrize("version", POST_FIX)
def test_post_fix_release(version, tmp_path, capsys):
    path = backend_file(version)
    original = path.read_bytes()
    text = original.decode()
    assert status(path, capsys) == "fixed\n"
    unfixed = transform(text, "unfixed")
    assert classify(unfixed).state == "unfixed"
    compile(unfixed, f"{version}-unfixed", "exec")
    assert_only_the_two_methods_change(text, unfixed)
    refixed = transform(unfixed, "fixed")
    assert transform(refixed, "unfixed") == unfixed  # byte-exact way back
    assert normalized_methods(refixed) == normalized_methods(text)  # the upstream fix again
    assert plan_window_lefts(text, window=128) == {0: 128, 1: None}
    assert plan_window_lefts(text, window=128, use_ragged=True) == {0: None, 1: None}
    assert plan_window_lefts(unfixed, window=128) == {0: None, 1: None}
    out = tmp_path / "unfixed.py"
    assert main(["patch", "apply", "--reverse", "--source", str(path), "--out", str(out)]) == 0
    assert out.read_text() == unfixed and path.read_bytes() == original
    assert main(["patch", "apply", "--source", str(path), "--out", str(tmp_path / "again.py")]) == 0  # already
    assert "already fixed" in capsys.readouterr().err
