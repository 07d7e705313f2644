"""Issue 43 class D: bad input that was accepted is one line on stderr, exit 2, no traceback, and no work.

Each case ran before (an empty ``--model ""`` or ``--gpu ""`` fell back to the default with
``--vllm``, a repeated family or release was audited twice, a flag the mode never reads was
dropped, ``--sglang ""`` audited the installed sglang, a release number that is no release started
the installer or a notebook, a fix that changes nothing was audited as a "FIXED COPY"). Here every
unit of work (the installers, the children, the table builders, the notebooks) fails the test if
called, and the cache (``SWA_REPRO_CACHE``, a fresh folder) and the output folders must not exist
afterwards. Runs in-process through ``cli.main``; ``capfd`` sees whatever any layer prints.
"""

from __future__ import annotations

import pytest
from conftest import never, release_overlay

from swa_repro.cli import main


@pytest.fixture
def nothing_runs(monkeypatch, tmp_path):
    """Every installer, child, table builder and notebook fails the test; the cache is a fresh,
    absent folder. -> tmp_path (``tmp_path / "cache"`` must still not exist after the command)."""
    from swa_repro.evidence import bundle, fuzz, sglang_bundle, vllm_bundle
    from swa_repro.kernel import live
    from swa_repro.notebook import runner
    from swa_repro.sglang import check, kit, overlay_run, provision
    from swa_repro.sglang.audit import cli as scli
    from swa_repro.sglang.audit import family_run, family_table, release
    from swa_repro.sglang.audit import table as at
    from swa_repro.vllm import provision as vp
    from swa_repro.vllm.audit import core as va
    from swa_repro.vllm.audit import table as vt

    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "cache"))
    for mod, name in ((provision, "provision"), (overlay_run, "run_child"), (release, "run_child"),
                      (family_run, "run_child"), (family_run, "audit_families"), (scli, "_one"),
                      (at, "build_table"), (family_table, "build"), (vp, "provision"), (va, "run_release"),
                      (va, "run_live"), (vt, "build"), (runner, "run_all"), (runner, "ensure_kernel"),
                      (check, "run_matrix"), (kit, "installed_doc"), (fuzz, "_live"), (fuzz, "_replay"),
                      (live, "require_cuda"), (sglang_bundle, "build_sglang_bundle"),
                      (vllm_bundle, "build_vllm_bundle"), (bundle, "build_bundle")):
        monkeypatch.setattr(mod, name, never)
    return tmp_path


def one_line_exit_2(capfd, argv, must: str) -> str:
    capfd.readouterr()
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (argv, rc, err[-2000:])
    assert lines[0].startswith(f"swa-repro {argv[0]}: error:") and must in lines[0], (argv, lines[0])
    return lines[0]


OUT = "<tmp>/out"  # a folder the command must not create

