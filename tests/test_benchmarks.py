"""Benchmarks: the FLOP counting, the results schema, the report, and the GPU study's CPU-side logic."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common, family_audit, gpu_timing, report, targets_report, workflow_report  # noqa: E402
from benchmarks import h200_swa_prefill as study  # noqa: E402
from benchmarks.h200_plan import Job, Shape  # noqa: E402
from swa_repro.core.case import Case  # noqa: E402
from swa_repro.kernel.model import simulate  # noqa: E402
from swa_repro.core.reference import intended_mask, masked_attention  # noqa: E402


# ----------------------------------------------------------------------------- counting
@pytest.mark.parametrize("prefix", [0, 1, 5, 17])
@pytest.mark.parametrize("extend", [1, 2, 9, 33])
@pytest.mark.parametrize("window", [-1, 0, 1, 3, 8, 100])
def test_window_pairs_matches_brute_force(prefix, extend, window):
    assert common.window_pairs(prefix, extend, window) == int(intended_mask(prefix, extend, window).sum())


def test_useful_flops_counts_pairs_heads_and_4d():
    pairs = int(intended_mask(0, 64, 7).sum())
    assert common.useful_flops(64, 3, 7, 8, 32) == 3 * 8 * pairs * 4 * 32
    assert common.useful_flops(64, 1, -1, 1, 1) == 4 * 64 * 65 // 2


def test_min_bytes_reads_qkv_once_writes_o_once():
    # q and o: L*B*Hq*D each; k and v: L*B*Hk*D each; bf16 = 2 bytes
    assert common.min_bytes(100, 2, 8, 2, 64) == 2 * (2 * 100 * 2 * 8 * 64 + 2 * 100 * 2 * 2 * 64)


@pytest.mark.parametrize("seq_len,window,hq,hk", [(300, 20, 8, 1), (512, 64, 32, 4), (1000, 100, 32, 8)])
def test_fa2_buggy_pairs_match_kernel_model(seq_len, window, hq, hk):
    """The report's expected fa2-buggy work equals the kernel model's effective mask (no split-KV)."""
    case = Case(prefix_lens=(0,), extend_lens=(seq_len,), num_qo_heads=hq, num_kv_heads=hk, head_dim=128,
                page_size=1, window_left=window, plan_window_left=-1, backend="fa2", disable_split_kv=True)
    res = simulate(case)
    r = res.requests[0]
    model_pairs = int((r.hi[:, 0] - r.lo[:, 0] + 1).sum())
    assert common.computed_pairs("buggy", seq_len, window, "fa2", res.plan.cta_tile_q, hq // hk) == model_pairs
    assert model_pairs > common.window_pairs(0, seq_len, window)


def test_fa3_buggy_and_causal_compute_the_triangle():
    tri = 4096 * 4097 // 2
    assert common.computed_pairs("buggy", 4096, 128, "fa3") == tri
    assert common.computed_pairs("causal", 4096, -1, "fa2") == tri
    assert common.computed_pairs("sdpa", 4096, 128) == 4096 ** 2
    assert common.computed_pairs("fixed", 4096, 128, "fa3") == common.window_pairs(0, 4096, 128)


# ----------------------------------------------------------------------------- schema
def _record(backend, variant, L, B, hq, hk, w, ms, peak, **kw):
    flops = common.useful_flops(L, B, w, hq, 128)
    tf = flops / (ms * 1e-3) / 1e12
    return {"backend": backend, "variant": variant, "seq_len": L, "batch": B, "window": w, "num_qo_heads": hq,
            "num_kv_heads": hk, "head_dim": 128, "ms": ms, "useful_flops": flops, "useful_tflops": tf,
            "peak_fraction": tf / peak, **kw}


def synthetic_gpu(peak=800.0) -> dict:
    """A small results document shaped like the GPU script's (numbers invented for the test only)."""
    prov = {k: f"test-{k}" for k in common.GPU_PROVENANCE_KEYS}
    L, B, hq, hk, w = 16384, 1, 32, 4, 1024
    causal_ms = 10.0
    fixed_ms = causal_ms * common.window_pairs(0, L, w) / common.window_pairs(0, L, -1)
    recs = [
        _record("fa3", "causal", L, B, hq, hk, -1, causal_ms, peak, rel_err=2e-3),
        _record("fa3", "fixed", L, B, hq, hk, w, fixed_ms, peak, rel_err=2e-3, floor_ms=fixed_ms / 2),
        _record("fa3", "buggy", L, B, hq, hk, w, causal_ms, peak, rel_err=0.5),
        _record("fa2", "fixed", L, B, hq, hk, w, 2 * fixed_ms, peak, rel_err=3e-3, plan_cta_tile_q=128),
        _record("fa2", "buggy", L, B, hq, hk, w, 2.2 * fixed_ms, peak, rel_err=0.1, plan_cta_tile_q=128),
        _record("torch", "flex", L, B, hq, hk, w, 3 * fixed_ms, peak, rel_err=3e-3),
        {**_record("torch", "sdpa", L, B, hq, hk, w, 1.0, peak), "error": "skipped: budget"},
    ]
    for r in recs[-1:]:
        for k in common.TIMING_KEYS:
            r.pop(k)
    return {"provenance": prov, "peak_bf16_tflops": peak, "copy_tbps": 4.3, "status": "complete",
            "jit": [{"module": "fa3/hd128/swa", "first_s": 101.0, "steady_s": 1.0, "jit_s": 100.0, "contended": True}],
            "records": recs, "probe_8k": {"first_s": 35.0, "warm_s": 2.5}}


