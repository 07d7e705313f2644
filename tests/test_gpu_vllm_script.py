"""scripts/gpu_vllm.sh (issue #27's GPU step) with a stand-in python: install from both bundles, the
fix on a copy of the vllm package only, one live child per family and group of paths (all at once),
the fixed site only for the capped family, one merged document per site, and what it cannot run."""

from __future__ import annotations

import json
import lzma
import shutil

import pytest
from script_rig import script_rig

MOCK_PY = r"""#!/usr/bin/env bash
ev() { echo "$* $(date +%s.%N)" >> "$EVENTS"; }
case "$1" in
  -c) case "$2" in *"import os, sys, torch, flashinfer, vllm"*) ev "verify PYTHONPATH=$PYTHONPATH";;
                   *) echo "2.11.0+stand-in cuda 13.0";; esac; [ -z "${VERIFY_FAIL:-}" ] || exit 1;;
  -m)
    mod=$2; shift 2
    case "$mod" in
      swa_repro.vllm.audit.live)
        ev "live-start PYTHONPATH=$PYTHONPATH $*"; sleep 1
        out=$(sed -E 's/.*--out ([^ ]+).*/\1/' <<<"$*"); fam=$(sed -E 's/.*--families ([^ ]+).*/\1/' <<<"$*")
        echo "{\"families\": {\"$fam\": {\"rows\": []}}}" > "$out"; ev "live-end $*"; exit 0;;
      swa_repro.vllm.audit.live_report)
        ev "merge $*"; [ "$1" = --merge ] && echo '{"merged": true}' > "$2"; exit 0;;
      swa_repro.cli)
        ev "patch PYTHONPATH=$PYTHONPATH $*"; [ -z "${PATCH_FAIL:-}" ] || exit 1;;
    esac;;
esac
"""


@pytest.fixture
def rig(tmp_path):
    sites = {"shipped": tmp_path / "site", "fixed": tmp_path / "site-fixed"}
    run = script_rig(tmp_path, "gpu_vllm.sh", {"fi-0.7.2.post1": 'mkdir -p "$1/flashinfer"\n',
                                               "vllm-0.33.0": 'mkdir -p "$1/vllm"\n'},
                     MOCK_PY, {"SITE": sites["shipped"], "SITE_FIXED": sites["fixed"]})
    run.sites = sites
    return run


def test_install_patch_then_every_child_at_once_and_one_document_per_site(rig):
    r, out, ev = rig()
    assert r.returncode == 0, r.stdout + r.stderr
    shipped, fixed = rig.sites["shipped"], rig.sites["fixed"]
    assert (shipped / "flashinfer").is_dir() and (shipped / "vllm").is_dir() and (fixed / "vllm").is_dir()
    assert not (fixed / "flashinfer").exists()  # the fixed site: a copy of the vllm package alone
    patch = [e for e in ev if e.startswith("patch")]
    assert len(patch) == 1 and f"--source {fixed}/vllm/v1/attention/backends/flashinfer.py --in-place" in patch[0]
    assert "patch apply --vllm --fix cap-route" in patch[0]
    starts = [e for e in ev if e.startswith("live-start")]
    groups = ("decode,cuda_graph_decode", "mixed,prefill", "spec_decode")
    want = {(f"--overlay {shipped} ", f) for f in ("gemma2", "cohere2")} | {(f"--overlay {fixed} ", "gemma2")}
    got = {(o, f) for e in starts for o, _ in want for f in ("gemma2", "cohere2")
           if o in e and f"--families {f} " in e}
    assert got == want and len(starts) == 3 * len(groups)
    for f, o in (("gemma2", shipped), ("cohere2", shipped), ("gemma2", fixed)):
        mine = [e for e in starts if f"--overlay {o} " in e and f"--families {f} " in e]
        assert sorted(e.split("--paths ")[1].split()[0] for e in mine) == sorted(groups)
    assert all("--device cuda" in e and e.split()[1] == f"PYTHONPATH={rig.repo}:{shipped}" for e in starts)
    budgets = [int(e.split("--budget-s ")[1].split()[0]) for e in starts]
    assert all(0 < b <= 575 - 30 - 60 for b in budgets)
    started = [float(e.split()[-1]) for e in starts]
    assert max(started) < min(float(e.split()[-1]) for e in ev if e.startswith("live-end"))  # at once
    merges = [e for e in ev if e.startswith("merge")]
    assert len(merges) == 2 and all(float(m.split()[-1]) > max(started) for m in merges)
    assert len([p for p in merges[0].split() if p.endswith(".json")]) == 1 + 6  # shipped: 2 families x 3 groups
    assert {p.name for p in out.iterdir()} >= {"gpu.txt", "live-shipped.json.xz", "live-fixed.json.xz"}
    assert len(list(out.iterdir())) <= 8
    assert json.loads(lzma.decompress((out / "live-fixed.json.xz").read_bytes())) == {"merged": True}
    gpu = (out / "gpu.txt").read_text()
    assert "steps: install,patch,live;" in gpu and "code digest: " in gpu and "vllm 0.33.0" in gpu


def test_groups_and_families_are_the_callers(rig):
    r, _, ev = rig("live", FAMILIES="gemma3", FIXED_FAMILIES="", PATH_GROUPS="decode")
    assert r.returncode == 0, r.stdout + r.stderr
    starts = [e for e in ev if e.startswith("live-start")]
    assert len(starts) == 1 and "--families gemma3 --paths decode " in starts[0]


@pytest.mark.parametrize("env, says, code", [
    ({"BUDGET_S": 60}, "== live: skipped", 1),
    ({"PATCH_FAIL": 1}, "the fixed site is skipped (the patch failed)", 1),
    ({"VERIFY_FAIL": 1}, "is not what its bundles install", 2),
])
def test_what_it_cannot_run_is_said(rig, env, says, code):
    r, _, ev = rig(**env)
    assert r.returncode == code and says in r.stdout, r.stdout
    starts = [e for e in ev if e.startswith("live-start")]
    if "PATCH_FAIL" in env:
        assert starts and not [e for e in starts if str(rig.sites["fixed"]) in e]
    else:
        assert not starts


def test_a_missing_bundle_says_how_to_make_it(rig):
    shutil.rmtree(rig.repo / ".bundle" / "fi-0.7.2.post1")
    r, _, ev = rig()
    assert r.returncode == 2 and "swa-repro bundle --flashinfer 0.7.2.post1 --kernels prefill,decode,xqa" in r.stdout
    assert not ev
