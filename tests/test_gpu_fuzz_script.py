"""``scripts/gpu_fuzz.sh``'s control flow, without a GPU: a stand-in ``python3`` plays flashinfer's
JIT (sleeps) and ``swa-repro fuzz`` (writes a recording), so the order, the overlap of one
version's build with the previous version's fuzz, the budget and what comes back are checked here
before any device time is spent on them."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tarfile

import pytest

from conftest import REPO

MOCK_PY = r"""#!/usr/bin/env bash
case "$1" in
  -c) echo 9.0;;
  -) cat >/dev/null; echo "  flashinfer (stand-in)";;
  -m)
    v=$(basename "$FLASHINFER_WORKSPACE_BASE")
    if [[ " $* " == *" --prebuild-only "* ]]; then
      echo "prebuild $v start $(date +%s.%N) MAX_JOBS_ARG $*" >> "$EVENTS"
      d=$(cat "$DELAYS/$v"); sleep "$d"
      echo "JIT: 4 modules in $d.0 s wall, 64.0 s CPU: {}"
      echo "prebuild $v end $(date +%s.%N)" >> "$EVENTS"; exit 0
    fi
    echo "fuzz $v start $(date +%s.%N) $*" >> "$EVENTS"
    out=$(sed -E 's/.*--out ([^ ]+).*/\1/' <<<"$*"); mkdir -p "$out"; echo '{}' > "$out/run.json"
    sleep 1; echo "fuzz (live): 5 cases (0 failed to probe), 9 requests, 90 request x head comparisons: 90 agree"
    echo "fuzz $v end $(date +%s.%N)" >> "$EVENTS";;
esac
"""


@pytest.fixture
def rig(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_fuzz.sh", repo / "scripts")
    py = tmp_path / "python3"
    py.write_text(MOCK_PY)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "delays").mkdir()

    def run(specs, delays, budget, bundles=None):
        for v, d in delays.items():
            (tmp_path / "delays" / v).write_text(str(d))
        for v in bundles if bundles is not None else delays:
            b = repo / ".bundle" / f"fi-{v}"
            b.mkdir(parents=True, exist_ok=True)
            (b / "install.sh").write_text('mkdir -p "$1"\n')
        out = tmp_path / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        env = {**os.environ, "PYTHON": str(py), "OUT": str(out), "BUDGET_S": str(budget), "FUZZ_S": "5",
               "EVENTS": str(tmp_path / "events"), "DELAYS": str(tmp_path / "delays"),
               "PATH": f"{tmp_path}:{os.environ['PATH']}"}
        # /tmp/site-VERSION and /tmp/stage are the script's fixed places on the GPU machine: use versions
        # no real run has, so nothing here meets them
        r = subprocess.run(["bash", "scripts/gpu_fuzz.sh", *specs], cwd=repo, env=env, capture_output=True, text=True,
                           timeout=120)
        events = (tmp_path / "events").read_text().splitlines() if (tmp_path / "events").exists() else []
        return r, out, events
    yield run
    for d in ("/tmp/stage/9.9.1", "/tmp/stage/9.9.2", "/tmp/site-9.9.1", "/tmp/site-9.9.2"):
        shutil.rmtree(d, ignore_errors=True)


def _t(events, what):
    return next(float(e.split()[3]) for e in events if e.startswith(what))


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
def test_versions_in_order_next_build_overlaps_this_fuzz(rig):
    r, out, events = rig(["9.9.1:5:fa2:128:0:fa3=bug", "9.9.2:7"], {"9.9.1": 1, "9.9.2": 3}, budget=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # 9.9.2's build starts once 9.9.1's ends and before 9.9.1's fuzz ends
    assert _t(events, "prebuild 9.9.1 end") <= _t(events, "prebuild 9.9.2 start") < _t(events, "fuzz 9.9.1 end")
    assert _t(events, "prebuild 9.9.2 end") <= _t(events, "fuzz 9.9.2 start")
    fuzz1 = next(e for e in events if e.startswith("fuzz 9.9.1 start"))
    assert "--plans fa3:bug" in fuzz1 and "--cases 5" in fuzz1 and "--out recordings/fuzz/9.9.1 --force" in fuzz1
    assert "--jit-jobs 40" in next(e for e in events if e.startswith("prebuild 9.9.1 start"))
    assert sorted(p.name for p in out.iterdir())[:2] == ["fuzz-9.9.1.tar.gz", "fuzz-9.9.2.tar.gz"]
    with tarfile.open(out / "fuzz-9.9.2.tar.gz") as t:
        names = t.getnames()
    assert "recordings/fuzz/9.9.2/run.json" in names and any(re.search(r"logs/prebuild-9.9.2-.*\.log", n) for n in names)
    table = r.stdout[r.stdout.index("version | JIT"):].splitlines()
    assert table[1].startswith("9.9.1 | JIT: 4 modules in 1.0 s wall, 64.0 s CPU | 5 cases") and table[1].endswith("agrees")
    assert table[2].startswith("9.9.2 | JIT: 4 modules in 3.0 s wall") and table[2].endswith("agrees")


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs util-linux setsid")
def test_build_past_the_budget_is_left_running_and_reported(rig):
    r, out, events = rig(["9.9.1:5", "9.9.2:5"], {"9.9.1": 1, "9.9.2": 30}, budget=12)
    assert r.returncode == 1
    assert "9.9.2: JIT not done after" in r.stdout and "left building" in r.stdout
    assert r.stdout.rstrip().splitlines()[-1] == "9.9.2 | none | none | JIT incomplete"
    assert "9.9.1 | JIT: 4 modules in 1.0 s wall" in r.stdout
    assert not any(e.startswith("fuzz 9.9.2") for e in events)


def test_missing_bundle_is_said_and_the_rest_still_run(rig):
    r, out, events = rig(["9.9.1:5", "9.9.2:5"], {"9.9.1": 1, "9.9.2": 1}, budget=60, bundles=["9.9.2"])
    assert r.returncode == 1
    assert "error: no bundle for 9.9.1 (make it: swa-repro bundle --flashinfer 9.9.1 --out .bundle/fi-9.9.1)" in r.stdout
    assert "9.9.1 | none | none | not installed" in r.stdout and "agrees" in r.stdout.splitlines()[-1]
