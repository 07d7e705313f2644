"""``scripts/gpu_fix.sh``'s control flow, without a GPU: a stand-in ``python3`` plays the site check,
``swa-repro audit --mode live`` (it reads the backend file of the site on its PYTHONPATH late, after
the patch step has run), ``swa-repro patch``, the kit edits (``fix.kit_edits``: a marker file in the
site's sglang), ``sglang-check --kit-only`` and the upstream unittest (it refuses an unedited kit);
stand-in bundles install a site holding one backend file. So the step order, which site each command
ran against, the budget cut-offs and what comes back are checked here before device time is spent."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import stat
import subprocess
import time

import pytest

from conftest import REPO

BACKEND = "sglang/srt/layers/attention/flashinfer_backend.py"
REGRESS = "docs/upstream/test/registered/attention/unittests/swa/test_flashinfer_plan_time_params.py"
REGRESS_TEST = "docs/upstream/test/registered/attention/unittests/swa/test_flashinfer_plan_time_params.py"

MOCK_PY = r"""#!/usr/bin/env bash
# the site sglang is imported from: the first entry of PYTHONPATH that holds it, as python finds it
IFS=: read -ra entries <<<"$PYTHONPATH"
for site in "${entries[@]}"; do [ -f "$site/sglang/srt/layers/attention/flashinfer_backend.py" ] && break; done
f="$site/sglang/srt/layers/attention/flashinfer_backend.py"
fi_site=${PYTHONPATH##*:}  # flashinfer: only the shipped site has it (the fixed one holds sglang alone)
ev() { echo "$* $(date +%s.%N)" >> "$EVENTS"; }
case "$1" in
  -) cat >/dev/null; ev "verify $site $fi_site"; [ -f "$f" ] || { echo "error: no sglang in $site"; exit 1; }
     [ -f "$fi_site/flashinfer.installed" ] || { echo "error: no flashinfer in $fi_site"; exit 1; }
     echo "  stand-in: sglang from $site; flashinfer, sgl_kernel from $fi_site";;
  -c) echo "2.11.0+stand-in cuda 13.0";;
  -m)
    mod=$2; shift 2  # -m swa_repro.cli
    if [ "$mod" = swa_repro.kernel.jit_warm ]; then ev "jit $site $*"; echo '{"cascade": 1.0}'; exit 0; fi
    if [ "$mod" = swa_repro.sglang.fix.kit_edits ]; then  # --site DIR
      ev "kit-edit $2"; [ -f "$2/sglang/srt/layers/attention/flashinfer_backend.py" ] || { echo "error: no sglang in $2" >&2; exit 1; }
      [ -f "$2/sglang/KIT_EDITED" ] && echo "kit_swa_cases: already applied" || echo "kit_swa_cases: applied now"
      touch "$2/sglang/KIT_EDITED"; exit 0
    fi
    case "$1 $2" in
      "audit "*)
        ev "audit-start $site $*"; sleep "${AUDIT_SLEEP:-1}"
        grep -q PATCHED "$f" && p=true || p=false   # read late: after the patch step
        echo "{\"release\": {\"backend_file\": \"$f\", \"patched\": $p}}"
        echo "stand-in audit of $site" >&2; ev "audit-end $site";;
      "patch apply")
        ev "patch-apply $site $*"; [ -z "${PATCH_FAIL:-}" ] || { echo "error: stand-in patch failed"; exit 1; }
        cp "$f" "$f.swa-repro.orig"; echo "PATCHED" >> "$f"; echo "patched $f";;
      "patch status")
        ev "patch-status $site $*"; grep -q PATCHED "$f" && echo "window_left: applied" || echo "window_left: needed";;
      "sglang-check "*)
        ev "kit $site $*"
        [ -z "${NO_KIT:-}" ] || { echo "swa-repro: error: unrecognized arguments: --kit-only" >&2; exit 2; }
        echo '{"kit": "stand-in"}';;
    esac;;
  benchmarks/alt_cost.py)
    ev "alt $site"; echo '{"shapes": []}' > "$3";;
  *.py)
    ev "regress $site $1"
    [ -f "$site/sglang/KIT_EDITED" ] || { echo "ERROR: the kit in $site is not edited (no logit_cap)"; exit 2; }
    if grep -q PATCHED "$f"; then echo "OK"; exit 0; else echo "FAILED (failures=1)"; exit 1; fi;;
