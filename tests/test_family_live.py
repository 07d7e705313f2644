"""``audit.family_live`` (issue #25's GPU step): which GPU classes a card runs, the backend each
class's wrappers are built with there, and a class this card cannot run said, not run.

Oracles: FlashInfer's own rules written out (0.7.2 utils.py:616-628: ``auto`` is fa3 on sm90 for
head_dim 64/128/256 without a custom mask, else fa2; explicit backends never rewritten), and
compute capabilities stubbed per card (no GPU here).
"""

from __future__ import annotations

import types

import pytest
import torch

from swa_repro.engine.families import GPU_CLASSES
from swa_repro.sglang.audit import family_live as fl
from swa_repro.sglang.audit.env import DECODE, RAGGED
from swa_repro.sglang.audit.live import Executor

CARDS = {"A100": (8, 0), "H200": (9, 0), "B200": (10, 0)}


@pytest.fixture
def card(monkeypatch):
    def on(name):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: CARDS[name])
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: f"NVIDIA {name}")
    return on


@pytest.mark.parametrize("gpu", list(GPU_CLASSES))
def test_the_kernel_model_runs_every_class(gpu):
    assert fl.card_cannot_run(GPU_CLASSES[gpu], "cpu") is None and fl.card_of("cpu") is None


@pytest.mark.parametrize("name, runs", [("A100", {"sm80"}), ("H200", {"sm80", "sm90"}), ("B200", {"sm80", "sm100"})])
def test_a_card_runs_its_own_class_and_sm80s_fa2(card, name, runs):
    card(name)
    said = {g: fl.card_cannot_run(c, "cuda") for g, c in GPU_CLASSES.items()}
    assert {g for g, why in said.items() if why is None} == runs
    for g in set(GPU_CLASSES) - runs:
        assert f"NVIDIA {name}" in said[g] and g in said[g]


def _pair(cls, backend="auto", head_dim=256, mask=None):
    return types.SimpleNamespace(cls=cls, backend=backend, plan=(0, {"head_dim_qk": head_dim, "custom_mask": mask}))


@pytest.mark.parametrize("gpu, ragged, masked", [("sm80", "fa2", "fa2"), ("sm90", "fa3", "fa2"), ("sm100", "fa2", "fa2")])
def test_another_class_is_run_with_the_backend_it_resolves_auto_to(card, gpu, ragged, masked):
    card("H200") if gpu != "sm90" else card("A100")  # never the card's own class
    ex = fl.executor_for(Executor(object, "cuda"), GPU_CLASSES[gpu], "cuda")
    assert ex.backend(_pair(RAGGED)) == ragged
    assert ex.backend(_pair(RAGGED, mask=torch.ones(1))) == masked  # a custom mask: fa2 (utils.py:504-507)
    assert ex.backend(_pair(RAGGED, "fa2")) == "fa2"  # explicit: never rewritten
    assert ex.backend(_pair(DECODE)) is None  # decode keeps what sglang built


def test_the_cards_own_class_keeps_flashinfers_own_choice(card):
    card("H200")
    ex = Executor(object, "cuda")
    assert fl.executor_for(ex, GPU_CLASSES["sm90"], "cuda") is ex  # ``auto`` resolved by FlashInfer itself
    assert fl.executor_for(Executor(object, "cpu"), GPU_CLASSES["sm90"], "cpu").backend(_pair(RAGGED)) == "fa3"


def test_a_class_the_card_cannot_run_is_said_and_nothing_runs(card):
    card("H200")

    def never(*a, **k):
        raise AssertionError("an sm100 call ran on an H200")
    recs = [{"status": "driven"}, {"status": "absent"}]
    job = fl.Job(recs, [(object(), None), (object(), None)], None, GPU_CLASSES["sm100"], {})
    assert fl.run_jobs([job], Executor(never, "cuda"))["warmup"] == {}
    assert "do not run on this card (NVIDIA H200, sm90)" in recs[0]["live"]["not_run"] and "live" not in recs[1]


def test_a_build_step_warms_every_module_at_most_n_at_once_and_judges_nothing(card, monkeypatch):
    """scripts/gpu_family.sh's build step (SWA_REPRO_WARM_ONLY, SWA_REPRO_BUILD_WORKERS): the warm-up
    alone, its concurrent builds capped, every driven call said not run; without them, no cap."""
    from swa_repro.sglang.audit import live

    card("H200")
    seen = []
    monkeypatch.setattr(live, "warm_calls", lambda todo, *, workers=None, deadline=None:
                        seen.append((len(todo), workers)) or {"sig": 1.5})
    monkeypatch.setattr(fl, "_key", lambda run, layer, ex: ("live", id(run)))
    monkeypatch.setenv(fl.WARM_ONLY_ENV, "1")
    monkeypatch.setenv(fl.BUILD_WORKERS_ENV, "3")

    def judged(*a, **k):
        raise AssertionError("a call was judged in a build step")
    monkeypatch.setattr(live, "live_of_run", judged)
    recs = [{"status": "driven"}, {"status": "driven"}]
    job = fl.Job(recs, [(object(), None), (object(), None)], None, GPU_CLASSES["sm90"], {})
    got = fl.run_jobs([job], Executor(object, "cuda"))
    assert got["warmup"] == {"sig": 1.5} and got["warm_only"] is True and seen == [(2, 3)]
    assert all("build step" in r["live"]["not_run"] for r in recs) and job.memo == {}
    monkeypatch.delenv(fl.WARM_ONLY_ENV)
    monkeypatch.delenv(fl.BUILD_WORKERS_ENV)
    monkeypatch.setattr(live, "live_of_run", lambda *a, **k: {"calls": 0})
    monkeypatch.setattr(fl, "SLIDING", "never")
    job = fl.Job([{"status": "driven"}], [(object(), types.SimpleNamespace(kind="full"))],
                 types.SimpleNamespace(cap=None), GPU_CLASSES["sm90"], {})
    assert "warm_only" not in fl.run_jobs([job], Executor(object, "cuda")) and seen[-1] == (1, None)
    assert job.recs[0]["live"] == {"calls": 0}


# ----------------------------------------------------------------------------- building on a GPU box
def test_the_fused_mlp_gemm_is_not_picked_while_a_model_is_built(monkeypatch):
    """On CUDA the release's MLP imports nvidia-cutlass-dsl to pick a fused GEMM (0.5.23
    dual_gemm.py:32-42), which the GPU bundle lacks: while the audit builds a model the mode is what
    the release picks off CUDA (None), and the class is restored after."""
    import sys

    from swa_repro.sglang.audit.family_build import no_fused_mlp_gemm

    class DualGemm:
        def _select_mode(self, gate_up_proj, hidden_size):
            raise ModuleNotFoundError("No module named 'cutlass'")
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.dual_gemm", types.SimpleNamespace(DualGemm=DualGemm))
    with no_fused_mlp_gemm():
        assert DualGemm()._select_mode(None, 4096) is None
    with pytest.raises(ModuleNotFoundError, match="cutlass"):
        DualGemm()._select_mode(None, 4096)
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.dual_gemm", types.SimpleNamespace())  # a release without it
    with no_fused_mlp_gemm():
        pass