CASES = [
    # an empty path flag read as the current folder (Path("") is "."): the table, the notebooks wrote there
    (["audit", "--release-table", "--out", ""], "argument --out: is empty"),
    (["run", "00", "--output", ""], "argument --output: is empty"),
    # a fix named twice ran once, silently
    (["patch", "status", "--fix", "paged_only_window,paged_only_window"], "--fix names paged_only_window more than once"),
    # --vllm took what sglang's path refuses: an empty family or GPU class fell back to the default
    (["audit", "--vllm", "0.34.0", "--model", ""], "--model selects no family"),
    (["audit", "--vllm", "0.34.0", "--gpu", ""], "--gpu selects no GPU class"),
    (["audit", "--release-table", "--vllm", "0.34.0", "--gpu", "", "--out", OUT], "--gpu selects no GPU class"),
    (["audit", "--release-table", "--model", "all", "--gpu", "", "--out", OUT], "--gpu selects no GPU class"),
    # ... sglang's what-ifs, its table's --releases/--jobs, the table's --out, a removed flag
    (["audit", "--vllm", "0.34.0", "--patched"], "with --vllm, audit the fix with --fix cap-route"),
    (["audit", "--vllm", "0.34.0", "--both"], "with --vllm, audit the fix with --fix cap-route"),
    (["audit", "--vllm", "0.34.0", "--out", OUT], "--out goes with --release-table"),
    (["audit", "--release-table", "--vllm", "0.34.0", "--releases", "0.5.23", "--out", OUT],
     "--releases and --jobs are sglang's --release-table"),
    (["audit", "--release-table", "--vllm", "0.34.0", "--jobs", "2", "--out", OUT],
     "--releases and --jobs are sglang's --release-table"),
    (["audit", "--vllm", "0.34.0", "--sglang-source", "x.py"], "--sglang-source was removed"),
    (["audit", "--release-table", "--vllm", "0.34.0", "--paths", "decode", "--out", OUT], "drop --paths"),
    (["audit", "--vllm", "0.34.0", "--fix", "cap-route", "--diff", "--model", "cohere2"], "--diff alone"),
    (["audit", "--release-table", "--vllm", "0.34.0", "--fix", "cap-route", "--diff", "--out", OUT], "--diff alone"),
    # a repeated family, GPU class or release was audited and printed twice (both projects)
    (["audit", "--vllm", "0.34.0", "--model", "gemma2,gemma2"], "--model names gemma2 more than once"),
    (["audit", "--vllm", "0.34.0", "--gpu", "sm90,sm100,sm90"], "--gpu names sm90 more than once"),
    (["audit", "--sglang", "0.5.23", "--model", "gemma2,cohere2,gemma2"], "--model names gemma2 more than once"),
    (["audit", "--release-table", "--model", "all", "--gpu", "sm90,sm90", "--out", OUT], "--gpu names sm90"),
    (["audit", "--release-table", "--releases", "0.5.23,0.5.23", "--out", OUT], "--releases names 0.5.23"),
    (["audit", "--release-table", "--vllm", "0.34.0,0.34.0", "--out", OUT], "--vllm names 0.34.0"),
    (["audit", "--sglang", "0.5.23", "--model", "all,gemma2"], "give all alone"),
    # sglang's own path: --sglang "" audited the installed sglang; flags of the table outside it
    (["audit", "--sglang", ""], "give a release number"),
    (["audit", "--sglang", "0.5.15.post2"], "the nearest are 0.5.15.post1 and 0.5.16"),
    (["audit", "--sglang", "0.5.22.post1", "--model", "gemma2"], "the nearest are 0.5.22 and 0.5.23"),
    (["audit", "--out", OUT], "--out goes with --release-table"),
    (["audit", "--releases", "0.5.23"], "--releases goes with --release-table"),
    (["audit", "--jobs", "2"], "--jobs goes with --release-table"),
    (["audit", "--release-table", "--json", "--out", OUT], "drop --json, --mode and --live-budget"),
    (["audit", "--release-table", "--mode", "model", "--out", OUT], "drop --json, --mode and --live-budget"),
    # doctor: --gpu "" read as "this GPU's class"
    (["doctor", "--model", "gemma2", "--gpu", ""], "--gpu '': give sm80, sm90 or sm100"),
    # run -p: a release number in range that is no release started the notebook
    (["run", "07", "-p", "sglang_release=0.5.15.post2", "--output", OUT], "the nearest are 0.5.15.post1 and 0.5.16"),
    (["run", "03", "-p", "sglang_release=0.5.10.post2", "--output", OUT], "the nearest are 0.5.10.post1 and 0.5.11"),
    # sglang-check: --sglang "" ran the installed release; a repeated case; --kit-only's "" flags
    (["sglang-check", "--sglang", ""], "--sglang/--fix go with --kit-only"),
    (["sglang-check", "--kit-only", "--sglang", ""], "give a release number"),
    (["sglang-check", "--kit-only", "--sglang", "0.5.15.post2"], "the nearest are 0.5.15.post1 and 0.5.16"),
    (["sglang-check", "--kit-only", "--cases", ""], "--kit-only runs sglang's kit alone"),
    (["sglang-check", "--cases", "upstream_no_prefix_6_8_12,upstream_no_prefix_6_8_12"], "more than once"),
    # fuzz: a repeated backend was drawn twice as often; flags the mode never reads; "" paths
    (["fuzz", "--mode", "selftest", "--backends", "fa2,fa3,fa2", "--out", OUT], "--backends names fa2 more than once"),
    (["fuzz", "--mode", "selftest", "--head-dims", "64,64", "--out", OUT], "--head-dims names 64 more than once"),
    (["fuzz", "--mode", "model", "--out", OUT], "--out: --mode model replays the recordings"),
    (["fuzz", "--mode", "model", "--budget-s", "60"], "--budget-s: --mode model replays"),
    (["fuzz", "--mode", "selftest", "--recordings", OUT], "--recordings goes with --mode model"),
    (["fuzz", "--mode", "selftest", "--out", ""], "--out '': name a path"),
    (["fuzz", "--mode", "model", "--report", ""], "--report '': name a path"),
    # record: --out "" wrote the recordings into the current folder
    (["record", "--out", "", "--cases", "seed_bug"], "--out '': name a folder"),
    # --force with no output it could apply to was accepted and did nothing
    (["record", "--list", "--force"], "--force goes with --out"),
    (["fuzz", "--mode", "selftest", "--force"], "--force goes with --out or --report"),
    (["fuzz", "--mode", "model", "--force"], "--force goes with --out or --report"),
    (["replay", "x.pt", "--force"], "--force goes with --out FILE"),
    (["sglang-check", "--mode", "model", "--force"], "--force goes with --trace-dir"),
    (["sglang-check", "--kit-only", "--force"], "drop --cases/--peer/--trace-dir/--force"),
    # bundle: a release number in range that is no release went to pip (its resolver error, after a download)
    (["bundle", "--sglang", "0.5.15.post2", "--out", OUT], "the nearest are 0.5.15.post1 and 0.5.16"),
    (["bundle", "--sglang", "0.5.22.post1", "--out", OUT], "the nearest are 0.5.22 and 0.5.23"),
    (["bundle", "--vllm", "0.33.1", "--out", OUT], "--vllm 0.33.1: the bundle's import chain was measured"),
    (["bundle", "--flashinfer", "0.7.2;x", "--out", OUT], "is not a release number"),
]


