"""docs/upstream/pr-*: the fixes as separate PR series against sglang 0.5.23 (issue #40), in a git
checkout of 0.5.23's files: each ``<finding>.diff`` applies alone with ``git apply``; each series
is what the generator makes, ``git am`` applies it alone, every commit ruff-clean and carrying its
fix, the kit piece that fix needs and the test methods it adds (so the kit is never ahead of or
behind the fix: review point 6), and it ends at the fixes and kit edits it names. The CPU run of
the kit after each commit: tests/test_upstream_pr_check.py (``make test-matrix``)."""

from __future__ import annotations

import ast
import os
import subprocess

import pytest
from test_upstream import DOCS, _ruff_clean

from swa_repro.sglang.fix import FIXES, apply_fixes, pr_check, pr_readme, pr_tests, states
from swa_repro.sglang.fix import kit_edits as ke
from swa_repro.sglang.fix import pr_series as ps
from swa_repro.sglang.fix import upstream as up
from swa_repro.sglang.fix.family_fixes import FAMILY_ORDER
from swa_repro.sglang.fix.fixes import ORDER
from swa_repro.sglang.fix.upstream_diff import plus_side


@pytest.fixture(scope="module")
def release():
    """(sglang-package file -> 0.5.23's text, 0.5.23's kit)."""
    return ps.release_texts()


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z",
                               "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"})


@pytest.fixture()
def checkout(release, tmp_path):
    """A clean git repository holding 0.5.23's files the fixes and the kit edits touch, where
    sglang's repository holds them."""
    texts, kit = release
    for rel, t in [*((f"python/sglang/{f}", t) for f, t in texts.items()), *((f"python/{p}", t) for p, t in kit.items())]:
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(t)
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "0.5.23")):
        r = _git(tmp_path, *args)
        assert r.returncode == 0, r.stderr
    return tmp_path


@pytest.mark.parametrize("name", [*ORDER, "all", *FAMILY_ORDER])
def test_each_diff_applies_alone_with_git_apply(checkout, release, name):
    p = DOCS / f"{name}.diff"
    if not p.exists():
        assert name in ("paged_only_window", "soft_cap_cuda_graph", "ragged_prefix_full_layers")
        pytest.skip(f"no diff for {name}: 0.5.23 has it, or it is other diffs together")
    r = _git(checkout, "apply", "--check", str(p))
    assert r.returncode == 0, r.stderr
    if name in FAMILY_ORDER:  # on its own file, ruff-clean (the backend's: tests/test_upstream.py)
        rel, texts = FIXES[name].file, release[0]
        assert p.read_text().startswith(f"--- a/python/sglang/{rel}\n")
        new = plus_side(texts[rel], p.read_text())
        assert new == apply_fixes(texts[rel], (name,), rel) and _ruff_clean(new) is None


def test_every_fix_and_kit_edit_is_in_exactly_one_series(release):
    """Every finding 0.5.23 needs a diff for is one commit of one series; every kit edit is placed,
    whole (kit_swa_cases in its two halves, with the ragged fix each half tests), in a fix's commit;
    no series has a kit-only or test-only commit (the old series' last commit)."""
    texts = release[0]
    need = [n for n in (*ORDER, *FAMILY_ORDER)
            if not FIXES[n].requires and states(texts[FIXES[n].file], (n,), FIXES[n].file)[n].state == "needed"]
    steps = [s for pr in ps.PRS for s in pr.steps]
    assert sorted(s.fix for s in steps) == sorted(need)
    placed = [p for s in steps for p in ps.kit_pieces_known(s.kit)]
    assert len(placed) == len(set(placed)) and {ps.PIECES[p][0] for p in placed} == set(ke.ORDER)
    for edit in ke.ORDER:  # the pieces of an edit cover each of its parts once (a follow-up is no PR's)
        anchored = ke.EDITS[edit][1]
        parts = [ps.PIECES[p][1] for p in placed if ps.PIECES[p][0] == edit]
        for a in anchored:
            assert sum(a.what.startswith(part) for part in parts) == 1, (edit, a.what)
    assert ps.kit_state(release[1], placed) == {**release[1], **ke.edit(release[1])}
    assert [pr.key for pr in ps.PRS] == list("abcde") and len({pr.dir for pr in ps.PRS}) == 5