def synthetic_cpu(median_s=0.2, repro_s=None) -> dict:
    doc = {"provenance": {"cpu": "test cpu", "cpu_count": 2, "date": "d", "command": "c", "python": "3"},
           "kernel_model": [{"name": "fa2-buggy-W4096", "seq_len": 32768, "tiles": False, "median_s": median_s,
                             "min_s": median_s, "repeats": 5, "status": ["leak"]}]}
    if repro_s is not None:
        doc["repro_model_mode"] = {"command": "swa-repro run --mode model", "wall_s": repro_s, "returncode": 0}
    return doc


def test_validator_accepts_a_well_formed_document():
    assert common.validate_gpu_results(synthetic_gpu()) == []
    assert common.validate_cpu_results(synthetic_cpu()) == []


@pytest.mark.parametrize("breakage,expect", [
    (lambda d: d["provenance"].pop("driver"), "provenance lacks 'driver'"),
    (lambda d: d["records"][0].update(variant="flex"), "not valid for backend"),
    (lambda d: d["records"][0].update(window=5), "causal records carry window -1"),
    (lambda d: d["records"][1].update(peak_fraction=0.9), "peak_fraction != useful_tflops"),
    (lambda d: d["records"][1].pop("ms"), "ms must be a positive number"),
    (lambda d: d["records"][1].update(ms=float("nan")), "ms must be a positive number"),
    (lambda d: d["records"][2].pop("seq_len"), "lacks ['seq_len']"),
    (lambda d: d.update(peak_bf16_tflops=-1), "peak_bf16_tflops must be a positive number"),
])
def test_validator_names_each_problem(breakage, expect):
    doc = copy.deepcopy(synthetic_gpu())
    breakage(doc)
    errs = common.validate_gpu_results(doc)
    assert any(expect in e for e in errs), errs


def test_write_json_atomic_writes_strict_json(tmp_path):
    """NaN would make the file unreadable to strict parsers: it becomes null, and the validator
    then names the record."""
    path = tmp_path / "r.json"
    doc = synthetic_gpu()
    doc["records"][1]["ms"] = float("nan")
    common.write_json_atomic(path, doc)
    back = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert back["records"][1]["ms"] is None
    assert any("record 1: ms" in e for e in common.validate_gpu_results(back))
    assert not list(tmp_path.glob("*.tmp"))


