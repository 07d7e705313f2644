"""The effective calls of a driven path: each forward with the plan it ran under (a CUDA-graph
replay's plan with the captured forward), their recorded arguments bound to FlashInfer's signatures,
and each planned call's per-request lengths: what the kernel was told, before any key is judged
(``audit.keys``)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache

import torch

from swa_repro.sglang.audit.env import PAGED, RAGGED, STAND_INS
from swa_repro.sglang.trace import PLAN_METHODS, decode

FORWARD_METHODS = ("forward", "forward_return_lse", "run", "run_return_lse")


@cache
def signature(cls_name: str, method: str) -> inspect.Signature:
    """The stand-in's signature of ``method`` (a plan method: ``plan``), built once per process: a
    release row binds ~26k recorded calls (cProfile of 0.5.23's table child: ``inspect.signature``
    was its largest single cost), and the stand-ins' signatures never change while it runs."""
    return inspect.signature(getattr(STAND_INS[cls_name], "plan" if method in PLAN_METHODS else method))


def bound(cls_name: str, method: str, args, kwargs) -> tuple[dict, set]:
    """``(bind(...), given(...))`` of one recorded call from one decode and one bind (a plan needs both)."""
    b = signature(cls_name, method).bind(None, *decode(args), **decode(kwargs))
    passed = set(b.arguments) - {"self"}
    b.apply_defaults()
    out = dict(b.arguments)
    out.pop("self", None)
    return out, passed


def bind(cls_name: str, method: str, args, kwargs) -> dict:
    """Recorded args/kwargs bound to the flashinfer signature (defaults applied), decoded."""
    return bound(cls_name, method, args, kwargs)[0]


def given(cls_name: str, method: str, args, kwargs) -> set:
    """The parameter names a recorded call passed explicitly (the rest took their defaults)."""
    return bound(cls_name, method, args, kwargs)[1]


@dataclass
class Pair:
    """One effective call: a forward and the plan it ran under. ``plan`` / ``fwd`` are
    ``(trace index, bound arguments, (method, names passed))``; a ``run()`` reads the planned window
    and cap, so they are filled in from the plan."""
    stage: str  # eager | capture | replay
    cls: str
    backend: str
    wrapper: int
    plan: tuple
    fwd: tuple
    capture_plan: tuple | None = None  # replay: the plan that picked the captured module


def pairs(run) -> list[Pair]:
    """Every effective call of a driven path, in trace order. A CUDA-graph wrapper's forward is
    judged on what its run read from the wrapper's buffers (``Call.reads``: the index tensors and
    the mask another wrapper sharing the buffer may have planned last, ``kernel.graph_buffers``),
    not on its own plan's arguments. A replay's plan pairs with the captured forward; where the
    graph's replay was run (``audit.paths._graph``), with that run instead.

    Made once per run and kept on it (a family audit asks ~9 times per run: its record, findings, wrappers
    and spans per GPU class; cProfile of 0.5.23's table child: ~13k calls, ~7 CPU-s), keyed on what it
    reads, so a run whose trace or stages change is paired again; each caller gets its own list."""
    key = (id(run.trace.calls), len(run.trace.calls), tuple(sorted(run.graph_stage.items())))
    kept = getattr(run, "_pairs", None)
    if kept is None or kept[0] != key:
        kept = (key, _pairs(run))
        try:
            run._pairs = kept
        except AttributeError:  # a run that keeps no attributes: paired each time
            pass
    return list(kept[1])


def _pairs(run) -> list[Pair]:
    calls = run.trace.calls
    ctor = {c.wrapper: (c.cls, decode(c.kwargs).get("backend", "auto")) for c in calls if c.method == "__init__"}
    plans, last_fwd, first_plan, pending, out = {}, {}, {}, {}, []
    for i, c in enumerate(calls):
        if c.method == "__init__" or c.error:
            continue
        cls, backend = ctor[c.wrapper]
        if c.method in PLAN_METHODS:
            b, passed = bound(cls, c.method, c.args, c.kwargs)
            plans[c.wrapper] = (i, b, (c.method, passed))
            if run.graph_stage.get(i) == "replay" and c.wrapper in last_fwd:
                pending[c.wrapper] = len(out)
                out.append(Pair("replay", cls, backend, c.wrapper, plans[c.wrapper], last_fwd[c.wrapper],
                                first_plan.get(c.wrapper)))
        elif c.method in FORWARD_METHODS and c.wrapper in plans:
            fwd = bind(cls, c.method, c.args, c.kwargs)
            if c.method.startswith("run"):
                plan = plans[c.wrapper][1]
                fwd["window_left"] = plan["window_left"] if fwd.get("window_left") is None else fwd["window_left"]
                fwd["logits_soft_cap"] = plan["logits_soft_cap"]
                fwd["causal"] = plan.get("causal", True)
            last_fwd[c.wrapper] = (i, fwd, (c.method, given(cls, c.method, c.args, c.kwargs)))
            stage = run.graph_stage.get(i, "eager")
            if stage == "capture":
                first_plan[c.wrapper] = plans[c.wrapper]
            plan = plans[c.wrapper]
            if getattr(c, "reads", None):
                plan = (plan[0], {**plan[1], **decode(c.reads)}, plan[2])
            pair = Pair(stage, cls, backend, c.wrapper, plan, last_fwd[c.wrapper],
                        first_plan.get(c.wrapper) if stage == "replay" else None)
            if stage == "replay" and c.wrapper in pending:
                out[pending.pop(c.wrapper)] = pair
            else:
                out.append(pair)
    return out


def geometry(cls_name: str, plan: dict) -> tuple[list[int], list[int]]:
    """Per-request (qo_lens, kv_lens) of a planned call, from its recorded index tensors
    (kv length = (pages - 1) * page_size + last_page_len, flashinfer page.py get_seq_lens)."""
    if cls_name == RAGGED:
        qo, kv = plan["qo_indptr"], plan["kv_indptr"]
        return (qo[1:] - qo[:-1]).tolist(), (kv[1:] - kv[:-1]).tolist()
    if cls_name == PAGED:
        qo, ind, last, ps = plan["qo_indptr"], plan["paged_kv_indptr"], plan["paged_kv_last_page_len"], plan["page_size"]
    else:
        ind, last, ps = plan["indptr"], plan["last_page_len"], plan["page_size"]
        qo = torch.arange(len(ind))
    pages = (ind[1:] - ind[:-1]).tolist()
    kv = [(n - 1) * int(ps) + int(last[i]) if n else 0 for i, n in enumerate(pages)]
    return (qo[1:] - qo[:-1]).tolist(), kv
