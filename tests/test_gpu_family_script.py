"""scripts/gpu_family.sh (issue #25's GPU step) with a stand-in python: the steps in order, each site's
family audit with --live cuda on its own path, both at once, the budget and the patch failing."""

from __future__ import annotations

import json
import lzma
import subprocess
import tarfile

import pytest
from conftest import REPO
from script_rig import script_rig

MOCK_PY = r"""#!/usr/bin/env bash
ev() { echo "$* $(date +%s.%N)" >> "$EVENTS"; }
case "$1" in
  -) cat >/dev/null; echo "  stand-in verify";;
  -c) case "$2" in *audit.paths*) ev "list-paths"; echo "decode,extend_paged,cuda_graph_decode,cuda_graph_verify";;
        *) echo "2.11.0+stand-in cuda 13.0";; esac;;
  -m)
    mod=$2; shift 2
    if [ "$mod" = swa_repro.sglang.audit.family_run ]; then
      ev "family-start PYTHONPATH=$PYTHONPATH WARM=${SWA_REPRO_WARM_ONLY:-} WORKERS=${SWA_REPRO_BUILD_WORKERS:-} BLOCKING=${CUDA_LAUNCH_BLOCKING:-} ANNOUNCE=${SWA_REPRO_ANNOUNCE_CALLS:-} $*"
      echo "live: launching stand-in" >&2; sleep 1
      out=$(sed -E 's/.*--out ([^ ]+).*/\1/' <<<"$*"); echo '{"live": {"executor": "cuda"}}' > "$out"
      [ -n "${SWA_REPRO_WARM_ONLY:-}" ] && [ -n "${NOT_BUILT:-}" ] \
        && echo '{"live": {"warmup": {"a": "still building at the end", "b": "still building at the end", "c": 1.5}}}' > "$out"
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


def _returned(out) -> dict[str, bytes]:
    """What a call returns, by name: the files in OUT, and the members of its data.tar (write_out packs the
    data files' .xz there where they and gpu.txt and the log would be over the 8 files a call returns)."""
    got = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "data.tar"}
    if (out / "data.tar").is_file():
        with tarfile.open(out / "data.tar") as t:
            got.update({m.name: t.extractfile(m).read() for m in t.getmembers()})
    return got


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
    r, out, ev = rig(ISOLATE_GRAPH="0")
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
                                       ({"BUDGET_S": 250}, "== family: skipped"),  # a budget under MIN_LIVE_S
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
    assert len(starts) == 4 and all("--families a,b " in e and "--smalls-file " in e for e in starts)  # graph apart
    assert float(smalls.split()[-1]) < min(float(e.split()[-1]) for e in starts)
    assert json.loads(lzma.decompress(_returned(out)["smalls.json.xz"])) == {"a": {}, "b": {}}
    assert "families a,b (checkpoints ck/a,ck/b/config.json);" in (out / "gpu.txt").read_text()


def test_checkpoints_it_cannot_read_skip_the_family_step_and_exit_1(rig):
    r, _, ev = rig(CHECKPOINTS="ck/a", SMALLS_FAIL=1)
    assert r.returncode == 1 and "== checkpoints: not read" in r.stdout
    assert not [e for e in ev if e.startswith("family-start")]


def test_a_build_step_alone_builds_the_checkpoints_modules(rig):
    """STEPS=install,build (a whole call's time for the JIT build, the judged pass in the next call on the
    warm machine): the build children get the checkpoints' labels and smalls file, not FAMILIES' default."""
    r, out, ev = rig("install,build", CHECKPOINTS="ck/a,ck/b", PATHS="extend_ragged_no_prefix")
    assert r.returncode == 0, r.stdout + r.stderr
    (smalls,) = [e for e in ev if e.startswith("smalls")]
    starts = [e for e in ev if e.startswith("family-start")]
    assert len(starts) == 2 and all("WARM=1 " in e and "--families a,b " in e and "--smalls-file " in e for e in starts)
    assert float(smalls.split()[-1]) < min(float(e.split()[-1]) for e in starts)
    assert {"family-build-shipped.json.xz", "smalls.json.xz"} <= {p.name for p in out.iterdir()}


def _paths(e):
    return e.split("--paths ")[1].split()[0] if "--paths " in e else None


def _budget(e):
    return int(e.split("--live-budget-s ")[1].split()[0])