# ----------------------------------------------------------------------------- report
def test_report_renders_targets_tables_and_findings(tmp_path):
    gpu, cpu, out = tmp_path / "g.json", tmp_path / "c.json", tmp_path / "REPORT.md"
    gpu.write_text(json.dumps(synthetic_gpu()))
    cpu.write_text(json.dumps(synthetic_cpu(median_s=0.25, repro_s=200.0)))
    none = str(tmp_path / "no-workflow.json")
    assert report.main(["--gpu", str(gpu), "--cpu", str(cpu), "--workflow", none, "--out", str(out)]) == 0
    text = out.read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "PASS" in rows[report.TARGETS[0][1]] and "0.25 s" in rows[report.TARGETS[0][1]]
    assert "FAIL" in rows[report.TARGETS[1][1]] and "200 s" in rows[report.TARGETS[1][1]]
    assert "PASS" in rows[report.TARGETS[2][1]] and "2.5 s" in rows[report.TARGETS[2][1]]
    # fa3 buggy took exactly the causal time in the synthetic data -> 1.00x; fixed was scaled by the pairs
    assert "**1.00x** the time of plain causal" in text
    ratio = common.window_pairs(0, 16384, -1) / common.window_pairs(0, 16384, 1024)
    assert f"**{ratio:.1f}x** faster" in text
    assert "**3.00x** the time of fa3 fixed" in text
    assert "sdpa x1: skipped: budget" in text
    assert "fa3/hd128/swa | 100.0" in text
    assert report.main(["--gpu", str(gpu), "--cpu", str(cpu), "--workflow", none, "--out", str(out), "--check"]) == 0


def test_report_says_not_measured_when_files_are_missing(tmp_path):
    out = tmp_path / "REPORT.md"
    report.main(["--gpu", str(tmp_path / "none.json"), "--cpu", str(tmp_path / "none2.json"),
                 "--workflow", str(tmp_path / "none3.json"), "--targets", str(tmp_path / "none4.json"),
                 "--family", str(tmp_path / "none5.json"), "--out", str(out)])
    text = out.read_text()
    assert text.count("| not measured yet |") == 4 + len(targets_report.TARGETS)
    assert "Not measured yet: run `python -m benchmarks.family_audit`." in text
    assert "Not measured yet: `benchmarks/results/h200_swa_prefill.json` is missing" in text
    assert "PASS" not in text and "FAIL" not in text


def test_report_flags_a_malformed_results_file(tmp_path):
    doc = synthetic_gpu()
    doc["records"][1]["peak_fraction"] = 0.99
    text = report.render(doc, None)
    assert "The results file has problems" in text


def test_committed_results_are_well_formed_and_report_is_current():
    gpu, cpu = common.load_json(common.GPU_RESULTS), common.load_json(common.CPU_RESULTS)
    workflow = common.load_json(common.WORKFLOW_RESULTS)
    targets = common.load_json(targets_report.RESULTS)
    if gpu is not None:
        assert common.validate_gpu_results(gpu) == []
    if cpu is not None:
        assert common.validate_cpu_results(cpu) == []
    if report.REPORT.exists():
        family = common.load_json(family_audit.RESULTS)
        assert report.REPORT.read_text() == report.render(gpu, cpu, workflow, targets, family), \
            "run python -m benchmarks.report"


