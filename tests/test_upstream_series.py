"""docs/upstream/series, the PR against sglang 0.5.23, in a git checkout of 0.5.23's files: each
``<finding>.diff`` (the backend's plan-time findings and the family- and GPU-class-level ones of
families.md) applies alone with ``git apply`` and is ruff-clean; the series is what the generator
makes, ``git am`` stacks it, every file ruff-clean after every commit, and it ends at the files
``swa-repro patch apply`` makes (``--fix all`` on the backend, ``--fix commandr_window_hook`` on
commandr.py)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from test_upstream import DOCS, _ruff_clean

from swa_repro.cli import main
from swa_repro.sglang.fix import ALL, BACKEND, FAMILY_ORDER, FIXES, ORDER, apply_fixes, states
from swa_repro.sglang.fix import series
from swa_repro.sglang.fix import upstream as up
from swa_repro.sglang.fix.family_fixes import COMMANDR

FILES = (BACKEND, COMMANDR)  # every file a fix of the series edits, under the sglang package


@pytest.fixture(scope="module")
def texts():
    """sglang-package file -> 0.5.23's text, from the provisioned overlay."""
    from conftest import release_overlay

    overlay = release_overlay(up.VERSION)
    return {f: (overlay / "sglang" / f).read_text() for f in FILES}


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z",
                               "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"})


@pytest.fixture()
def checkout(texts, tmp_path):
    """A git repository holding 0.5.23's files the fixes edit and its attention kit, where sglang's
    repository holds them."""
    from swa_repro.sglang.fix import kit_edits
    from swa_repro.sglang.provision import provision

    for rel, t in texts.items():
        f = tmp_path / "python" / "sglang" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(t)
    for rel in kit_edits.FILES:  # the attention kit the last commit edits, as 0.5.23 ships it
        kit = tmp_path / "python" / rel
        kit.parent.mkdir(parents=True, exist_ok=True)
        kit.write_text((provision(up.VERSION)[0] / rel).read_text())
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "0.5.23")):
        r = _git(tmp_path, *args)
        assert r.returncode == 0, r.stderr
    return tmp_path


def test_the_series_has_the_fixes_0_5_23_needs(texts):
    """Read from 0.5.23's code: the family fixes it needs are in, the one it has is not."""
    names = series.fix_names(texts)
    assert [n for n in names if n in FAMILY_ORDER] == ["commandr_window_hook", "sm100_no_cutlass_window"]
    assert states(texts[BACKEND], ("ragged_prefix_full_layers",))["ragged_prefix_full_layers"].state == "applied"
    assert names[:len(names) - 2] == tuple(n for n in ORDER if n not in ("paged_only_window", "soft_cap_cuda_graph"))
    md = (DOCS / "README.md").read_text() + (DOCS / "families.md").read_text()
    assert "Not in it: `ragged_prefix_full_layers`" in md and "no diff, and not in `series/`" in md


@pytest.mark.parametrize("name", [*ORDER, "all", *FAMILY_ORDER])
def test_each_diff_applies_alone_with_git_apply(checkout, texts, name):
    p = DOCS / f"{name}.diff"
    if not p.exists():
        assert name in ("paged_only_window", "soft_cap_cuda_graph", "ragged_prefix_full_layers")
        pytest.skip(f"no diff for {name}: 0.5.23 has it, or it is other diffs together")
    r = _git(checkout, "apply", "--check", str(p))
    assert r.returncode == 0, r.stderr
    if name in FAMILY_ORDER:  # on its own file, ruff-clean (the backend's: tests/test_upstream.py)
        rel = FIXES[name].file
        assert p.read_text().startswith(f"--- a/python/sglang/{rel}\n")
        new = up.plus_side(texts[rel], p.read_text())
        assert new == apply_fixes(texts[rel], (name,), rel) and _ruff_clean(new) is None


def test_committed_series_is_regenerated(texts):
    """The fix commits are what ``series.fix_commits`` makes of 0.5.23's files (messages included),
    the last the kit's changes and the regression test (``up.test_commit``)."""
    commits = series.fix_commits(texts, up.unified, lambda n: up.commit_body(texts, n)) + [up.test_commit(DOCS)]
    names = [series.patch_name(k, c.slug) for k, c in enumerate(commits, 1)]
    assert (DOCS / "series" / "series").read_text().split() == names
    for k, (name, c) in enumerate(zip(names, commits), 1):
        assert (DOCS / "series" / name).read_text() == series.patch_text(c, k, len(commits)), \
            f"{name} is stale: run python -m swa_repro.sglang.fix.upstream"
    assert sorted(p.name for p in (DOCS / "series").glob("*.patch")) == names


