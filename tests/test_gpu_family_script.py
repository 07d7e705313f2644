"""scripts/gpu_family.sh (issue #25's GPU step) with a stand-in python: the steps in order, each site's
family audit with --live cuda on its own path, both at once, the budget and the patch failing."""

from __future__ import annotations

import json
import lzma
import subprocess

import pytest
from conftest import REPO
from script_rig import script_rig

MOCK_PY = r"""#!/usr/bin/env bash
ev() { echo "$* $(date +%s.%N)" >> "$EVENTS"; }
case "$1" in
  -) cat >/dev/null; echo "  stand-in verify";;
  -c) echo "2.11.0+stand-in cuda 13.0";;
  -m)
    mod=$2; shift 2
    if [ "$mod" = swa_repro.sglang.audit.family_run ]; then
      ev "family-start PYTHONPATH=$PYTHONPATH $*"; sleep 1
      out=$(sed -E 's/.*--out ([^ ]+).*/\1/' <<<"$*"); echo '{"live": {"executor": "cuda"}}' > "$out"
      ev "family-end $*"; exit 0
    fi
    if [ "$mod" = swa_repro.sglang.audit.checkpoint_smalls ]; then
      ev "smalls PYTHONPATH=$PYTHONPATH $*"; [ -z "${SMALLS_FAIL:-}" ] || { echo "error: bad" >&2; exit 2; }
      out=$(sed -E 's/.*--out ([^ ]+).*/\1/' <<<"$*"); echo '{"a": {}, "b": {}}' > "$out"; echo "a,b"; exit 0
    fi
    case "$1 $2" in
      "patch apply") ev "patch PYTHONPATH=$PYTHONPATH $*"; [ -z "${PATCH_FAIL:-}" ] || exit 1;;
    esac;;
esac
"""


@pytest.fixture
def rig(tmp_path):
    sites = {"shipped": tmp_path / "site-shipped", "fixed": tmp_path / "site-fixed"}
    run = script_rig(tmp_path, "gpu_family.sh", {"fi-0.7.2": 'mkdir -p "$1"\n', "sglang-0.5.23": 'mkdir -p "$1/sglang"\n'},
                     MOCK_PY, {"SITE": sites["shipped"], "SITE_FIXED": sites["fixed"]})
    run.sites = sites
    return run


def _at(events, prefix):
    return next(float(e.split()[-1]) for e in events if e.startswith(prefix))


def test_install_patch_then_both_sites_live_at_once(rig):
    r, out, ev = rig()
    assert r.returncode == 0, r.stdout + r.stderr
    shipped, fixed = rig.sites["shipped"], rig.sites["fixed"]
    assert (fixed / "sglang").is_dir()  # the fixed site: a copy of the sglang package alone
    patch = [e for e in ev if e.startswith("patch")]
    assert f":{fixed}:{shipped} patch apply --fix all --in-place" in patch[0]  # the fixed site only, shipped's flashinfer
    from swa_repro.sglang.audit.family_fix import FAMILY_FIX

    assert [e.split("--fix ")[1].split()[0] for e in patch[1:]] == sorted(set(FAMILY_FIX.values()))  # each model file's
    assert all(f":{fixed}:{shipped} patch apply --fix " in e and "--in-place" in e for e in patch[1:])
    starts = [e for e in ev if e.startswith("family-start")]
    assert len(starts) == 2 and all("--live cuda" in e and "--gpus sm80,sm90" in e and "--paths" not in e for e in starts)
    budgets = [int(e.split("--live-budget-s ")[1].split()[0]) for e in starts]
    assert all(0 < b <= 575 - 30 - 120 for b in budgets)  # BUDGET_S - RESERVE_S - LIVE_MARGIN_S at most
    assert any(f"--overlay {shipped} " in e and e.split()[1].endswith(f":{shipped}") for e in starts)
    assert any(f"--overlay {fixed} " in e and e.split()[1].endswith(f":{fixed}:{shipped}") for e in starts)
    assert "--families gemma2,gemma3 " in starts[0]
    started = [float(e.split()[-1]) for e in starts]
    assert _at(ev, "patch") < min(started)
    assert max(started) < min(float(e.split()[-1]) for e in ev if e.startswith("family-end"))  # at once
    got = {p.name for p in out.iterdir()}
    assert {"gpu.txt", "family-live-shipped.json.xz", "family-live-fixed.json.xz"} <= got
    assert json.loads(lzma.decompress((out / "family-live-fixed.json.xz").read_bytes()))["live"]["executor"] == "cuda"
    gpu = (out / "gpu.txt").read_text()
    assert "steps: install,patch,family;" in gpu and "family_shipped" in gpu and "family_fixed" in gpu
    digest = subprocess.run(["bash", "-c", ". scripts/lib_gpu.sh && code_digest"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    assert len(digest) == 1 and len(digest[0]) == 16 and "code digest: " in gpu  # the copy's code, not its lagging HEAD


def test_paths_are_passed_when_set(rig):
    r, _, ev = rig(PATHS="decode,extend_ragged_no_prefix", FAMILIES="gemma3")
    assert r.returncode == 0, r.stdout + r.stderr
    starts = [e for e in ev if e.startswith("family-start")]
    assert starts and all("--paths decode,extend_ragged_no_prefix" in e and "--families gemma3 " in e for e in starts)


@pytest.mark.parametrize("env, says", [({"BUDGET_S": 20}, "== family: skipped"),
                                       ({"BUDGET_S": 140}, "== family: skipped"),  # no time to run a call live
                                       ({"PATCH_FAIL": 1}, "skipped on both sites (the patch failed)")])
def test_a_family_step_it_cannot_run_is_skipped_said_and_exits_1(rig, env, says):
    r, _, ev = rig(**env)
    assert r.returncode == 1 and says in r.stdout
    assert not [e for e in ev if e.startswith("family-start")]


def test_checkpoints_are_read_on_the_shipped_site_then_audited_by_their_labels(rig):
    r, out, ev = rig(CHECKPOINTS="ck/a,ck/b/config.json")
    assert r.returncode == 0, r.stdout + r.stderr
    shipped = rig.sites["shipped"]
    (smalls,) = [e for e in ev if e.startswith("smalls")]
    assert f"--overlay {shipped} --sglang 0.5.23 --out " in smalls and smalls.split()[1].endswith(f":{shipped}")
    assert " ck/a ck/b/config.json " in smalls
    starts = [e for e in ev if e.startswith("family-start")]
    assert len(starts) == 2 and all("--families a,b " in e and "--smalls-file " in e for e in starts)
    assert float(smalls.split()[-1]) < min(float(e.split()[-1]) for e in starts)
    assert json.loads(lzma.decompress((out / "smalls.json.xz").read_bytes())) == {"a": {}, "b": {}}
    assert "families a,b (checkpoints ck/a,ck/b/config.json);" in (out / "gpu.txt").read_text()


def test_checkpoints_it_cannot_read_skip_the_family_step_and_exit_1(rig):
    r, _, ev = rig(CHECKPOINTS="ck/a", SMALLS_FAIL=1)
    assert r.returncode == 1 and "== checkpoints: not read" in r.stdout
    assert not [e for e in ev if e.startswith("family-start")]