# ----------------------------------------------------------------------------- the GPU study, CPU side
def test_dry_run_plans_the_brief_module_set(capsys):
    args = study.build_parser().parse_args(["--dry-run", "--head-dims", "64,128"])
    plan = study.plan_study(args)
    # fa3 builds only at head_dim 128 (~100 s each); fa2 at every head_dim
    assert plan["modules"] == ["fa3/hd128/noswa", "fa3/hd128/swa", "fa2/hd64/noswa", "fa2/hd64/swa",
                               "fa2/hd128/noswa", "fa2/hd128/swa"]
    shapes = {(j.shape.seq_len, j.shape.batch, j.shape.num_qo_heads // j.shape.num_kv_heads) for j in plan["jobs"]}
    assert shapes == {(L, b, g) for L in (4096, 16384, 32768) for b in (1, 4) for g in (8, 4)}
    fa3 = [j for j in plan["jobs"] if j.backend == "fa3"]
    assert {j.shape.head_dim for j in fa3} == {128}
    # per shape: causal once, fixed and buggy per window
    assert len(fa3) == 12 * (1 + 2 * 3)
    assert all(j.window == -1 for j in fa3 if j.variant == "causal")
    assert study.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "fa3/hd128/swa" in out and "est. JIT   100 s" in out


def test_default_plan_fits_the_nine_minute_call():
    args = study.build_parser().parse_args([])
    plan = study.plan_study(args)
    assert plan["est_total_s"] < args.budget_s < 540
    assert plan["est_phase1_s"] == max(200.0, 60.0 + plan["est_flex_compile_s"])


def test_job_flops_are_recomputed_from_shapes():
    j = Job("fa3", "fixed", Shape(32768, 4, 32, 8, 128), 4096)
    assert j.flops() == 4 * 32 * common.window_pairs(0, 32768, 4096) * 4 * 128
    assert Job("fa3", "causal", j.shape, -1).flops() == 4 * 32 * (32768 * 32769 // 2) * 4 * 128
    assert j.module == "fa3/hd128/swa" and Job("fa3", "buggy", j.shape, 4096).module == "fa3/hd128/noswa"


def test_bad_arguments_say_what_to_do():
    with pytest.raises(SystemExit, match="QO:KV"):
        study.build_parser().parse_args(["--gqa", "32-4"])
    with pytest.raises(SystemExit, match="unknown"):
        study.plan_study(study.build_parser().parse_args(["--backends", "fa4"]))


def test_input_rotation_covers_several_l2s():
    l2 = 60 << 20
    assert gpu_timing.n_input_sets(1 << 30, l2) == 1
    assert gpu_timing.n_input_sets(20 << 20, l2) == 8
    assert gpu_timing.n_input_sets(100 << 20, l2) * (100 << 20) >= 2 * l2


def test_row_check_passes_the_window_and_catches_causal():
    """The study's sampled-row check against swa_repro's float64 reference attention."""
    g = torch.Generator().manual_seed(0)
    L, hq, hk, d, w = 200, 4, 2, 16, 24
    q, k, v = (torch.randn(L, h, d, generator=g) for h in (hq, hk, hk))
    good = masked_attention(q, k, v, intended_mask(0, L, w)).float()
    causal = masked_attention(q, k, v, intended_mask(0, L, -1)).float()
    ok = gpu_timing.check_rows(torch, good, q, k, v, w)
    assert ok["rel_err"] < 1e-5 and ok["nan_rows_sampled"] == 0
    assert gpu_timing.check_rows(torch, causal, q, k, v, w)["rel_err"] > 0.1
    poisoned = good.clone()
    poisoned[L - 1] = float("nan")
    bad = gpu_timing.check_rows(torch, poisoned, q, k, v, w)
    assert bad["rel_err"] is None and bad["nan_rows_sampled"] == 1
    assert {L - 1, w, w + 1} <= set(gpu_timing.sample_positions(L, w))


def test_cpu_smoke_run_writes_valid_results(tmp_path):
    """The study's orchestration end to end on CPU (sdpa only, tiny shapes; not a measurement)."""
    out = tmp_path / "r.json"
    rc = study.main(["--device", "cpu", "--backends", "sdpa", "--seq-lens", "64", "--windows", "8",
                     "--gqa", "4:2", "--head-dims", "16", "--batch", "2", "--target-s", "0.001",
                     "--no-probe", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert common.validate_gpu_results(doc) == [], common.validate_gpu_results(doc)
    assert doc["status"] == "complete" and len(doc["records"]) == 2
    for r in doc["records"]:
        assert r["rel_err"] < 2e-2 and r["nan_frac"] == 0
        assert r["useful_flops"] == common.useful_flops(64, r["batch"], 8, 4, 16)
        assert math.isclose(r["peak_fraction"], r["useful_tflops"] / doc["peak_bf16_tflops"])


@pytest.mark.gpu
def test_gpu_study_smallest_shape(tmp_path):
    pytest.importorskip("flashinfer")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = tmp_path / "r.json"
    assert study.main(["--backends", "fa2", "--seq-lens", "4096", "--windows", "128", "--gqa", "32:4",
                       "--batch", "1", "--no-probe", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert common.validate_gpu_results(doc) == []
    fixed = [r for r in doc["records"] if r["variant"] == "fixed"]
    assert fixed and all(r["rel_err"] < 1e-2 for r in fixed)
    assert np.isfinite([r["ms"] for r in doc["records"] if not r.get("error")]).all()


def test_notebook_06_helpers_on_synthetic_results():
    """What notebook 06 calls: the report's tables and pairs, the record checks, the figures."""
    from benchmarks import figures

    doc = synthetic_gpu()
    recs = doc["records"]
    assert "### What the bug costs" in "\n".join(report.cost_tables(recs))
    pairs = report.fa3_fixed_vs_buggy(recs)
    assert pairs and all(a < b for a, b in pairs)
    assert common.flops_mismatches(recs) == [] and common.rate_mismatches(recs) == []
    broken = copy.deepcopy(recs)
    broken[0]["useful_flops"] += 1
    assert common.flops_mismatches(broken) == [broken[0]]
    fig = figures.time_vs_window(recs, "synthetic")
    assert fig is not None and fig._suptitle.get_text() == "synthetic"
    assert figures.time_vs_window([dict(r, error="x") for r in recs], "none") is None
    assert figures.kernel_model_times(synthetic_cpu()).axes[0].get_xlabel() == "seconds (median)"


@pytest.mark.parametrize("argv", [["-m", "benchmarks.h200_swa_prefill"], ["benchmarks/h200_swa_prefill.py"]])
def test_study_cli_runs_as_module_and_as_file(argv):
    """The study is split over h200_plan/h200_study/h200_kernels; its CLI (and the file form its
    fa3 build child uses) still starts."""
    import subprocess

    r = subprocess.run([sys.executable, *argv, "--dry-run", "--seq-lens", "4096", "--windows", "128"],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "measurements, modules" in r.stdout and "--budget-s" in r.stdout


# ----------------------------------------------------------------------------- make repro / make test
def synthetic_workflow(repro_s=80.0, failed=None, boot_s=90.0, suite_s=150.0) -> dict:
    nbs = [{"notebook": "00_a", "status": "ok", "seconds": 30.0},
           {"notebook": "01_b", "status": "failed" if failed else "ok", "seconds": 50.0}]
    art = {"total_bytes": 9e6, "traces_bytes": 5e6, "png_bytes": 3e6, "pages_bytes": {}, "largest_page": ["01_b.html", 4e5]}
    run = lambda w, **kw: {"wall_s": w, "loadavg_before": [1.0, 1, 1], "loadavg_after": [2.0, 1, 1], "returncode": 0,  # noqa: E731
                           "date": "d", "cpu_count": 2, **kw}
    return {"reported": [{"what": "pip install of the pinned stack", "wall_s": 420, "source": "issue 12"}],
            "runs": {"bootstrap": run(boot_s, command="make venv", packages=262),
                     "suite_make": run(suite_s, command="pytest -n 2", pytest_args="-q -n 2", counts={"passed": 9}),
                     "repro_jobs2": run(repro_s, command="swa-repro run --mode model --output /x", jobs=2,
                                        notebooks=nbs, artifacts=art)}}


@pytest.mark.parametrize("repro_s, boot_s, verdicts", [(80.0, 90.0, ("PASS", "PASS")), (95.0, 200.0, ("FAIL", "FAIL"))],
                         ids=["both-pass", "both-fail"])
def test_workflow_targets_are_measured_verdicts(repro_s, boot_s, verdicts):
    wf = synthetic_workflow(repro_s=repro_s, boot_s=boot_s)
    lines = workflow_report.render_workflow(wf)
    assert lines[2].startswith(f"- **{verdicts[0]}** `make repro MODE=model` <= 90 s: {repro_s:.0f} s,")
    assert lines[3].startswith(f"- **{verdicts[1]}** `make test` from nothing <= 300 s: {boot_s + 150:.0f} s,")
    text = "\n".join(lines)
    assert "| pip install of the pinned stack | 420 | – | – | reported in issue 12, not re-measured |" in text
    assert "| 01_b | 50 |" in text and "| repro_jobs2 | 9.0 | 5.0 | 3.0 | 01_b.html 0.40 |" in text
    vals = report.target_values(None, None, wf)
    assert vals["repro_model_mode"][0] == repro_s and vals["make_test_from_nothing"][0] == boot_s + 150


def test_a_run_with_a_failed_notebook_is_not_a_measurement():
    v, how = workflow_report.repro_run(synthetic_workflow(failed=True))
    assert v is None and how.startswith("not measured: 01_b failed")
    assert "**not measured** `make repro MODE=model`" in "\n".join(workflow_report.render_workflow(synthetic_workflow(failed=True)))


def test_workflow_benchmark_reads_the_makefile_and_sizes_artifacts(tmp_path):
    from benchmarks import cpu_workflow

    assert cpu_workflow.makefile_pytest_args().startswith("-q")
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.pt").write_bytes(b"x" * 100)
    (tmp_path / "a.html").write_bytes(b"x" * 30)
    (tmp_path / "a_fig.png").write_bytes(b"x" * 7)
    sizes = cpu_workflow.artifact_sizes(tmp_path)
    assert (sizes["total_bytes"], sizes["traces_bytes"], sizes["png_bytes"], sizes["largest_page"]) == (137, 100, 7, ("a.html", 30))


# ----------------------------------------------------------------------------- issue 24's targets (measure_targets.sh)
SLOW = [(113.25, "tests/test_notebooks.py::test_notebook[04_rerun_checks]"), (64.1, "tests/test_audit.py::test_fixed[0.5.23]"),
        (58.0, "tests/test_bundle.py::test_real_bundle_installs_and_imports_under_cpython_312"),
        (54.2, "tests/test_notebooks.py::test_notebook[02_masks_and_cta_skips]"), (49.0, "tests/test_x.py::test_regression"),
        (40.3, "tests/test_notebooks.py::test_notebook[03 apply]"), (36.0, "tests/test_fix.py::test_all_fixes[0.5.20]"),
        (30.5, "tests/test_fix.py::test_all_fixes[0.5.21]"), (25.0, "tests/test_kit.py::test_kit"), (24.0, "tests/test_y.py::test_z")]


def pytest_log(passed=1290, failed=0, slow=SLOW) -> str:
    """What `make test PYTEST_ARGS='-q -n 2 --dist loadfile --durations=10'` prints (the format of a real run)."""
    rows = "\n".join(f"{s:.2f}s {'setup   ' if i == 3 else 'call    '} {t}" for i, (s, t) in enumerate(slow))
    tail = f"{passed} passed" + (f", {failed} failed" if failed else "") + ", 14 skipped, 30 deselected in 201.33s (0:03:21)"
    return (f"created: 2/2 workers\n2 workers [1320 items]\n{'.' * 70} [ 5%]\n"
            f"============================= slowest 10 durations =============================\n{rows}\n\n"
            f"(5 durations < 0.005s hidden.  Use -vv to show these durations.)\n{tail}\n")


def fake_work(tmp_path, walls, rc=None, cores=2, failed_notebook=None, logs=None) -> Path:
    """What measure_targets.sh leaves in its folder, for ``walls`` (step -> seconds)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "run.meta").write_text(f"commit=abc123def4567890\nsource_dirty=\nuv_cache=empty\ncores={cores}\n")
    for step, wall in walls.items():
        cmd = "make test 'PYTEST_ARGS=-q -n 2 --dist loadfile --durations=10'" if "test" in step or "suite" in step else "make repro"
        (work / f"{step}.meta").write_text(
            f"command={cmd}\nstart=1000.25\nend={1000.25 + wall}\nreturncode={(rc or {}).get(step, 0)}\n"
            "loadavg_before=0.10 0.20 0.30\nloadavg_after=1.50 0.90 0.40\n")
        if step in targets_report.TESTS:
            (work / f"{step}.log").write_text((logs or {}).get(step, pytest_log()))
        else:
            nbs = [{"notebook": n, "status": "failed" if n == failed_notebook else "ok", "seconds": 9.0}
                   for n in ("00_overview", "04_rerun_checks")]
            (work / f"{step}.summary.json").write_text(json.dumps({"mode": "model", "notebooks": nbs}))
            (work / f"{step}.log").write_text("2/2 notebooks ok\n")
    return work


ALL = {"make_test_from_nothing": 250.0, "suite_warm": 260.0, "repro_cold": 120.0, "repro_warm": 80.0}


def verdicts(doc) -> dict:
    return {step: targets_report.verdict(doc, step, limit)[:2] for step, _, limit in targets_report.TARGETS}


def test_pytest_output_parses_into_counts_and_the_slowest_tests():
    got = targets_report.parse_pytest(pytest_log())
    assert got["counts"] == {"passed": 1290, "skipped": 14, "deselected": 30}
    assert [(d["seconds"], d["test"]) for d in got["durations"]] == SLOW
    assert got["durations"][3]["phase"] == "setup"
    assert targets_report.parse_pytest("ERROR collecting\n2 errors in 0.5s\n")["counts"] == {"error": 2}


def test_a_fake_measurement_gives_each_target_its_verdict(tmp_path):
    doc = targets_report.collect(fake_work(tmp_path, ALL))
    assert doc["provenance"]["cores"] == 2 and doc["provenance"]["commit"] == "abc123def4567890"
    assert doc["steps"]["suite_warm"]["wall_s"] == 260.0 and doc["steps"]["suite_warm"]["loadavg_before"] == [0.1, 0.2, 0.3]
    assert verdicts(doc) == {"make_test_from_nothing": (250.0, "PASS"), "suite_warm": (260.0, "FAIL"),
                             "repro_cold": (120.0, "no target"), "repro_warm": (80.0, "PASS")}
    out = tmp_path / "targets.json"
    assert targets_report.main(["collect", str(tmp_path / "work"), "--out", str(out)]) == 0
    text = "\n".join(targets_report.render_targets24(json.loads(out.read_text())))
    assert "| `make test` from nothing: a fresh clone, no venv, empty caches | <= 300 s | 250 s | PASS | " \
           "`make test 'PYTEST_ARGS=-q -n 2 --dist loadfile --durations=10'`; load 0.1 -> 1.5; 1290 passed, " \
           "14 skipped, 30 deselected |" in text
    assert "| `make repro` warm: the second run | <= 90 s | 80 s | PASS | `make repro`; load 0.1 -> 1.5; " \
           "2 notebooks, mode model |" in text
    assert "From `pytest --durations=10` of the `suite_warm` run:" in text
    rows = [ln for ln in text.splitlines() if re.match(r"\| \d+ \| [\d.]+ \|", ln)]
    assert len(rows) == 10 and rows[0] == "| 1 | 113.2 | call | `tests/test_notebooks.py::test_notebook[04_rerun_checks]` |"
    assert rows[3].endswith("| setup | `tests/test_notebooks.py::test_notebook[02_masks_and_cta_skips]` |")
    assert "commit abc123def456," in text and "(2 cores)" in text


def test_the_report_renders_the_measurement_file(tmp_path):
    targets = tmp_path / "targets.json"
    targets_report.write(targets, targets_report.collect(fake_work(tmp_path, ALL)))
    out, none = tmp_path / "REPORT.md", str(tmp_path / "none.json")
    assert report.main(["--gpu", none, "--cpu", none, "--workflow", none, "--targets", str(targets), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## Issue #24 targets: a fresh clone, the real make commands" in text
    assert "| the suite warm: `make test` again in that clone (venv and caches warm) | <= 240 s | 260 s | FAIL |" in text


@pytest.mark.parametrize("walls, kw, step, expect", [
    ({k: v for k, v in ALL.items() if k != "repro_warm"}, {}, "repro_warm", (None, "not measured yet")),
    (ALL, {"rc": {"make_test_from_nothing": 2}}, "make_test_from_nothing", (250.0, "FAIL")),
    (ALL, {"logs": {"make_test_from_nothing": pytest_log(passed=1289, failed=1)}}, "make_test_from_nothing", (250.0, "FAIL")),
    (ALL, {"logs": {"make_test_from_nothing": "make: *** [Makefile] Error 1\n"}}, "make_test_from_nothing", (250.0, "FAIL")),
    (ALL, {"failed_notebook": "04_rerun_checks"}, "repro_warm", (80.0, "FAIL")),
    (ALL, {"cores": 4}, "repro_warm", (80.0, "not comparable (4 cores)")),
    (ALL, {"cores": 4}, "make_test_from_nothing", (250.0, "not comparable (4 cores)")),
], ids=["step-not-run", "make-failed", "a-test-failed", "no-pytest-summary", "a-notebook-failed", "4-cores", "4-cores-test"])
def test_no_pass_without_a_measurement_of_the_target(tmp_path, walls, kw, step, expect):
    """Only a measured step, on 2 cores, exit 0, every test (notebook) passing, within the limit, is a PASS."""
    doc = targets_report.collect(fake_work(tmp_path, walls, **kw))
    assert verdicts(doc)[step] == expect


def test_no_measurement_file_or_a_broken_record_is_never_a_pass():
    text = "\n".join(targets_report.render_targets24(None))
    assert "PASS" not in text and "FAIL" not in text and text.count("| not measured yet |") == 4
    assert "Not measured yet: from `pytest --durations=10`" in text
    broken = {"provenance": {"cores": 2}, "steps": {"repro_warm": {"wall_s": None, "returncode": 0}}}
    assert targets_report.verdict(broken, "repro_warm", 90.0)[:2] == (None, "not measured")


def test_measure_targets_runs_the_real_make_commands_in_a_fresh_clone():
    script = Path(report.ROOT) / "benchmarks" / "measure_targets.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    r = subprocess.run(["bash", str(script)], env={**os.environ, "DRY_RUN": "1", "WORK": "/w"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    pytest_args = re.search(r"(?m)^PYTEST_ARGS\s*\?=\s*(.*)$", (Path(report.ROOT) / "Makefile").read_text()).group(1).strip()
    assert r.stdout.splitlines() == [
        f"make_test_from_nothing: (cd /w/clone && make test 'PYTEST_ARGS={pytest_args} --durations=10')",
        f"suite_warm: (cd /w/clone && make test 'PYTEST_ARGS={pytest_args} --durations=10')",
        "repro_cold: (cd /w/clone && make repro PYTHONPYCACHEPREFIX=/w/pycache-repro)",
        "repro_warm: (cd /w/clone && make repro PYTHONPYCACHEPREFIX=/w/pycache-repro)",
        f"collect: python3 {report.ROOT}/benchmarks/targets_report.py collect /w --out "
        f"{report.ROOT}/benchmarks/results/issue24_targets.json"]
    assert [t[0] for t in targets_report.TARGETS] == re.search(r"STEPS=\(([^)]*)\)", script.read_text()).group(1).split()


def test_measure_targets_times_each_step_and_collects_them(tmp_path):
    """The script for real, its `make` a stand-in on PATH (the real one takes ~20 minutes): a fresh
    clone, the four steps in order, each timed with its exit status, then the measurement file."""
    script = Path(report.ROOT) / "benchmarks" / "measure_targets.sh"
    bin_dir, log = tmp_path / "bin", tmp_path / "make-calls"
    bin_dir.mkdir()
    (tmp_path / "pytest.log").write_text(pytest_log())
    (bin_dir / "make").write_text(f"""#!/bin/bash
echo "$PWD $* XDG_CACHE_HOME=$XDG_CACHE_HOME" >> {log}
case "$1" in
  test) cat {tmp_path / 'pytest.log'}; sleep 0.3 ;;
  repro) mkdir -p artifacts; echo '{{"mode": "model", "notebooks": [{{"notebook": "00_overview", "status": "ok"}}]}}' \\
           > artifacts/summary.json ;;
esac
""")
    (bin_dir / "make").chmod(0o755)
    out, work = tmp_path / "targets.json", tmp_path / "work"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "WORK": str(work), "KEEP_WORK": "1"}
    r = subprocess.run(["bash", str(script), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == [str(work / "clone")] * 4
    assert [c.split()[1] for c in calls] == ["test", "test", "repro", "repro"]
    assert "XDG_CACHE_HOME=" + str(work / "cache") in calls[0] and str(work / "cache-repro") in calls[2]
    doc = json.loads(out.read_text())
    head = subprocess.run(["git", "-C", str(report.ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert doc["provenance"]["commit"] == head and doc["provenance"]["cores"] == len(os.sched_getaffinity(0))  # what taskset allows
    steps = doc["steps"]
    assert list(steps) == targets_report.STEPS and all(s["returncode"] == 0 for s in steps.values())
    assert steps["suite_warm"]["wall_s"] >= 0.3 and steps["suite_warm"]["counts"]["passed"] == 1290
    assert len(steps["make_test_from_nothing"]["durations"]) == 10
    assert steps["repro_warm"]["notebooks"] == [{"notebook": "00_overview", "status": "ok", "seconds": None,
                                                 "checks_passed": None, "checks_failed": None}]


@pytest.mark.parametrize("wall, rc, cores, verdict", [(50.0, 0, 2, "PASS"), (61.0, 0, 2, "FAIL"), (50.0, 1, 2, "PASS"),
                                                      (50.0, 2, 2, "exit 2"), (50.0, 0, 4, "not on 2 cores")])
def test_family_audit_section_passes_only_a_measured_run_on_2_cores_within_the_limit(wall, rc, cores, verdict):
    run = {"command": "swa-repro audit", "nice": 19, "wall_s": wall, "returncode": rc, "cpu_s": 40.0,
           "result_cache": "off", "loadavg_before": [4.0, 0, 0], "loadavg_after": [5.0, 0, 0]}
    doc = {"provenance": {"command": "python -m benchmarks.family_audit", "commit": "abc", "date": "d", "cpu": "x",
                          "cpu_count": cores}, "runs": {"one_release": run}}
    text = "\n".join(family_audit.render(doc))
    assert f"| <= 60 s | {wall:.0f} s | {verdict} |" in text and "load average 4.0 -> 5.0" in text
    assert "| <= 600 s | – | not measured |" in text and "Not measured yet" in "\n".join(family_audit.render(None))