@pytest.mark.parametrize("argv, must", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_accepted_bad_input_is_one_line_exit_2_before_any_work(argv, must, nothing_runs, capfd):
    out = nothing_runs / "out"
    one_line_exit_2(capfd, [str(out) if a == OUT else a for a in argv], must)
    assert not out.exists() and not (nothing_runs / "cache").exists()


@pytest.mark.parametrize("extra", [[], ["--model", "gemma2"]], ids=["plain", "family"])
def test_a_fix_that_changes_nothing_is_refused_not_labelled_fixed(extra, monkeypatch, capfd):
    """0.5.21+ plan the full layers' prefix themselves, so ``--fix ragged_prefix_full_layers`` leaves
    0.5.23's files as they ship: the audit was labelled "FIXED COPY ... not as it ships". Refused like
    a fix whose file the release lacks (``PatchError``: one line, exit 2), before any copy or child;
    ``patch apply`` keeps its "nothing to do" (exit 0): a write that is already done is no error."""
    from swa_repro.sglang.audit import family_run, release
    import shutil

    release_overlay("0.5.23")  # the release as shipped, from the shared cache (installed if missing)
    for mod, name in ((release, "run_child"), (family_run, "run_child"), (shutil, "copytree")):
        monkeypatch.setattr(mod, name, never)
    line = one_line_exit_2(capfd, ["audit", "--sglang", "0.5.23", "--fix", "ragged_prefix_full_layers", *extra],
                           "--fix ragged_prefix_full_layers changes nothing in sglang 0.5.23")
    assert "FIXED" not in line and "drop --fix" in line


def test_the_release_list_is_pypis_from_the_oldest_driven_on():
    """``provision.RELEASES``: sorted, unique, from ``MIN_RELEASE``; a release past the newest goes to
    the installer (it may be new), one before ``MIN_RELEASE`` to the older refusal."""
    from swa_repro.core.versions import SGLANG_MIN_RELEASE as MIN_RELEASE
    from swa_repro.core.versions import SGLANG_RELEASES as RELEASES
    from swa_repro.core.versions import check_sglang_release as check_release
    from swa_repro.core.versions import sglang_release_key as parse

    parsed = [parse(r) for r in RELEASES]
    assert parsed == sorted(set(parsed)) and parsed[0][:3] == MIN_RELEASE
    for ok in (*RELEASES, "0.5.99", "0.4.0"):
        assert check_release(ok) == parse(ok)
