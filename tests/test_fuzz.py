"""``swa-repro fuzz``: the random case generator, the comparison rule, storage, and the whole live
pipeline on CPU, where attention computed from masks (``probe.mask_attention_fn``) stands in for
the kernel: with the model's masks everything agrees; with wrong masks the fuzz must say so.
The committed fuzz recordings (``recordings/fuzz/<version>/``, made on an H200) hold the model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from swa_repro.core.case import Case
from swa_repro.core.errors import UsageError
from swa_repro.core.intervals import Intervals
from swa_repro.core.versions import FLASHINFER_VERSIONS
from swa_repro.evidence import fuzz_cases as fc
from swa_repro.evidence.fuzz import FUZZ_ROOT, model_stand_in, run_and_store, selftest_probe
from swa_repro.evidence.fuzz_compare import compare_case, reproduce_cli
from swa_repro.evidence.fuzz_report import build_report
from swa_repro.evidence.fuzz_store import (Observed, decode_case, encode_case, find_runs, load_run, observed_from_probe,
                                          write_run)
from swa_repro.kernel.model import simulate
from swa_repro.kernel.probe import mask_attention_fn, model_masks, probe_from_attention_fn

SMALL = dict(max_len=40, max_tokens=120, max_batch=3)
RANDOM = fc.generate(11, 6, **SMALL)
WRONG = fc.generate(12, 4, **SMALL)
# fa2 split-KV over a batch: request 0 is undefined in the model (partial-output strides differ)
SPLIT = Case(prefix_lens=(300, 5), extend_lens=(4, 3), window_left=8, num_qo_heads=2, num_kv_heads=1, head_dim=64,
             page_size=7, name="split_page7")
DOC = {"mode": "selftest", "flashinfer_version": "0.7.2.post1", "args": {"seed": 11},
       "provenance": {"command": "pytest"}, "jit_prebuild": {}}


def _id(c: Case) -> str:
    return (f"{c.name}-{c.backend}-g{c.group_size}-hd{c.head_dim}-p{c.page_size}-w{c.window_left}"
            f"-{'fix' if c.plan_window_left >= 0 else 'bug'}-b{c.batch_size}")


def _probe(case, masks=None):
    return probe_from_attention_fn(case, model_stand_in(case, masks), repeats=2, random_runs=1)


def _compare(case, masks=None):
    return compare_case(case, [observed_from_probe(r) for r in _probe(case, masks).requests])


# ----------------------------------------------------------------------------- generator
def test_generator_is_deterministic_and_honours_restrictions():
    a, b = fc.generate(7, 40), fc.generate(7, 40)
    assert a == b and [c.name for c in a] == [c.name for c in b]
    assert a != fc.generate(8, 40)
    r = fc.generate(7, 40, backends=("fa2",), head_dims=(128,), flashinfer_version="0.6.12")
    assert {c.backend for c in r} == {"fa2"} and {c.head_dim for c in r} == {128}
    assert {c.flashinfer_version for c in r} == {"0.6.12"}
    assert fc.module_labels(r) == ["fa2/hd128/use_swa_False", "fa2/hd128/use_swa_True"]
    assert all(sum(c.kv_lens) <= 6144 and max(c.extend_lens + c.prefix_lens) <= 2048 for c in a)


def test_axes_covered_by_300_cases():
    cases = fc.generate(0, 300)
    ax = fc.axes_covered(cases)
    assert all(sum(v.values()) == 300 for v in ax.values())
    assert set(ax["group"]) == {str(g) for g in range(1, 9)}
    assert set(ax["head_dim"]) == {"64", "128", "256"} and set(ax["backend"]) == {"fa2", "fa3"}
    assert set(ax["window_class"]) == {"0", "<kv", ">=kv"}
    assert set(ax["split_kv_allowed"]) == {"True", "False"} and set(ax["plan_variant"]) == {"bug", "fix"}
    assert {"1", "7", "16"} <= set(ax["page_size"]) and set(ax["max_kv"]) == {"<=128", "<=1024", ">1024"}
    statuses = {s for c in cases for s in simulate(c).statuses}
    assert statuses == {"exact", "leak", "undefined"}
    assert {simulate(c).plan.split_kv for c in cases if c.resolved_backend == "fa2"} == {True, False}


@pytest.mark.parametrize("text, fa2, fa3, auto", [
    ("bug,fix", ("bug", "fix"), ("bug", "fix"), ("bug", "fix")),
    ("fix", ("fix",), ("fix",), ("fix",)),
    ("fa3:bug", ("bug", "fix"), ("bug",), ("bug",)),
    ("bug,fa3:fix,auto:bug", ("bug",), ("fix",), ("bug",)),
])
def test_parse_plans(text, fa2, fa3, auto):
    assert fc.parse_plans(text) == {"fa2": fa2, "fa3": fa3, "auto": auto}


@pytest.mark.parametrize("text", ["", "fa2:", "fa9:bug", "bug,maybe"])
def test_parse_plans_refuses(text):
    with pytest.raises(UsageError):
        fc.parse_plans(text)


@pytest.mark.parametrize("text", ["fa3:bug", "fa3:fix", "bug", "fa2:fix,fa3:bug"])
def test_pinned_plans_change_only_the_pinned_variant(text):
    """Pinning a variant keeps every other draw (the same cases, minus the other variant's JIT builds)."""
    plans = fc.parse_plans(text, ("fa2", "fa3", "auto"))
    free = fc.generate(4, 120, backends=("fa2", "fa3", "auto"))
    pinned = fc.generate(4, 120, backends=("fa2", "fa3", "auto"), plans=plans)
    for a, b in zip(free, pinned):
        assert a.with_(plan_window_left=b.plan_window_left) == b
        variant = "bug" if b.plan_window_left < 0 else "fix"
        assert variant in plans[b.backend]
        if len(plans[b.backend]) == 2:
            assert a == b
    labels = fc.module_labels(pinned)
    assert len(labels) < len(fc.module_labels(free))


@pytest.mark.parametrize("kw", [dict(n=0), dict(backends=("fa4",)), dict(head_dims=(96,)), dict(max_tokens=1)])
def test_generator_bad_input_is_usage_error(kw):
    with pytest.raises(UsageError):
        fc.generate(0, **{"n": 3, **kw})


# ----------------------------------------------------------------------------- live pipeline on CPU
@pytest.mark.parametrize("case", RANDOM + [SPLIT], ids=_id)
def test_model_masks_as_kernel_agree(case):
    c = _compare(case)
    assert c.disagreements == [], c.disagreements[0]
    assert c.comparisons == c.agreements == case.batch_size * case.num_qo_heads
    assert c.kernel_statuses == c.model_statuses == simulate(case).statuses


def test_split_case_is_undefined_in_model_and_broken_in_probe():
    c = _compare(SPLIT)
    assert c.model_statuses == ["undefined", "exact"] and c.kernel_statuses == ["undefined", "exact"]


def _one_extra_key(case):
    """The model's masks with one key changed in request 0 head 0: a key before the window of the
    row that starts latest, else a future key, else an in-window key dropped."""
    masks = [m.copy() for m in model_masks(case)]
    m = masks[0][0]  # (qo, kv)
    lo = m.argmax(1)
    q = int(lo.argmax())
    if lo[q] > 0:
        m[q, lo[q] - 1] = True
    elif case.extend_lens[0] > 1:
        m[0, case.prefix_lens[0] + 1] = True
    else:
        m[0, case.prefix_lens[0]] = False
    return masks


@pytest.mark.parametrize("case", WRONG, ids=_id)
def test_one_wrong_key_is_a_disagreement(case):
    c = _compare(case, _one_extra_key(case))
    assert len(c.disagreements) == 1 and c.agreements < c.comparisons
    d = c.disagreements[0]
    assert d["request"] == 0 and 0 in d["heads"]
    assert Case.from_dict(d["case"]) == case and d["reproduce"].startswith("swa-repro mask --mode live")


def test_masks_of_another_window_disagree():
    case = Case(prefix_lens=(20, 0), extend_lens=(9, 12), window_left=4, plan_window_left=4, head_dim=64, name="w4")
    other = model_masks(case.with_(window_left=6, plan_window_left=6))
    c = _compare(case, other)
    assert [d["kind"] for d in c.disagreements] == ["mask differs", "mask differs"]
    assert c.agreements == 0 and "model keys [" in c.disagreements[0]["detail"]


def test_clean_output_where_model_says_undefined_disagrees():
    res = probe_from_attention_fn(SPLIT, mask_attention_fn(SPLIT, model_masks(SPLIT)), repeats=2, random_runs=1)
    c = compare_case(SPLIT, [observed_from_probe(r) for r in res.requests])
    assert [(d["request"], d["kind"]) for d in c.disagreements] == [(0, "model says undefined, kernel looked defined")]


# ----------------------------------------------------------------------------- storage
def _observed(case, cols: str):
    """Hand-made observations whose columns reduce to ``cols``; row 0 sees nothing."""
    out = []
    for p, e in zip(case.prefix_lens, case.extend_lens):
        iv = Intervals.intended(p, e, case.window_left, case.num_qo_heads)
        lo, hi = iv.lo.copy(), iv.hi.copy()
        lo[0, :] = hi[0, :] = -1
        flags = np.zeros_like(lo, np.uint8)
        if cols == "one":
            flags[-1, :] = 8
        elif cols == "group":
            flags[-1, 0::case.group_size] = 8  # head-in-group 0 of every KV head
        else:
            lo[-1, -1] = 0  # only the last query head
        out.append(Observed(Intervals(p, e, lo, hi), "undefined", "why", flags))
    return out


@pytest.mark.parametrize("kv_heads,cols", [(1, "one"), (2, "group"), (2, "all")])
def test_storage_round_trip(kv_heads, cols):
    case = Case(prefix_lens=(5, 0), extend_lens=(4, 3), window_left=2, num_qo_heads=4, num_kv_heads=kv_heads,
                head_dim=64, name="rt")
    obs = _observed(case, cols)
    entry, arrays = encode_case(3, case, obs, {"plan_info": {"split_kv": True}})
    assert entry["cols"] == cols
    assert arrays["c3_dlo"].shape == (7, {"one": 1, "group": case.group_size, "all": 4}[cols])
    back = decode_case(json.loads(json.dumps(entry)), arrays)
    assert back.index == 3 and back.case == case and back.entry["plan_info"] == {"split_kv": True}
    for a, b in zip(obs, back.observed):
        assert a.intervals.equals(b.intervals) and np.array_equal(a.flags, b.flags)
        assert np.array_equal(a.intervals.lo, b.intervals.lo) and (a.status, a.reason) == (b.status, b.reason)


def test_run_and_store_then_replay(tmp_path):
    cases = RANDOM[:3] + [SPLIT.with_(name="fuzz_split")]
    rep, path = run_and_store(cases, selftest_probe, tmp_path / "0.7.2.post1" / "fuzz-test", DOC, log=lambda s: None)
    assert rep["disagreement_count"] == 0 and rep["cases"] == 4 and rep["agreements"] == rep["comparisons"] > 0
    assert rep["statuses"]["kernel"]["undefined"] >= 1
    assert find_runs(tmp_path / "0.7.2.post1") == [path]
    assert path.stat().st_size + path.with_suffix(".npz").stat().st_size < 60_000
    replay = build_report([load_run(path)], "model", {})
    for k in ("cases", "requests", "comparisons", "agreements", "disagreement_count", "axes_covered", "statuses"):
        assert replay[k] == rep[k], k


def test_failed_and_budget_cases_are_reported(tmp_path):
    def boom(case):
        if case.name == RANDOM[1].name:
            raise RuntimeError("CUDA error: boom")
        return selftest_probe(case)
    rep, _ = run_and_store(RANDOM[:2], boom, tmp_path / "f", DOC, log=lambda s: None)
    assert rep["cases_failed"] == 1 and "boom" in rep["failed"][0]["error"]
    rep, _ = run_and_store(RANDOM[:2], selftest_probe, tmp_path / "b", DOC, budget_s=1e-9, log=lambda s: None)
    assert rep["cases"] == 0 and rep["not_probed"] == [0, 1] and rep["comparisons"] == 0


# ----------------------------------------------------------------------------- CLI
def test_cli_selftest_then_model_replay(cli, tmp_path):
    """selftest writes a clean 0.7.2.post1 recording (exit 0); a wrong 0.6.12 one is added; the
    model replay over both reports the disagreement with its reproducer (exit 1)."""
    out = tmp_path / "rec" / "0.7.2.post1"
    r = cli("fuzz", "--mode", "selftest", "--cases", "2", "--seed", "4", "--max-len", "24", "--out", str(out))
    assert r.returncode == 0, r.stderr + r.stdout
    assert "axes covered" in r.stdout and "2 cases" in r.stdout
    rep = json.loads(next(out.glob("*.report.json")).read_text())
    assert rep["agreements"] == rep["comparisons"] > 0 and rep["provenance"]["command"].startswith("swa-repro fuzz")
    case = WRONG[0].with_(flashinfer_version="0.6.12")
    obs = [observed_from_probe(r) for r in _probe(case, _one_extra_key(case)).requests]
    entry, arrays = encode_case(0, case, obs, {})
    write_run(tmp_path / "rec" / "0.6.12" / "fuzz-wrong", {**DOC, "flashinfer_version": "0.6.12"}, [entry], arrays)
    r = cli("fuzz", "--mode", "model", "--recordings", str(tmp_path / "rec"), "--report", str(tmp_path / "r.json"))
    assert r.returncode == 1, r.stderr + r.stdout
    assert "DISAGREE 0.6.12 " + case.name in r.stdout and "reproduce: swa-repro mask --mode live" in r.stdout
    replay = json.loads((tmp_path / "r.json").read_text())
    assert replay["by_version"]["0.7.2.post1"]["agreements"] == rep["comparisons"]
    assert replay["by_version"]["0.6.12"]["disagreements"] == replay["disagreement_count"] == 1


def test_live_glue_with_a_failed_jit_build(monkeypatch, tmp_path, capsys):
    """--mode live without a GPU: the device, the JIT and probe_case replaced (model stand-in);
    a case whose module failed to build fails at once, the others are probed and compared."""
    from swa_repro.evidence import fuzz
    from swa_repro.kernel import live, probe

    monkeypatch.setattr(fuzz, "_device", lambda a: ("0.6.12", 132, (9, 0)))
    monkeypatch.setattr(fuzz, "provenance", lambda: {"command": "swa-repro fuzz"})
    monkeypatch.setattr(live, "module_uri", lambda backend, args: f"{backend}_hd{args[5]}_swa{args[7]}")
    monkeypatch.setattr(live, "prebuild_modules", lambda keys, workers, jobs: {
        live.module_uri(k[0], k[1:]): "error: nvcc" if k[0] == "fa3" else 1.0 for k in keys})
    monkeypatch.setattr(live, "jit_library_bytes", lambda uris: {u: 7 for u in uris})
    monkeypatch.setattr(probe, "probe_case", lambda case, repeats, random_runs: selftest_probe(case))
    ns = lambda *extra: fuzz_args(["--mode", "live", "--cases", "4", "--seed", "2", "--max-len", "24",  # noqa: E731
                                   "--out", str(tmp_path), *extra])
    assert fuzz.main(ns("--prebuild-only")) == 1 and not list(tmp_path.iterdir())
    assert fuzz.main(ns("--jit-jobs", "12")) == 1
    rep = json.loads(next(tmp_path.glob("*.report.json")).read_text())
    jit = json.loads(next(p for p in tmp_path.glob("*.json") if ".report." not in p.name).read_text())["jit_prebuild"]
    assert jit["jobs"] == 12 and jit["cpu_seconds"] >= 0 and jit["library_bytes"] == {u: 7 for u in jit["modules"]}
    cases = fc.generate(2, 4, max_len=24, max_tokens=6144, max_batch=6)
    assert rep["cases_failed"] == sum(c.backend == "fa3" for c in cases) > 0
    assert all("JIT build of fa3" in f["error"] for f in rep["failed"])
    assert rep["cases_compared"] == 4 - rep["cases_failed"] and rep["disagreement_count"] == 0
    assert "FAILED" in capsys.readouterr().out


def fuzz_args(argv):
    import argparse

    from swa_repro.evidence import fuzz

    p = argparse.ArgumentParser()
    fuzz.register(p.add_subparsers())
    return p.parse_args(["fuzz", *argv])


@pytest.mark.parametrize("args", [("--backends", "fa9"), ("--head-dims", "96"), ("--cases", "0"),
                                  ("--flashinfer-version", "9.9"), ("--mode", "model", "--recordings", "/nonexistent")])
def test_cli_bad_input_exit_2_nothing_written(cli, tmp_path, args):
    r = cli("fuzz", "--mode", "selftest", "--out", str(tmp_path / "o"), "--report", str(tmp_path / "r.json"), *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- committed evidence
def _committed(version):
    paths = find_runs(FUZZ_ROOT / version)
    if not paths:
        pytest.skip(f"no fuzz recordings for flashinfer {version} under recordings/fuzz/{version}/ yet: "
                    f"run `bash scripts/gpu_fuzz.sh {version}` on an H200")
    return [load_run(p) for p in paths]


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
def test_committed_fuzz_recordings_hold_the_model(version):
    runs = _committed(version)
    for run in runs:
        p = run.doc["provenance"]
        for key in ("gpu", "driver", "torch", "flashinfer", "date_utc", "command"):
            assert p.get(key), f"{run.path}: provenance lacks {key}"
        assert p["command"].startswith("swa-repro fuzz") and run.doc["mode"] == "live"
        assert p["flashinfer"]["version"] == version == run.flashinfer_version
        assert all(e.get("source", "").startswith("flashinfer") for e in run.doc["cases"] if "error" not in e)
    rep = build_report(runs, "model", {})
    assert rep["disagreements"] == [] and rep["failed"] == []
    assert rep["agreements"] == rep["comparisons"] > 0
    big = version in ("0.6.12", "0.7.2.post1")
    assert rep["cases"] >= (200 if big else 50)
    cases = [Case.from_dict(e["case"]) for run in runs for e in run.doc["cases"]]
    backends = {c.resolved_backend for c in cases}
    assert backends == {"fa2", "fa3"}, f"{version}: real-kernel runs must cover fa2 and fa3; got {backends}"
    assert {c.plan_window_left >= 0 for c in cases if c.resolved_backend == "fa2"} == {False, True}
    for backend in ("fa2", "fa3"):
        dims = {c.head_dim for c in cases if c.resolved_backend == backend}
        assert dims >= ({64, 128, 256} if big else {128}), f"{version} {backend}: head dims {dims}"


def test_fuzz_recording_folders_are_modelled_versions():
    """A committed fuzz folder of a version the model does not know would never be tested."""
    folders = {p.name for p in FUZZ_ROOT.glob("[0-9]*") if p.is_dir()} if FUZZ_ROOT.exists() else set()
    assert folders <= set(FLASHINFER_VERSIONS), folders - set(FLASHINFER_VERSIONS)


@pytest.mark.parametrize("case", fc.generate(5, 8) + [SPLIT.with_(disable_split_kv=True)], ids=_id)
def test_reproducer_line_parses_back_to_the_case(case):
    import argparse
    import shlex

    from swa_repro.kernel import mask_cmd

    argv = shlex.split(reproduce_cli(case))
    assert argv[:4] == ["swa-repro", "mask", "--mode", "live"]
    p = argparse.ArgumentParser()
    p.add_argument("--mode")
    p.add_argument("--out")
    mask_cmd.add_case_args(p)
    assert mask_cmd.case_from_args(p.parse_args(argv[2:])) == case


def _fake_device(monkeypatch, installed: str):
    """A GPU that reports flashinfer ``installed`` on an sm90 part (no CUDA needed)."""
    import types

    import torch

    import swa_repro.kernel.live as live

    monkeypatch.setattr(live, "require_cuda", lambda: None)
    monkeypatch.setattr(live, "installed_flashinfer_version", lambda: installed)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: types.SimpleNamespace(multi_processor_count=132))


@pytest.mark.parametrize("named,expect", [(None, "nearest modelled: 0.6.12"), ("0.6.12", "0.6.12")],
                         ids=["unnamed-refused", "named-nearest-held"])
def test_unmodelled_installed_flashinfer_is_held_to_the_named_model(monkeypatch, named, expect):
    import argparse

    from swa_repro.core.errors import UsageError
    from swa_repro.evidence import fuzz

    _fake_device(monkeypatch, "0.6.13")
    a = argparse.Namespace(flashinfer_version=named, backends=("fa2",))
    if named is None:
        with pytest.raises(UsageError, match=expect):
            fuzz._device(a)
        return
    version, sms, arch = fuzz._device(a)
    assert (version, a.installed_flashinfer, sms, arch) == ("0.6.12", "0.6.13", 132, (9, 0))


def test_a_modelled_installed_flashinfer_must_match_the_named_one(monkeypatch):
    import argparse

    from swa_repro.core.errors import UsageError
    from swa_repro.evidence import fuzz

    _fake_device(monkeypatch, "0.6.14")
    with pytest.raises(UsageError, match="0.6.14 is installed"):
        fuzz._device(argparse.Namespace(flashinfer_version="0.6.12", backends=("fa2",)))