def test_committed_series_are_regenerated(release):
    """Each pr-*/ folder is what ``pr_series.commits`` makes of 0.5.23's files (messages included), with
    its PR.md; the old stacked series/ is gone."""
    from swa_repro.sglang.fix import series

    texts, kit = release
    assert not (DOCS / "series").exists()
    for pr in ps.PRS:
        cs = ps.commits(pr, texts, kit, lambda n: up.commit_body(texts, n))
        names = [series.patch_name(k, c.slug) for k, c in enumerate(cs, 1)]
        d = DOCS / pr.dir
        assert (d / "series").read_text().split() == names
        for k, (name, c) in enumerate(zip(names, cs), 1):
            assert (d / name).read_text() == series.patch_text(c, k, len(cs)), \
                f"{pr.dir}/{name} is stale: run python -m swa_repro.sglang.fix.upstream"
        assert sorted(p.name for p in d.glob("*.patch")) == names
        assert (d / "PR.md").read_text() == ps.pr_description(pr, cs)


@pytest.mark.parametrize("pr", ps.PRS, ids=lambda pr: pr.dir)
def test_series_applies_alone_with_git_am_each_commit_with_its_kit_and_test(checkout, release, pr):
    texts, kit = release
    names = (DOCS / pr.dir / "series").read_text().split()
    assert len(names) == len(pr.steps)
    for k, (name, step) in enumerate(zip(names, pr.steps), 1):
        r = _git(checkout, "am", "-q", "--keep-non-patch", str(DOCS / pr.dir / name))
        assert r.returncode == 0, f"{pr.dir}/{name} does not apply on the {k - 1} before it: {r.stderr}"
        touched = set(_git(checkout, "show", "--name-only", "--format=", "HEAD").stdout.split())
        want = {f"python/sglang/{FIXES[step.fix].file}"}
        want |= {f"python/{ke.EDITS[ps.PIECES[p][0]][0]}" for p in ps.kit_pieces_known(step.kit)}
        if step.tests or step.sm100:
            want.add(ps.test_path(pr))
        assert touched == want, (name, touched)  # its fix, its kit piece and its test: nothing later, nothing else
        for path in touched:
            assert _ruff_clean((checkout / path).read_text()) is None, f"after {name} {path} is not ruff-clean"
        state = ps.state(pr, k, texts, kit)
        assert {p: (checkout / p).read_text() for p in state} == state
    fixes = tuple(s.fix for s in pr.steps)
    for f in {FIXES[n].file for n in fixes}:  # the end: the series' fixes, nothing of another series
        assert (checkout / "python" / "sglang" / f).read_text() == apply_fixes(texts[f], fixes, f)
    edited = ps.kit_state(kit, ps.pieces(pr))
    assert {p: (checkout / "python" / p).read_text() for p in kit} == edited
    log = _git(checkout, "log", "--format=%s", f"-{len(names)}").stdout.splitlines()[::-1]
    assert log == [ps_subject(s.fix) for s in pr.steps]


def ps_subject(fix: str) -> str:
    from swa_repro.sglang.fix.series import SUBJECTS

    return SUBJECTS[fix]