def test_graph_paths_run_in_their_own_blocking_children_after_the_others(rig):
    """PATHS empty: every audit path, listed by the package; the cuda_graph_* ones apart, after the others
    ended, with CUDA_LAUNCH_BLOCKING=1 and each call said before its launch, their .err returned."""
    r, out, ev = rig()
    assert r.returncode == 0, r.stdout + r.stderr
    assert any(e.startswith("list-paths") for e in ev)
    starts = [e for e in ev if e.startswith("family-start")]
    main = [e for e in starts if _paths(e) == "decode,extend_paged"]
    graph = [e for e in starts if _paths(e) == "cuda_graph_decode,cuda_graph_verify"]
    assert len(main) == len(graph) == 2 and len(starts) == 4
    assert all("BLOCKING= ANNOUNCE= " in e for e in main) and all("BLOCKING=1 ANNOUNCE=1 " in e for e in graph)
    assert all("WARM= " in e for e in starts)  # no build step asked for
    ends = [float(e.split()[-1]) for e in ev if e.startswith("family-end") and "cuda_graph" not in e]
    assert max(ends) < min(float(e.split()[-1]) for e in graph)  # after the others, never beside them
    assert all(_budget(e) <= (575 - 30) // 2 - 120 for e in main)  # GRAPH_SHARE_PCT of the time kept for the graph
    got = {p.name for p in out.iterdir()}
    assert {"family-live-shipped.json.xz", "family-live-fixed-graph.json.xz", "family-live-shipped-graph.err.xz"} <= got
    assert b"live: launching" in lzma.decompress((out / "family-live-fixed-graph.err.xz").read_bytes())
    gpu = (out / "gpu.txt").read_text()
    assert "family_shipped-graph" in gpu and "isolate graph 1;" in gpu


@pytest.mark.parametrize("paths, main, graph", [("extend_ragged_no_prefix,cuda_graph_verify", "extend_ragged_no_prefix",
                                                 "cuda_graph_verify"),
                                                ("cuda_graph_verify", None, "cuda_graph_verify"),
                                                ("extend_ragged_no_prefix,extend_ragged_prefix",
                                                 "extend_ragged_no_prefix,extend_ragged_prefix", None)])
def test_paths_given_are_split_without_listing(rig, paths, main, graph):
    r, _, ev = rig(PATHS=paths)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not any(e.startswith("list-paths") for e in ev)
    starts = [e for e in ev if e.startswith("family-start")]
    assert [_paths(e) for e in starts if "BLOCKING= " in e] == [main] * 2 * (main is not None)
    assert [_paths(e) for e in starts if "BLOCKING=1 " in e] == [graph] * 2 * (graph is not None)
    if main is None:  # the graph children alone: the whole step's time
        assert all(_budget(e) > (575 - 30) // 2 for e in starts)


def test_a_build_step_warms_both_sites_first_then_the_judged_pass(rig):
    r, out, ev = rig("install,patch,build,family", PATHS="extend_ragged_no_prefix,extend_ragged_prefix",
                     BUILD_WORKERS="3")
    assert r.returncode == 0, r.stdout + r.stderr
    starts = [e for e in ev if e.startswith("family-start")]
    build = [e for e in starts if "WARM=1 WORKERS=3 " in e]
    judged = [e for e in starts if "WARM= WORKERS= " in e]
    assert len(build) == len(judged) == 2 and len(starts) == 4
    assert {e.split("--overlay ")[1].split()[0] for e in build} == {str(s) for s in rig.sites.values()}
    # BUILD_SHARE_PCT: the rest is the judged pass's; the warm-up may run to BUILD_MARGIN_S before the timeout
    assert all((575 - 30) // 2 - 20 - 5 <= _budget(e) <= (575 - 30) // 2 - 20 for e in build)
    build_ends = [float(e.split()[-1]) for e in ev if e.startswith("family-end")][:2]
    assert max(build_ends) < min(float(e.split()[-1]) for e in judged)
    got = {p.name for p in out.iterdir()}
    assert {"family-build-shipped.json.xz", "family-build-fixed.json.xz", "family-live-shipped.json.xz"} <= got
    gpu = (out / "gpu.txt").read_text()
    assert "build_shipped" in gpu and "family_fixed" in gpu and "steps: install,patch,build,family;" in gpu


LEAST = 120 + 120  # LIVE_MARGIN_S + MIN_LIVE_S: a judged child's least timeout (its import and drive come first)


def test_the_build_share_never_leaves_the_judged_step_a_budget_its_child_cannot_use(rig):
    """The H100 call of 2026-12-06 19:50 (BUILD_SHARE_PCT=70): the build step took its whole 348 s and the
    judged children got a 31 s live budget, gone in their import and drive before any call. The share is
    cut (and said) so that the build's timeout, overrun (KILL_AFTER_S) included, leaves the judged step
    LIVE_MARGIN_S + MIN_LIVE_S, and the judged children's budget is at least MIN_LIVE_S."""
    r, _, ev = rig("install,patch,build,family", PATHS="extend_ragged_no_prefix,extend_ragged_prefix",
                   BUILD_SHARE_PCT="70")
    assert r.returncode == 0, r.stdout + r.stderr
    starts = [e for e in ev if e.startswith("family-start")]
    build = [_budget(e) for e in starts if "WARM=1 " in e]
    judged = [_budget(e) for e in starts if "WARM= " in e]
    assert len(build) == len(judged) == 2
    assert all(b + 20 + 15 + LEAST <= 575 - 30 for b in build)  # BUILD_MARGIN_S, KILL_AFTER_S: its worst end
    assert all(j >= 120 for j in judged)
    assert "== build: share cut to " in r.stdout


def test_modules_the_build_step_left_building_are_said(rig):
    r, _, _ = rig("install,patch,build,family", PATHS="extend_ragged_no_prefix", NOT_BUILT="1")
    assert r.returncode == 0, r.stdout + r.stderr
    said = [x for x in r.stdout.splitlines() if "still building at the end of its share" in x]
    assert len(said) == 2 and all(x.startswith("== build: 2 modules") for x in said)
    r, _, _ = rig("install,patch,build,family", PATHS="extend_ragged_no_prefix")
    assert "still building" not in r.stdout


def test_the_graph_split_never_leaves_the_other_paths_a_budget_their_child_cannot_use(rig):
    """GRAPH_SHARE_PCT of a short step would leave the other paths' children under MIN_LIVE_S: they get
    their least and the graph children what is left (skipped and said where that is too little)."""
    r, _, ev = rig(BUDGET_S="400")
    assert r.returncode == 0, r.stdout + r.stderr
    starts = [e for e in ev if e.startswith("family-start")]
    main = [e for e in starts if "BLOCKING= " in e]
    assert len(main) == 2 and all(120 <= _budget(e) < (400 - 30) - 120 for e in main)


def test_a_call_of_more_than_8_files_returns_8_at_most_its_data_in_one_tar(rig):
    """build + family with the graph paths apart, on checkpoints: 8 family-*.json, 4 graph .err and smalls.json
    beside gpu.txt and the log would be 15 files; the device returns at most 8 (the rest would be lost). The
    data files' .xz come back in one uncompressed data.tar, each equal to what the stand-in wrote, and
    gpu.txt names them. A call of 8 files or fewer keeps its flat layout (the graph-paths test's 8)."""
    r, out, _ = rig("install,patch,build,family", CHECKPOINTS="ck/a,ck/b")
    assert r.returncode == 0, r.stdout + r.stderr
    got = {p.name for p in out.iterdir()}
    assert len(got) <= 8 and "data.tar" in got and "gpu.txt" in got and any(n.endswith(".log") for n in got)
    assert not [n for n in got if n.endswith(".xz")]
    art = rig.repo / "artifacts" / "gpu_family"
    wrote = sorted(f.name for f in art.iterdir() if (f.name.startswith("family-") and f.suffix == ".json")
                   or f.name.endswith("-graph.err") or f.name == "smalls.json")
    assert len(wrote) == 8 + 4 + 1
    assert (out / "data.tar").read_bytes()[257:262] == b"ustar"  # a plain tar: its members are the .xz already
    with tarfile.open(out / "data.tar") as t:
        members = {m.name: lzma.decompress(t.extractfile(m).read()) for m in t.getmembers()}
    assert members == {f"{n}.xz": (art / n).read_bytes() for n in wrote}
    gpu = (out / "gpu.txt").read_text()
    (said,) = [x for x in gpu.splitlines() if x.startswith("packed into data.tar")]
    assert sorted(said.split(": ", 1)[1].split()) == sorted(members)
    r, out, _ = rig(PATHS="cuda_graph_verify,decode")
    got = {p.name for p in out.iterdir()}
    assert len(got) == 8 and "data.tar" not in got and "packed into" not in (out / "gpu.txt").read_text()
