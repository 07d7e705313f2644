"""`swa-repro mask` writes what the model says: intervals by default (.npz / .json), the old dense
``mask_i`` + ``status`` layout with ``--dense``; both read back equal to the kernel model."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from swa_repro.core.case import Case
from swa_repro.core.versions import FLASHINFER_VERSIONS
from swa_repro.kernel import mask_cmd
from swa_repro.kernel.model import model_intervals, simulate

CASES = {
    "fa2 leak, 2 requests": Case(prefix_lens=(0, 8), extend_lens=(8, 8)),
    "fa2 gqa4 split-KV undefined": Case(prefix_lens=(0, 40, 0), extend_lens=(200, 7, 300), num_qo_heads=8,
                                        num_kv_heads=2, window_left=16, page_size=1),
    "fa3 causal, gqa2": Case(prefix_lens=(3,), extend_lens=(9,), num_qo_heads=4, num_kv_heads=2, backend="fa3"),
    "fa2 fixed (plan window)": Case(prefix_lens=(5, 0), extend_lens=(6, 1), window_left=3, plan_window_left=3),
    "no window": Case(prefix_lens=(2,), extend_lens=(5,), window_left=-1),
}


def _args(case: Case, out, dense=False) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    mask_cmd.register(sub)
    argv = ["mask", "--out", str(out), "--backend", case.backend, "--window-left", str(case.window_left),
            "--plan-window-left", str(case.plan_window_left), "--prefix-lens", ",".join(map(str, case.prefix_lens)),
            "--extend-lens", ",".join(map(str, case.extend_lens)), "--num-qo-heads", str(case.num_qo_heads),
            "--num-kv-heads", str(case.num_kv_heads), "--page-size", str(case.page_size)]
    return p.parse_args(argv + (["--dense"] if dense else []))


@pytest.mark.parametrize("name", list(CASES))
def test_dense_union_equals_interval_mask(name):
    for r in simulate(CASES[name]).requests:
        assert np.array_equal(mask_cmd.dense_union(r.intervals), r.intervals.mask())


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("ext", ["npz", "json"])
def test_interval_output_reads_back_as_the_model(name, ext, tmp_path, capsys):
    case = CASES[name]
    out = tmp_path / f"m.{ext}"
    assert mask_cmd.main(_args(case, out)) == 0
    res, want = simulate(case), model_intervals(case)
    if ext == "npz":
        z = np.load(out)  # no pickle needed
        meta = json.loads(str(z["meta"]))
        got = [(z[f"lo_{i}"], z[f"hi_{i}"]) for i in range(case.batch_size)]
        status, reason = list(z["status"]), list(z["reason"])
        assert list(z["extend_lens"]) == list(case.extend_lens) and list(z["prefix_lens"]) == list(case.prefix_lens)
    else:
        meta = json.loads(out.read_text())
        got = [(np.array(r["lo"]), np.array(r["hi"])) for r in meta["requests"]]
        status, reason = [r["status"] for r in meta["requests"]], [r["reason"] for r in meta["requests"]]
    assert meta["format"] == mask_cmd.FORMAT and Case.from_dict(meta["case"]) == case
    assert meta["provenance"]["flashinfer_modelled"] == case.flashinfer_version
    assert status == res.statuses and reason == [r.reason for r in res.requests]
    for (lo, hi), iv in zip(got, want):
        assert lo.dtype == (np.int32 if ext == "npz" else np.int64) and lo.shape == (iv.extend_len, case.num_qo_heads)
        assert np.array_equal(lo, iv.lo) and np.array_equal(hi, iv.hi)
    assert json.loads(capsys.readouterr().out)["output"] == "intervals"


@pytest.mark.parametrize("name", list(CASES))
def test_dense_output_keeps_the_old_keys(name, tmp_path, capsys):
    """--dense: ``mask_i`` (bool, union over heads) and ``status``, as the command wrote before."""
    case = CASES[name]
    out = tmp_path / "m.npz"
    assert mask_cmd.main(_args(case, out, dense=True)) == 0
    z = np.load(out)
    res = simulate(case)
    assert sorted(z.files) == sorted(["status", *(f"mask_{i}" for i in range(case.batch_size))])
    assert list(z["status"]) == res.statuses
    for i, r in enumerate(res.requests):
        assert z[f"mask_{i}"].dtype == bool and np.array_equal(z[f"mask_{i}"], r.mask())
    assert json.loads(capsys.readouterr().out)["output"] == "dense"


def test_dense_limit_is_the_stated_one():
    """A 32k request is exactly 2**30 cells: allowed; one more row is refused, nothing run."""
    ok = Case(prefix_lens=(0,), extend_lens=(32768,))
    mask_cmd.check_dense(ok, "m.npz")
    with pytest.raises(Exception, match="drop --dense"):
        mask_cmd.check_dense(ok.with_(prefix_lens=(1,)), "m.npz")


def test_flashinfer_version_help_lists_every_modelled_version():
    """The help is computed from versions.FLASHINFER_VERSIONS, so a newly modelled version shows."""
    p = argparse.ArgumentParser()
    mask_cmd.register(p.add_subparsers())
    [sub] = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    [action] = [a for a in sub.choices["mask"]._actions if "--flashinfer-version" in a.option_strings]
    listed = action.help.split(": ", 1)[1].split(" | ")
    assert listed == list(FLASHINFER_VERSIONS) and len(listed) > 2


@pytest.mark.parametrize("version", FLASHINFER_VERSIONS)
def test_model_mode_says_what_backs_the_version(version, tmp_path, monkeypatch, capsys):
    """`mask --mode model` names the committed real-kernel runs of the version, or says it rests
    on the sources alone (read from the tree: a version becomes backed by committing its runs)."""
    from swa_repro.core.versions import RECORDINGS_ROOT

    runs = [p for d in (RECORDINGS_ROOT / version, RECORDINGS_ROOT / "fuzz" / version) if d.is_dir()
            for p in d.glob("*.json") if not p.name.endswith(".report.json")]
    p = argparse.ArgumentParser()
    mask_cmd.register(p.add_subparsers())
    a = p.parse_args(["mask", "--mode", "model", "--prefix-lens", "0", "--extend-lens", "40", "--num-qo-heads", "2",
                      "--num-kv-heads", "2", "--head-dim", "128", "--window-left", "8",
                      "--flashinfer-version", version, "--out", str(tmp_path / "m.json")])
    assert a.func(a) == 0
    said = json.loads(capsys.readouterr().out)["evidence"]
    assert ("held to real-kernel recordings" in said) == bool(runs), said
    assert ("modelled from source; no real-kernel recording" in said) == (not runs)
    assert json.loads((tmp_path / "m.json").read_text())["provenance"]["evidence"] == said
