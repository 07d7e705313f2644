"""Each PR series of docs/upstream is bisectable on the CPU stand-ins (issue #40, point 6): applied
alone to 0.5.23, one commit at a time, every commit is ruff-clean, passes the kit's FlashInfer cases
and the series' test as it stands, and the test methods it adds fail without its fix
(``pr_check``). One child run per commit and state, minutes in all: ``make test-matrix``."""

from __future__ import annotations

import pytest

from swa_repro.sglang.fix import pr_check
from swa_repro.sglang.fix.pr_series import PRS
from swa_repro.sglang.fix.pr_tests import NOT_ON_CPU

pytestmark = pytest.mark.matrix


@pytest.mark.parametrize("pr", PRS, ids=lambda pr: pr.dir)
def test_every_commit_passes_the_kit_and_its_tests_fail_without_its_fix(pr):
    rows = pr_check.check([pr.key], note=lambda *_: None)[pr.dir]
    assert [r["commit"] for r in rows] == (pr_check.DOCS / pr.dir / "series").read_text().split()
    assert [r["verdict"] for r in rows] == ["ok"] * len(pr.steps), [(r["commit"], r["verdict"]) for r in rows]
    for step, r in zip(pr.steps, rows):
        kit = r["after"][pr_check.KIT_CASES.name]
        assert len(kit["subtests"]) >= 17 and set(kit["subtests"].values()) == {"pass"}  # the kit ran, all of it
        if step.tests:
            assert r["before"][pr.test]["tests"], r  # the without-the-fix run ran the commit's test
    cpu_blind = {t for s in pr.steps for t in s.tests if t in NOT_ON_CPU}
    assert cpu_blind <= {"test_decode_window_soft_cap_cuda_graph"}  # the one the stand-ins cannot judge