esac
"""

FI_INSTALL = 'mkdir -p "$1"; touch "$1/flashinfer.installed"; echo "install-fi $1 $(date +%s.%N)" >> "$EVENTS"\n'
SG_INSTALL = ('mkdir -p "$1/sglang/srt/layers/attention"; echo "# shipped" > "$1/' + BACKEND + '"\n'
              'echo "install-sglang $1 $(date +%s.%N)" >> "$EVENTS"\n')


@pytest.fixture
def rig(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for s in ("gpu_fix.sh", "lib_gpu.sh"):
        shutil.copy(REPO / "scripts" / s, repo / "scripts")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    py = bin_ / "python3"
    py.write_text(MOCK_PY)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    for name, text in (("fi-0.7.2", FI_INSTALL), ("sglang-0.5.23", SG_INSTALL)):
        (repo / ".bundle" / name).mkdir(parents=True)
        (repo / ".bundle" / name / "install.sh").write_text(text)
    sites = {"shipped": tmp_path / "site-shipped", "fixed": tmp_path / "site-fixed", "kit": tmp_path / "site-kit"}

    def run(steps=None, regress_file=True, **env_extra):
        test = repo / REGRESS_TEST
        if regress_file:
            test.parent.mkdir(parents=True, exist_ok=True)
            test.write_text("# stand-in\n")
        elif test.exists():
            test.unlink()
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        events = tmp_path / "events"
        events.unlink(missing_ok=True)
        env = {**os.environ, "OUT": str(out), "EVENTS": str(events), "SITE": str(sites["shipped"]),
               "SITE_FIXED": str(sites["fixed"]), "SITE_KIT": str(sites["kit"]), "ART": str(tmp_path / "art"),
               "KILL_AFTER_S": "1",
               "PATH": f"{bin_}:{os.environ['PATH']}", **{k: str(v) for k, v in env_extra.items()}}
        env.pop("PYTHON", None)  # the script's default, python3: the stand-in, first on PATH
        t0 = time.monotonic()
        r = subprocess.run(["bash", "scripts/gpu_fix.sh", *([steps] if steps else [])], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=60)
        r.wall = time.monotonic() - t0
        ev = [line.split() for line in events.read_text().splitlines()] if events.exists() else []
        return r, out, ev
    run.sites = sites
    return run


def _t(ev, kind, site):
    return next(float(e[-1]) for e in ev if e[0] == kind and e[1] == str(site))


def test_all_steps_in_order_each_on_its_own_site(rig):
    # the audits overlap the patch, the kit and regress steps: each stand-in audit lasts 4 s, so that
    # on a loaded machine (a 1 s audit failed this under a full suite, 2026-12-05) the steps between
    # still start inside it; the order below is the script's, not the machine's speed
    r, out, ev = rig(AUDIT_SLEEP=4)
    assert r.returncode == 0, r.stdout + r.stderr
    shipped, fixed = rig.sites["shipped"], rig.sites["fixed"]
    kinds = [e[0] for e in ev]
    # install: the flashinfer bundle, then sglang's, into the shipped site; the fixed site is its copy
    assert kinds[:2] == ["install-fi", "install-sglang"] and ev[0][1] == ev[1][1] == str(shipped)
    # one flashinfer for both sites (one JIT cache, one set of build.ninja include paths): the fixed
    # site holds the copied sglang package alone and runs with the shipped site's flashinfer behind it
    assert sorted(e[1:3] for e in ev if e[0] == "verify") == sorted([[str(shipped)] * 2, [str(fixed), str(shipped)]])
    assert sorted(p.name for p in fixed.iterdir()) == ["sglang"]
    # patch and patch status only on the fixed site, after the before audit started and before the after one
    assert [e[1] for e in ev if e[0].startswith("patch-")] == [str(fixed)] * 2
    assert next(e for e in ev if e[0] == "patch-apply")[2:6] == ["patch", "apply", "--fix", "all"]
    assert "--in-place" in next(e for e in ev if e[0] == "patch-apply")
    assert _t(ev, "patch-apply", fixed) < _t(ev, "audit-start", fixed)
    # the two audits overlap (before in the background, started first; after in the foreground), and the
    # before audit runs while the fixed site is patched: it reads its file after the patch (below)
    assert _t(ev, "audit-start", fixed) < _t(ev, "audit-end", shipped)
    assert _t(ev, "audit-start", shipped) < _t(ev, "audit-end", fixed)
    assert _t(ev, "patch-apply", fixed) < _t(ev, "audit-end", shipped)
    audits = [e for e in ev if e[0] == "audit-start"]
    assert len(audits) == 2 and all(e[2:7] == ["audit", "--mode", "live", "--json", "--live-budget"] for e in audits)
    # the kit runs on the fixed site, after the patch and alongside the audits (niced); regress on
    # each site, after the patch and alongside the audits too (they share the audits' JIT builds),
    # and the helper modules only regress needs start building right after the install
    assert [e[1] for e in ev if e[0] == "kit"] == [str(fixed)]
    assert _t(ev, "patch-apply", fixed) < _t(ev, "kit", fixed) < _t(ev, "audit-end", fixed)
    assert "--kit-only" in next(e for e in ev if e[0] == "kit")
    # regress shipped runs on a copy of the shipped sglang whose kit is edited ($SITE_KIT, first on its
    # path), never on $SITE (whose kit stays as shipped); the fixed site's kit is edited in the patch
    # step (so the kit step runs the changed case lists) and checked again before regress
    kit = rig.sites["kit"]
    # on each site the regression test, then sglang's own kit tests (tests/sglang_kit_flashinfer_cases.py)
    assert sorted(e[1:3] for e in ev if e[0] == "regress") == sorted(
        [[str(s), f] for s in (kit, fixed) for f in (REGRESS, "tests/sglang_kit_flashinfer_cases.py")])
    for site in (kit, fixed):
        assert _t(ev, "patch-apply", fixed) < _t(ev, "regress", site) < _t(ev, "audit-end", fixed)
        assert _t(ev, "kit-edit", site) < _t(ev, "regress", site)
    assert sorted(e[1] for e in ev if e[0] == "kit-edit") == sorted([str(fixed), str(fixed), str(kit)])
    assert _t(ev, "patch-apply", fixed) < _t(ev, "kit-edit", fixed) < _t(ev, "kit", fixed)
    assert (kit / BACKEND).read_text() == "# shipped\n" and (kit / "sglang" / "KIT_EDITED").is_file()
    assert (fixed / "sglang" / "KIT_EDITED").is_file() and not (shipped / "sglang" / "KIT_EDITED").exists()
    assert [e[1:4] for e in ev if e[0] == "jit"] == [[str(shipped), "cascade", "quantization"]]
    assert _t(ev, "install-sglang", shipped) < _t(ev, "jit", shipped) < _t(ev, "audit-start", shipped)
    # the before audit read the shipped file although the patch ran meanwhile; the after one the patched file
    before = json.loads(lzma.decompress((out / "audit-live-before.json.xz").read_bytes()))["release"]
    after = json.loads(lzma.decompress((out / "audit-live-after.json.xz").read_bytes()))["release"]
    assert before == {"backend_file": f"{shipped}/{BACKEND}", "patched": False}
    assert after == {"backend_file": f"{fixed}/{BACKEND}", "patched": True}
    assert (shipped / BACKEND).read_text() == "# shipped\n" and not list((shipped / BACKEND).parent.glob("*.orig"))
    regress = (out / "regress.log").read_text()
    assert "== regress shipped: FAIL, as expected" in regress and "== regress fixed: PASS, as expected" in regress
    # what comes back: at most 8 flat files
    got = sorted(p.name for p in out.iterdir())
    assert len(got) <= 8 and all((out / n).is_file() for n in got)
    assert {"gpu.txt", "audit-live-before.json.xz", "audit-live-after.json.xz", "kit-after.json", "regress.log",
            "fix.diff", "alt-cost.json"} <= set(got)
    # the cost of the alternative is timed on the shipped site, after the fixed audit built its modules
    assert [e[1] for e in ev if e[0] == "alt"] == [str(shipped)]
    assert _t(ev, "audit-end", fixed) < _t(ev, "alt", shipped)
    assert len([n for n in got if n.startswith("gpu_fix-") and n.endswith(".log")]) == 1
    assert "+PATCHED" in (out / "fix.diff").read_text()
    gpu = (out / "gpu.txt").read_text()
    assert "git rev-parse HEAD:" in gpu and "date -u:" in gpu and "torch: 2.11.0+stand-in" in gpu
    assert f"PYTHONPATH={fixed}:{shipped} timeout" in gpu and "patch apply --fix all --in-place" in gpu
    # seconds per step, from the script's start: every step that ran has its row, ended after it began
    rows = [line.split("\t") for line in gpu.split("seconds per step")[1].splitlines()[1:] if line.count("\t") == 4]
    assert {r[0] for r in rows} == {"install", "patch", "before", "after", "kit", "regress_shipped",
                                    "regress_fixed", "jit_helpers", "alt"}
    assert all(int(r[1]) <= int(r[2]) and int(r[3]) == int(r[2]) - int(r[1]) for r in rows)
    assert {r[0]: r[4] for r in rows}["regress_shipped"] == "1" and {r[0]: r[4] for r in rows}["after"] == "0"
    log = r.stdout
    assert "sha256" in log and "window_left: applied" in log and "exit status 0" in log.splitlines()[-1]


def test_budget_cut_offs(rig):
    # too little left for any audit (and then for the kit and regress): each skipped and said so, exit 1
    r, out, ev = rig(BUDGET_S=3)
    assert r.returncode == 1
    for step in ("before", "after", "kit", "regress shipped", "regress fixed"):
        assert f"== {step}: skipped, " in r.stdout, step
    assert not [e for e in ev if e[0] in ("audit-start", "kit", "regress")]
    assert "patch-apply" in [e[0] for e in ev]
    # audits that outlast their share are stopped by their timeout (the exit status is theirs, the last
    # failure); the kit and regress, started beside them, get what is left: too little
    r, out, ev = rig(BUDGET_S=9, RESERVE_S=4, AUDIT_MARGIN_S=2, MIN_LIVE_S=1, AUDIT_SLEEP=30)
    assert r.returncode == 124 and r.wall < 20, r.stdout
    assert "== regress shipped: skipped, " in r.stdout and "== regress fixed: skipped, " in r.stdout
    # --live-budget = (time left - RESERVE_S) - AUDIT_MARGIN_S: at most 9 - 4 - 2 = 3, at least MIN_LIVE_S
    # (how much of the budget the earlier steps used depends on the machine's load)
    start = next(e for e in ev if e[0] == "audit-start")
    assert 1 <= int(start[start.index("--live-budget") + 1]) <= 3, start
    assert "== after: exit status 124" in r.stdout and "== before: exit status 124" in r.stdout
    assert "== kit: skipped, " in r.stdout and not [e for e in ev if e[0] in ("audit-end", "kit")]


def test_missing_bundle_is_one_error_line_and_exit_2(rig, tmp_path):
    shutil.rmtree(tmp_path / "repo" / ".bundle" / "sglang-0.5.23")
    r, out, ev = rig()
    assert r.returncode == 2
    errors = [line for line in r.stdout.splitlines() if "error" in line]
    assert errors == [f"error: {tmp_path}/repo/.bundle/sglang-0.5.23/install.sh not found; make it here: "
                      "swa-repro bundle --sglang 0.5.23 --out .bundle/sglang-0.5.23"]
    assert ev == [] and len(list(out.iterdir())) <= 8


def test_failed_patch_skips_what_needs_it_and_absent_kit_or_test_is_logged(rig):
    r, out, ev = rig(PATCH_FAIL=1)
    assert r.returncode == 1
    assert [e[1] for e in ev if e[0] == "audit-start"] == [str(rig.sites["shipped"])]  # before still measured
    for step in ("after", "kit", "regress fixed"):
        assert f"== {step}: skipped, {rig.sites['fixed']} is not patched" in r.stdout
    assert "== regress shipped: FAIL, as expected" in r.stdout
    r, out, ev = rig("install,patch,kit,regress", regress_file=False, NO_KIT=1)
    assert r.returncode == 2
    assert "unrecognized arguments: --kit-only" in r.stdout and "== kit: exit status 2" in r.stdout
    assert f"== regress: skipped, no {REGRESS_TEST}" in r.stdout
    assert not [e for e in ev if e[0] in ("audit-start", "regress")]


def test_dry_run_prints_and_runs_nothing(rig):
    r, out, ev = rig(DRY_RUN=1)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ev == [] and list(out.iterdir()) == []
    s = r.stdout
    assert s.index("fi-0.7.2/install.sh") < s.index("sglang-0.5.23/install.sh") < s.index("+ cp -a")
    assert f"{rig.sites['fixed']}:{rig.sites['shipped']} python3 -m swa_repro.cli patch apply" in s
    assert "sglang-check --mode live --kit-only --json" in s
    assert f"PYTHONPATH={rig.sites['kit']}:{rig.sites['shipped']} timeout" in s and f"python3 {REGRESS_TEST} tests/sglang_kit_flashinfer_cases.py" in s
    assert f"-m swa_repro.sglang.fix.kit_edits --site {rig.sites['fixed']}" in s
    assert f"cp -a {rig.sites['shipped']}/sglang {rig.sites['kit']}/" in s
