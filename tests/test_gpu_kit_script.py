"""``scripts/gpu_kit.sh`` (#40's one GPU call) without a GPU: a stand-in ``python3`` plays the site check,
``jit_warm kit``, ``swa-repro patch``, the kit edits (a marker per edit set in the site's sglang), the kit's
SWA cases per backend (``SWA_KIT_BACKEND``: FlashInfer fails unpatched, Triton fails only with the Triton
follow-up kit) and the registered test, and the benchmark. So the plan (which site each run gets, the JIT
before the FlashInfer runs, Triton beside the JIT, the bench last, FA3 said skipped), the budget cut-offs,
the verdicts and what comes back are checked before device time is spent."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest
from conftest import REPO

BACKEND = "sglang/srt/layers/attention/flashinfer_backend.py"
REGRESS_TEST = "docs/upstream/test/registered/attention/unittests/swa/test_flashinfer_plan_time_params.py"
KIT_CASES = "tests/sglang_kit_swa_cases.py"

MOCK_PY = r"""#!/usr/bin/env bash
IFS=: read -ra entries <<<"$PYTHONPATH"
for site in "${entries[@]}"; do [ -f "$site/sglang/srt/layers/attention/flashinfer_backend.py" ] && break; done
f="$site/sglang/srt/layers/attention/flashinfer_backend.py"
ev() { echo "$* $(date +%s.%N)" >> "$EVENTS"; }
case "$1" in
  -) cat >/dev/null; ev "verify $site"; [ -f "$f" ] || exit 1;;
  -c) echo "2.11.0+stand-in cuda 13.0";;
  -m)
    mod=$2; shift 2
    if [ "$mod" = swa_repro.kernel.jit_warm ]; then
      ev "jit-start $*"; sleep "${JIT_SLEEP:-1}"; echo '{"fa3-swa": 1.0}'; ev "jit-end"; exit 0; fi
    if [ "$mod" = swa_repro.sglang.fix.kit_edits ]; then
      ev "kit-edit $2 ${4:-default}"; touch "$2/sglang/KIT_EDITED"
      case "${4:-}" in *kit_tree_verify_triton*) touch "$2/sglang/TRITON_DEPTH";; esac; exit 0; fi
    case "$1 $2" in
      "patch apply") ev "patch $site"; echo "PATCHED" >> "$f";;
    esac;;
  benchmarks/fix_cost.py) ev "bench-start"; echo '{}' > "$3"; ev "bench-end";;
  *.py)
    ev "run-start $SWA_KIT_BACKEND $site $1"; sleep "${RUN_SLEEP:-0.3}"
    [ -f "$site/sglang/KIT_EDITED" ] || { echo "ERROR: kit not edited"; exit 2; }
    echo "Ran 3 tests in 0.1s"
    if [ "$SWA_KIT_BACKEND" = triton ]; then bad=$([ -f "$site/sglang/TRITON_DEPTH" ] && echo 1 || echo 0)
    else bad=$(grep -q PATCHED "$f" && echo 0 || echo 1); fi
    [ "${FORCE_PASS:-}" = 1 ] && bad=0
    ev "run-end $SWA_KIT_BACKEND $site $1"
    if [ "$bad" = 1 ]; then echo "FAILED (failures=1)"; exit 1; else echo "OK"; exit 0; fi;;