def _patch_apply(tmp_path, rel: str, text: str, fixes: str) -> str:
    """``swa-repro patch apply --fix FIXES`` on a copy of ``rel``'s text: the file it writes."""
    src, out = tmp_path / f"src-{rel.replace('/', '_')}", tmp_path / f"out-{rel.replace('/', '_')}"
    src.write_text(text)
    assert main(["patch", "apply", "--fix", fixes, "--source", str(src), "--out", str(out)]) == 0
    return out.read_text()


def test_series_applies_stacked_with_git_am_and_ends_at_patch_fix(checkout, texts, tmp_path):
    series_dir = DOCS / "series"
    names = (series_dir / "series").read_text().split()
    fixes = series.fix_names(texts)
    assert names == sorted(names) and len(names) == len(fixes) + 1
    files = {rel: checkout / "python" / "sglang" / rel for rel in FILES}
    for k, name in enumerate(names, 1):
        r = _git(checkout, "am", "-q", "--keep-non-patch", str(series_dir / name))
        assert r.returncode == 0, f"{name} does not apply on top of the {k - 1} before it: {r.stderr}"
        for rel, f in files.items():
            assert _ruff_clean(f.read_text()) is None, f"after {name} {rel} is not ruff-clean"
        if k <= len(fixes):  # a fix commit edits the one file its fix names
            touched = _git(checkout, "show", "--name-only", "--format=", "HEAD").stdout.split()
            assert touched == [f"python/sglang/{FIXES[fixes[k - 1]].file}"], (name, touched)
    backend, commandr = files[BACKEND].read_text(), files[COMMANDR].read_text()
    # the backend: all.diff's file plus the family fixes of the backend, what `patch apply --fix all` makes
    assert backend == _patch_apply(tmp_path, BACKEND, texts[BACKEND], "all") == apply_fixes(texts[BACKEND], ALL)
    assert apply_fixes(texts[BACKEND], ORDER) == up.plus_side(texts[BACKEND], (DOCS / "all.diff").read_text())
    assert backend == apply_fixes(apply_fixes(texts[BACKEND], ORDER), ("sm100_no_cutlass_window",))
    # commandr.py: the one commit of it is commandr_window_hook.diff, and `patch apply --fix commandr_window_hook`
    assert commandr == _patch_apply(tmp_path, COMMANDR, texts[COMMANDR], "commandr_window_hook")
    assert commandr == up.plus_side(texts[COMMANDR], (DOCS / "commandr_window_hook.diff").read_text()) != texts[COMMANDR]
    log = _git(checkout, "log", "--format=%s", f"-{len(names)}").stdout.splitlines()[::-1]
    assert all(re.match(r"\[(FlashInfer|Model)\] ", s) for s in log) and len(set(log)) == len(names)
    assert log[fixes.index("commandr_window_hook")] == series.SUBJECTS["commandr_window_hook"]
    # the last commit adds the regression test where sglang keeps its attention tests
    assert (checkout / up.TEST).read_text() == (DOCS / up.TEST).read_text()
    from swa_repro.sglang.fix import kit_edits

    touched = set(_git(checkout, "show", "--name-only", "--format=", "HEAD").stdout.split())
    assert "test" in log[-1] and touched == {up.TEST, *(f"python/{rel}" for rel in kit_edits.FILES)}


def test_family_commit_messages_cite_the_upstream_threads(texts):
    from swa_repro.sglang.fix.upstream_refs import REFS

    for name in ("commandr_window_hook", "sm100_no_cutlass_window"):
        body = " ".join(up.commit_body(texts, name).split())
        assert REFS[name] and all(f"{r.repo}#{r.number}" in body for r in REFS[name])
        assert "swa-repro" not in body and "swa_repro" not in body  # no tool advertised (issue #40)


def test_no_commit_advertises_a_tool_and_the_author_is_neutral_or_the_senders(texts, monkeypatch):
    """Issue #40 (non-blocking): no "found with swa-repro" line, no placeholder tool author; the sender
    sets the author (``SWA_REPRO_PATCH_AUTHOR``); a malformed one is one line (UsageError)."""
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang.fix import series

    for name in series.fix_names(texts):
        assert "swa-repro" not in up.commit_body(texts, name).lower(), name
    c = series.Commit("x", "[FlashInfer] x", "body", "")
    monkeypatch.delenv(series.AUTHOR_ENV, raising=False)
    assert "swa-repro" not in series.patch_text(c, 1, 1).split("\n")[1].lower()
    monkeypatch.setenv(series.AUTHOR_ENV, "Ada Lovelace <ada@example.org>")
    assert series.patch_text(c, 1, 1).split("\n")[1] == "From: Ada Lovelace <ada@example.org>"
    monkeypatch.setenv(series.AUTHOR_ENV, "nobody")
    with pytest.raises(UsageError, match="is not 'Name <email>'"):
        series.patch_text(c, 1, 1)
