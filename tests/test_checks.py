"""Checks: PASS/FAIL lines, the JSON record the runner reads back, AssertionError on failure."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from swa_repro.notebook.checks import Checks, read_checks


def test_all_pass_writes_json_and_does_not_raise(tmp_path, capsys):
    c = Checks("00_demo", tmp_path / "out")  # the output dir is created
    assert c.expect(np.int64(3) == 3, "numpy bool") is True
    assert c.expect(torch.tensor(True), "0-d torch bool", n=torch.tensor(5)) is True
    c.close()
    out = capsys.readouterr().out
    assert "PASS numpy bool" in out and "PASS 0-d torch bool" in out
    doc = json.loads((tmp_path / "out" / "00_demo.checks.json").read_text())
    assert (doc["passed"], doc["failed"], doc["closed"]) == (2, 0, True)
    assert [it["what"] for it in doc["items"]] == ["numpy bool", "0-d torch bool"]
    assert doc["items"][1]["details"] == {"n": 5}


def test_failures_are_listed_and_raise(tmp_path, capsys):
    c = Checks("01_demo", tmp_path)
    c.expect(True, "fine")
    assert c.expect(np.array([1, 2]).sum() == 4, "sum is 4", got=np.array([1, 2])) is False
    c.expect(1 > 2, "one above two")
    with pytest.raises(AssertionError, match=r"2 of 3 checks failed in 01_demo: sum is 4; one above two"):
        c.close()
    out = capsys.readouterr().out
    assert "FAIL sum is 4  got=array([1, 2])" in out
    doc = read_checks(tmp_path, "01_demo")
    assert (doc["passed"], doc["failed"]) == (1, 2)
    assert doc["items"][1] == {"ok": False, "what": "sum is 4", "details": {"got": [1, 2]}}


def test_record_is_written_before_close_and_stale_record_is_replaced(tmp_path):
    (tmp_path / "02_demo.checks.json").write_text(json.dumps({"passed": 9, "failed": 9, "items": []}))
    c = Checks("02_demo", tmp_path)
    assert read_checks(tmp_path, "02_demo")["passed"] == 0  # the old run's record is gone
    c.expect(False, "crashes after this")
    doc = read_checks(tmp_path, "02_demo")  # a notebook that dies here still leaves its checks
    assert (doc["failed"], doc["closed"]) == (1, False)


def test_large_arrays_and_nan_stay_valid_json(tmp_path):
    c = Checks("03_demo", tmp_path)
    c.expect(True, "big", arr=np.zeros((100, 100)), x=float("nan"))
    text = (tmp_path / "03_demo.checks.json").read_text()
    details = json.loads(text)["items"][0]["details"]  # strict JSON: no NaN literal
    assert details == {"arr": "<array shape=(100, 100) dtype=float64>", "x": "nan"}


def test_context_manager_closes(tmp_path):
    with pytest.raises(AssertionError):
        with Checks("04_demo", tmp_path) as c:
            c.expect(False, "bad")
    assert read_checks(tmp_path, "04_demo")["closed"] is True
    assert read_checks(tmp_path, "nope") is None


def test_bad_notebook_name(tmp_path):
    with pytest.raises(ValueError, match="bare name"):
        Checks("../escape", tmp_path)