esac
"""
FI_INSTALL = 'mkdir -p "$1"; echo "install-fi $1 $(date +%s.%N)" >> "$EVENTS"\n'
SG_INSTALL = ('mkdir -p "$1/sglang/srt/layers/attention" "$1/sgl_kernel"; echo "# shipped" > "$1/' + BACKEND + '"\n'
              'echo "install-sglang $1 $(date +%s.%N)" >> "$EVENTS"\n')


@pytest.fixture
def rig(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for s in ("gpu_kit.sh", "lib_gpu.sh"):
        shutil.copy(REPO / "scripts" / s, repo / "scripts")
    stub = repo / "swa_repro/evidence/stubs/sgl_kernel"
    stub.mkdir(parents=True)
    shutil.copy(REPO / "swa_repro/evidence/stubs/sgl_kernel/__init__.py", stub)
    for f in (REGRESS_TEST, KIT_CASES):
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        (repo / f).write_text("# stand-in\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(MOCK_PY)
    (bin_ / "python3").chmod(0o755 | stat.S_IEXEC)
    for name, text in (("fi-0.7.2", FI_INSTALL), ("sglang-0.5.23", SG_INSTALL)):
        (repo / ".bundle" / name).mkdir(parents=True)
        (repo / ".bundle" / name / "install.sh").write_text(text)
    sites = {k: tmp_path / f"site-{k}" for k in ("shipped", "kit", "fixed", "tri")}

    def run(steps=None, bench=True, **env_extra):
        b = repo / "benchmarks" / "fix_cost.py"
        if bench:
            b.parent.mkdir(exist_ok=True)
            b.write_text("# stand-in\n")
        else:
            b.unlink(missing_ok=True)
        out, events = tmp_path / "out", tmp_path / "events"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        events.unlink(missing_ok=True)
        env = {**os.environ, "OUT": str(out), "EVENTS": str(events), "SITE": str(sites["shipped"]),
               "SITE_KIT": str(sites["kit"]), "SITE_FIXED": str(sites["fixed"]), "SITE_TRI": str(sites["tri"]),
               "ART": str(tmp_path / "art"), "KILL_AFTER_S": "1", "PATH": f"{bin_}:{os.environ['PATH']}",
               **{k: str(v) for k, v in env_extra.items()}}
        env.pop("PYTHON", None)
        r = subprocess.run(["bash", "scripts/gpu_kit.sh", *([steps] if steps else [])], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=120, check=False)
        ev = [line.split() for line in events.read_text().splitlines()] if events.exists() else []
        return r, out, ev
    run.sites = sites
    return run


def _at(ev, *words):
    return next(float(e[-1]) for e in ev if e[:len(words)] == list(words))


def test_one_call_runs_the_plan_in_order_and_returns_at_most_8_files(rig):
    r, out, ev = rig(JIT_SLEEP=1.5)
    s = rig.sites
    assert r.returncode == 0, r.stdout + r.stderr
    # the kit edits: kit.diff's on the shipped and fixed copies, with the Triton follow-up on the third
    edits = {e[1]: e[2] for e in ev if e[0] == "kit-edit"}
    assert edits[str(s["kit"])] == edits[str(s["fixed"])] == "default"
    assert edits[str(s["tri"])].endswith(",kit_tree_verify_triton")
    assert [e[1] for e in ev if e[0] == "patch"] == [str(s["fixed"])]
    # Triton beside the JIT (shipped first, then fixed and depth); FlashInfer's runs only after it
    jit0, jit1 = _at(ev, "jit-start"), _at(ev, "jit-end")
    tri = {w: _at(ev, "run-start", "triton", str(s[k])) for w, k in (("shipped", "kit"), ("fixed", "fixed"),
                                                                     ("depth", "tri"))}
    assert jit0 <= tri["shipped"] < jit1 and tri["fixed"] >= _at(ev, "run-end", "triton", str(s["kit"]))
    fi = [float(e[-1]) for e in ev if e[:2] == ["run-start", "flashinfer"]]
    assert len(fi) == 4 and min(fi) >= jit1  # kit and regress, shipped and fixed
    runs = {(e[1], e[2], e[3]) for e in ev if e[0] == "run-start"}
    assert (("flashinfer", str(s["kit"]), REGRESS_TEST) in runs and ("flashinfer", str(s["fixed"]), KIT_CASES) in runs)
    # the bench after every run
    assert _at(ev, "bench-start") > max(float(e[-1]) for e in ev if e[0] == "run-end")
    names = sorted(p.name for p in out.iterdir())
    assert len(names) <= 8 and {"gpu.txt", "kit-flashinfer.log", "kit-triton.log", "regress.log", "jit-warm.json",
                                "fix-cost.json"} <= set(names)
    for f, want in (("kit-flashinfer.log", ("shipped: FAIL, as expected", "fixed: PASS, as expected")),
                    ("kit-triton.log", ("shipped: PASS, as expected", "fixed: PASS, as expected",
                                        "depth: FAIL, as expected")),
                    ("regress.log", ("regress shipped: FAIL, as expected", "regress fixed: PASS, as expected"))):
        text = (out / f).read_text()
        assert all(w in text for w in want), text
    assert "== regress shipped on " in (out / "regress.log").read_text()  # upstream_live.regress_results' header
    assert "fa3: skipped: sglang's FA3 backend needs sgl_kernel's compiled" in (out / "gpu.txt").read_text()
    assert "fa3: skipped" in r.stdout
    # what comes back is what the recorder reads: seven runs, each as expected (kit_live)
    from swa_repro.sglang.fix import kit_live

    doc = kit_live.summarize(out)
    assert doc["all_as_expected"] and doc["missing"] == [] and len(doc["runs"]) == 7
    assert {(x["run"], x["site"]) for x in doc["runs"]} == {
        ("kit-flashinfer", "shipped"), ("kit-flashinfer", "fixed"), ("kit-triton", "shipped"), ("kit-triton", "fixed"),
        ("kit-triton", "depth"), ("regress", "shipped"), ("regress", "fixed")}


def test_a_run_not_as_expected_sets_the_exit_status(rig):
    r, out, _ = rig("install,patch,jit,triton", FORCE_PASS=1)  # Triton at depth passing: not the finding
    assert r.returncode == 1
    assert "depth: PASS, NOT as expected" in (out / "kit-triton.log").read_text()


def test_what_the_budget_cannot_hold_is_skipped_and_said(rig):
    r, _, ev = rig(BUDGET_S=60, RESERVE_S=45, BENCH_MIN_S=60, JIT_SLEEP=0.2)
    assert r.returncode == 1
    assert "== bench: skipped" in r.stdout and not [e for e in ev if e[0] == "bench-start"]
    r, _, ev = rig("install,patch,bench", bench=False)
    assert "== bench: skipped, no benchmarks/fix_cost.py in this checkout" in r.stdout and r.returncode == 0


def test_dry_run_prints_the_plan_and_runs_nothing(rig):
    r, out, ev = rig(DRY_RUN=1)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ev == [] and list(out.iterdir()) == []
    s, sites = r.stdout, rig.sites
    assert s.index("fi-0.7.2/install.sh") < s.index("sglang-0.5.23/install.sh") < s.index("swa_repro/evidence/stubs")
    assert f"-m swa_repro.sglang.fix.kit_edits --site {sites['tri']} --names " in s
    assert s.index("-m swa_repro.kernel.jit_warm kit") < s.index("SWA_KIT_BACKEND=flashinfer")
    assert f"PYTHONPATH={sites['kit']}:{sites['shipped']} SWA_KIT_BACKEND=triton" in s
    assert f"PYTHONPATH={sites['fixed']}:{sites['shipped']} SWA_KIT_BACKEND=flashinfer" in s
    assert f"python3 {REGRESS_TEST}" in s and "benchmarks/fix_cost.py --out" in s