@pytest.mark.parametrize("pr", [pr for pr in ps.PRS if pr.key != "e"], ids=lambda pr: pr.dir)
def test_each_series_test_is_registered_as_sglangs_with_an_honest_est_time(release, pr):
    """The test at the series' end holds exactly its steps' methods (and the kit precondition), is
    registered as sglang's attention tests are (stage + runner_config, ci_register's rule), on
    the B200 runner where the series has the sm100 change, with est_time the recorded seconds per
    test method times its GPU methods."""
    text = ps.state(pr, len(pr.steps), *release)[ps.test_path(pr)]
    tree = ast.parse(text)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    methods = [n.name for n in cls.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    added = [m for s in pr.steps for m in s.tests]
    assert sorted(methods) == sorted([*added, *(["test_kit_cases_and_expectations"] if pr.precondition else [])])
    assert pr.precondition == (pr.key != "b")  # the window PRs; the cap's cases need no key outside the window
    regs = [{k.arg: ast.literal_eval(k.value) for k in n.value.keywords} for n in tree.body
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and n.value.func.id == "register_cuda_ci"]
    runners = ["1-gpu-large", *(["1-gpu-b200"] if any(s.sm100 for s in pr.steps) else [])]
    assert [r["runner_config"] for r in regs] == runners and all(r["stage"] == "base-b" for r in regs)
    rate = pr_tests.seconds_per_test()
    assert 15 < rate < 60  # the recorded H100/H200 runs: ~20 s per method, JIT builds included
    gpu = sum(pr_tests.METHODS[m].gpu for m in added)
    assert all(gpu * rate <= r["est_time"] < gpu * rate + 5 for r in regs), (regs, gpu, rate)
    assert "swa_repro" not in text and _ruff_clean(text) is None


def test_est_time_reads_the_recorded_runs(tmp_path, monkeypatch):
    """The estimate comes from the recorded logs' ``Ran N tests in Xs`` lines, the slowest rate; none
    there is an error, not a guess."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "regress.log").write_text("Ran 4 tests in 1.3s\nRan 10 tests in 300.0s\nRan 20 tests in 200s\n")
    monkeypatch.setattr(pr_tests, "LIVE", tmp_path)
    monkeypatch.setattr(pr_tests, "TIMINGS", ("x/regress.log",))
    assert pr_tests.seconds_per_test() == 30.0
    assert pr_tests.est_time(("test_ragged_no_prefix_window", "test_dflash_expectation")) == 30
    (tmp_path / "x" / "regress.log").write_text("nothing\n")
    with pytest.raises(LookupError, match="cannot estimate"):
        pr_tests.seconds_per_test()


def test_a_commit_adds_the_sm100_registration_only_with_the_sm100_fix(release):
    pr = ps.PRS[0]
    k = next(k for k, s in enumerate(pr.steps, 1) if s.fix == "sm100_no_cutlass_window")
    before, after = (ps.state(pr, j, *release)[ps.test_path(pr)] for j in (k - 1, k))
    assert "1-gpu-b200" not in before and 'runner_config="1-gpu-b200"' in after


def test_patch_files_and_apply_patch_keep_the_overlay(tmp_path, release):
    """pr_check's applier: a patch's files as (new?, diff); applied on a hard-linked copy, the
    original file keeps its text (a new inode), a new file is created, and ``keep`` limits it."""
    pr = ps.PRS[2]  # DFlash: the backend, the kit's verify runner and a new test
    patch = (DOCS / pr.dir / "0001-dflash-verify-window.patch").read_text()
    files = pr_check.patch_files(patch)
    assert [new for new, _ in files.values()] == [False, False, True] and ps.test_path(pr) in files
    texts, kit = release
    src = tmp_path / "src"
    for rel, t in [*((f"sglang/{f}", t) for f, t in texts.items()), *kit.items()]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(t)
    site = pr_check.copy_overlay(src, tmp_path / "c" / "site")
    assert pr_check.apply_patch(site, patch, lambda p: not p.startswith("python/sglang/srt/")) == [
        f"python/{ke.VERIFY}", ps.test_path(pr)]
    assert (site / "sglang" / FIXES["dflash_verify_window"].file).read_text() == texts[FIXES["dflash_verify_window"].file]
    pr_check.apply_patch(site, patch, lambda p: p.startswith("python/sglang/srt/"))
    state = ps.state(pr, 1, texts, kit)
    for path, text in state.items():
        assert pr_check.site_path(site, path).read_text() == text
    assert (src / ke.VERIFY).read_text() == kit[ke.VERIFY]  # the hard-linked original is untouched


def test_verdict_flags_a_failing_case_a_test_that_passes_without_its_fix_and_ruff():
    pr = ps.PRS[2]
    ok = {"after": {pr.test: {"tests": {"test_dflash_verify_window": "pass"}, "subtests": {}}},
          "before": {pr.test: {"tests": {"test_dflash_verify_window": "fail: x", "test_dflash_expectation": "fail: y"},
                               "subtests": {}}}, "ruff": []}
    assert pr_check.verdict(pr, 1, ok) == ""
    bad = {**ok, "ruff": ["a.py"], "after": {pr.test: {"tests": {"t": "fail: z"}, "subtests": {}}},
           "before": {pr.test: {"tests": {"test_dflash_verify_window": "pass"}, "subtests": {}}}}
    v = pr_check.verdict(pr, 1, bad)
    assert "ruff format rewrites a.py" in v and "1 failing" in v and "(test nothing): test_dflash_verify_window" in v


def test_pr_check_refuses_an_unknown_series_in_one_line(capsys):
    assert pr_check.main(["--series", "z"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert pr_check.main(["--series", "a", "--record"]) == 2


def test_readme_lists_each_pr_and_answers_each_review_point():
    md = (DOCS / "README.md").read_text()
    for pr in ps.PRS:
        assert f"[`{pr.dir}`]({pr.dir}/PR.md)" in md and (DOCS / pr.dir / "PR.md").is_file()
    review = md.split("## Review response (issue #40)", 1)[1].split("\n## ", 1)[0]
    points, _, rest = review.strip().partition("\n\n")  # the six points, then the non-blocking answers
    assert [ln.split(".", 1)[0] for ln in points.splitlines()] == [str(k) for k in range(1, 7)]
    assert rest.startswith("Non-blocking, `UNO_VERIFY` and the window gate: `UNO_VERIFY` is not listed on purpose")
    assert md.split("### Bisect check on a CPU", 1)[1].split("\n## ", 1)[0].strip() == "\n".join(
        pr_readme.bisect_lines(DOCS)[3:]).strip()  # as recorded for these patches, or saying it is not
    families = (DOCS / "families.md").read_text()
    assert "in `pr-a-ragged-window/0003-sm100-no-cutlass-window.patch`" in families
    assert "in `pr-e-cohere2-window/0001-commandr-window-hook.patch`" in families


def test_family_commit_messages_cite_the_upstream_threads(release):
    from swa_repro.sglang.fix.upstream_refs import REFS

    texts = release[0]
    for name in ("commandr_window_hook", "sm100_no_cutlass_window"):
        body = " ".join(up.commit_body(texts, name).split())
        assert REFS[name] and all(f"{r.repo}#{r.number}" in body for r in REFS[name])
        assert "swa-repro" not in body and "swa_repro" not in body  # no tool advertised (issue #40)


def test_record_rewrites_only_the_readmes_bisect_section_and_a_stale_record_says_so(tmp_path):
    """``pr_check --record``: pr-check.json with the patches' digest and README's bisect table from it,
    the rest of the README unchanged; patches changed after it make the README say it is stale."""
    import shutil

    for pr in ps.PRS:
        shutil.copytree(DOCS / pr.dir, tmp_path / pr.dir)
    (tmp_path / "README.md").write_text("# x\n\n### Bisect check on a CPU\n\nold\n\n## Review response (issue #40)\n\nkept\n")
    row = {"commit": "0001-a.patch", "touched": ["a", "b"], "verdict": "ok", "ruff": [],
           "after": {"t.py": {"tests": {"x": "pass"}, "subtests": {"x[a]": "pass", "x[b]": "pass"}}},
           "before": {"t.py": {"tests": {"x": "fail: y"}, "subtests": {}}}}
    pr_readme.record(tmp_path, {"pr-a-ragged-window": [row]}, "abc1234", "2026-12-06")
    md = (tmp_path / "README.md").read_text()
    assert md.startswith("# x\n\n### Bisect check on a CPU\n\n`python -m") and md.endswith(
        "\n## Review response (issue #40)\n\nkept\n") and "old" not in md
    assert "| `pr-a-ragged-window` | `0001-a.patch` | 2 files | 2 cases | 1 failing | ok |" in md
    (tmp_path / "pr-c-dflash-window" / "series").write_text("")
    assert "from other patches than these" in "\n".join(pr_readme.bisect_lines(tmp_path))


def test_no_commit_advertises_a_tool_and_the_author_is_neutral_or_the_senders(release, monkeypatch):
    """Issue #40 (non-blocking): no "found with swa-repro" line, no placeholder tool author; the sender
    sets the author (``SWA_REPRO_PATCH_AUTHOR``); a malformed one is one line (UsageError)."""
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang.fix import series

    texts = release[0]
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
