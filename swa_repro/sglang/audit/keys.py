"""The keys each query of a driven call really attends, as token positions, against the keys its
layer intends.

A verdict about parameters ("``window_left`` reached ``forward()`` only") says nothing about a
call whose KV was already trimmed, or one that reads the wrong KV. So for every effective call
(each forward with the plan before it; a CUDA-graph replay's plan with the captured forward):

* **queries**: row ``t`` of ``q`` is the batch's token ``t`` (sglang passes the layer's ``q`` for
  the whole batch, ``qo_indptr`` over its requests), at ``positions[t]`` (the batch's own);
* **keys**: entry ``j`` of request ``i``'s KV list is slot ``kv_indices[kv_indptr[i] + j // ps] *
  ps + j % ps`` (flashinfer page.py), mapped back to a position through sglang's req-to-token row
  of that request (``-1``: the slot is not that request's); a ragged call's keys are the forward's
  ``k`` rows, i.e. the batch's new tokens (``forward_extend`` passes the layer's ``k``);
* **attended** (per query head) as FlashInfer computes it: causal ``j <= kv - qo + r`` or the custom
  mask instead (variants.cuh:79-86), the window only if compiled in at plan (prefill.py:2035),
  with the run's value: ``j + qo + W >= kv + r`` (variants.cuh:88-89); an fa2 call planned
  without the window but run with one, paged or ragged, starts each CTA at its first row's window
  (the kernel model, ``kernel.model.simulate``; a ragged call at page size 1, as it is planned,
  prefill.py:3162 in 0.6.12; ``undefined`` rows under split-KV stay undefined), and with a custom
  mask too: the CTA's first key is ``kv + q_tile * CTA_TILE_Q / group - qo - W`` whatever was
  compiled in (flashinfer 0.7.2 prefill.cuh:3037-3039 ragged, :3826-3827 paged, ``W`` the run's
  value, variants.cuh:64). Which backend runs is the caller's (``backend``: the one the kernel ran,
  or a GPU class's resolution of ``auto``); by default the recorded one (:func:`recorded_backend`).
  Until 2026-12-05 the ragged leak was not modelled and ``auto`` never resolved: an H100 run of
  that day found the model off on 4 sm80 ragged runs; re-run with this model, it agrees on them and
  on every run since (``recordings/family-live/README.md``);
* **intended**: positions ``[p - W, p]`` with the layer's window ``W`` (HF's ``sliding_window - 1``),
  ``[0, p]`` without one. A speculative verify's draft tokens form a tree (``audit.spec``): a draft
  node's real position is ``committed + depth`` (the positions the target's forward reads,
  forward_batch_info.py:1219-1223), not its index in the flattened draft, and it attends only its
  own ancestors. So for a verify run (``snapshot["spec_tree"]``: committed lengths and each
  request's parent links) a node at depth ``d`` intends the committed positions ``[committed + d -
  W, committed)`` and each ancestor-or-self within ``W`` of its depth, both derived from the parent
  links alone (:func:`tree_oracle`), never from the custom mask sglang builds.

Extra keys are attended and not intended; missing keys are intended positions that no call of the
same stage lets the query see (the union over a ragged + paged pair, say).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch

from swa_repro.core.case import Case
from swa_repro.core.errors import CaseError
from swa_repro.kernel.model import fa2_cta_tile_q, simulate
from swa_repro.sglang.audit.env import DECODE, PAGED, RAGGED, STAND_INS
from swa_repro.sglang.trace import PLAN_METHODS, decode

FORWARD_METHODS = ("forward", "forward_return_lse", "run", "run_return_lse")


# ----------------------------------------------------------------------------- recorded calls
def bind(cls_name: str, method: str, args, kwargs) -> dict:
    """Recorded args/kwargs bound to the flashinfer signature (defaults applied), decoded."""
    fn = getattr(STAND_INS[cls_name], "plan" if method in PLAN_METHODS else method)
    b = inspect.signature(fn).bind(None, *decode(args), **decode(kwargs))
    b.apply_defaults()
    out = dict(b.arguments)
    out.pop("self", None)
    return out


def given(cls_name: str, method: str, args, kwargs) -> set:
    """The parameter names a recorded call passed explicitly (the rest took their defaults)."""
    fn = getattr(STAND_INS[cls_name], "plan" if method in PLAN_METHODS else method)
    return set(inspect.signature(fn).bind(None, *decode(args), **decode(kwargs)).arguments) - {"self"}


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
    graph's replay was run (``audit.paths._graph``), with that run instead."""
    calls = run.trace.calls
    ctor = {c.wrapper: (c.cls, decode(c.kwargs).get("backend", "auto")) for c in calls if c.method == "__init__"}
    plans, last_fwd, first_plan, pending, out = {}, {}, {}, {}, []
    for i, c in enumerate(calls):
        if c.method == "__init__" or c.error:
            continue
        cls, backend = ctor[c.wrapper]
        if c.method in PLAN_METHODS:
            plans[c.wrapper] = (i, bind(cls, c.method, c.args, c.kwargs), (c.method, given(cls, c.method, c.args, c.kwargs)))
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


# ----------------------------------------------------------------------------- one request of one call
@dataclass
class RequestKeys:
    request: int
    rows: np.ndarray  # (qo,) global query rows (batch tokens)
    q_pos: np.ndarray  # (qo,) their positions
    k_pos: np.ndarray  # (kv,) key positions, -1 = not this request's slot
    k_index: np.ndarray  # (kv,) where each key sits: paged slot, or ragged k row
    attended: np.ndarray | None  # (Hq, qo, kv) bool; None = undefined (split-KV partial outputs)
    intended: np.ndarray  # (qo, kv) bool
    k_id: np.ndarray | None = None  # (kv,) which token each key is (its position; a verify: its request row index)
    want: list | None = None  # per row, the token ids (as k_id) the layer intends: what "missing" counts against

    @property
    def extra(self) -> np.ndarray:
        """(Hq, qo, kv) attended but not intended (unmapped keys included)."""
        return self.attended & ~self.intended[None]


def _key_slots(cls: str, plan: dict, i: int, kv: int) -> np.ndarray:
    if cls == RAGGED:
        a = int(plan["kv_indptr"][i])
        return np.arange(a, a + kv)
    ind, idx = (plan["paged_kv_indptr"], plan["paged_kv_indices"]) if cls == PAGED else (plan["indptr"], plan["indices"])
    ps = int(plan["page_size"])
    j = np.arange(kv)
    pages = idx[int(ind[i]):int(ind[i + 1])].long().numpy()
    return pages[j // ps] * ps + j % ps


def _positions_of_slots(snap: dict, i: int, slots: np.ndarray) -> np.ndarray:
    """Slot -> position through sglang's req-to-token row of request ``i`` (-1: not its slot)."""
    row = snap["req_to_token"][int(snap["req_pool_indices"][i])].numpy()
    where = {int(s): p for p, s in enumerate(row) if s > 0}  # slot 0 is sglang's padding slot
    return np.array([where.get(int(s), -1) for s in slots], np.int64)


def recorded_backend(p: Pair) -> str:
    """What runs as the trace alone says: decode and an explicit ``fa2`` are fa2, an explicit ``fa3``
    fa3, ``auto`` left unresolved (no GPU class: no CTA leak modelled)."""
    return "fa2" if p.backend == "fa2" or p.cls == DECODE else ("fa3" if p.backend == "fa3" else "auto")


def leaks(p: Pair, plan: dict, fwd: dict, backend: str) -> bool:
    """An fa2 prefill call, paged or ragged, causal and without a custom mask, planned without the
    window and run with one: its CTAs start at their first row's window (the module docstring)."""
    causal = bool(fwd.get("causal", True))
    return (p.cls in (PAGED, RAGGED) and backend == "fa2" and causal and plan.get("custom_mask") is None
            and int(plan["window_left"]) < 0 <= int(fwd["window_left"]))


def _kernel_visible(p: Pair, plan: dict, fwd: dict, qo: int, kv: int, hq: int, req: int, geo,
                    backend: str) -> np.ndarray | None:
    """(Hq, qo, kv) what FlashInfer lets each row see, index level (see the module docstring)."""
    if leaks(p, plan, fwd, backend):
        return _fa2_leak(plan, int(fwd["window_left"]), hq, req, geo)
    r = np.arange(qo)[:, None]
    j = np.arange(kv)[None, :]
    causal = True if p.cls == DECODE else bool(fwd.get("causal", True))
    mask = plan.get("custom_mask")
    if mask is not None:
        off = sum(a * b for a, b in zip(geo[0][:req], geo[1][:req]))
        vis = mask[off: off + qo * kv].view(qo, kv).bool().numpy()
    elif causal:
        vis = j <= kv - qo + r
    else:
        vis = np.ones((qo, kv), bool)
    compiled, w = int(plan["window_left"]) >= 0, int(fwd["window_left"])
    if compiled:
        vis = vis & (j + qo + w >= kv + r)
    vis = np.broadcast_to(vis, (hq, qo, kv)).copy()
    if mask is not None and w >= 0 and p.cls == PAGED:  # a custom mask runs on fa2 (prefill.py:2974)
        vis &= _fa2_cta_start(plan, geo, qo, kv, w, hq)
    return vis


def _fa2_cta_start(plan: dict, geo, qo: int, kv: int, w: int, hq: int) -> np.ndarray:
    """(Hq, qo, kv): keys at or after the first key of the CTA holding each (row, head): an fa2
    CTA starts at ``kv + q_tile * CTA_TILE_Q / group - (qo + W)`` with the run's window ``W``
    (prefill.cuh:3826-3827), compiled in or not, and packs rows as ``row * group + head % group``;
    CTA_TILE_Q from the plan's mean packed query length (``kernel.model.fa2_cta_tile_q``)."""
    group = int(plan["num_qo_heads"]) // int(plan["num_kv_heads"])
    live = [n for n in geo[0] if n > 0]
    tile = fa2_cta_tile_q(sum(n * group for n in live) // max(len(live), 1), int(plan["head_dim_qk"]))
    packed = np.arange(qo)[None, :] * group + (np.arange(hq) % group)[:, None]  # (Hq, qo)
    start = kv + (packed // tile * tile) // group - (qo + w)
    return np.arange(kv)[None, None, :] >= start[:, :, None]


def plan_case(plan: dict, geo, window: int, backend: str, **extra) -> tuple[Case | None, list[int]]:
    """The kernel model's Case for a recorded prefill plan, run with ``window``: the batch as planned
    (its requests with queries, ``live``), heads, page size (a ragged plan's is 1, prefill.py:3162)
    and plan window; flashinfer 0.6.12's model. None when the plan is no Case the model takes."""
    live = [i for i, n in enumerate(geo[0]) if n > 0]
    try:
        return Case(prefix_lens=tuple(geo[1][i] - geo[0][i] for i in live), extend_lens=tuple(geo[0][i] for i in live),
                    num_qo_heads=int(plan["num_qo_heads"]), num_kv_heads=int(plan["num_kv_heads"]),
                    head_dim=int(plan["head_dim_qk"]), page_size=int(plan.get("page_size", 1)), window_left=window,
                    plan_window_left=int(plan["window_left"]), backend=backend, flashinfer_version="0.6.12",
                    **extra), live
    except CaseError:
        return None, live


def _fa2_leak(plan: dict, w: int, hq: int, req: int, geo) -> np.ndarray | None:
    """The kernel model of an fa2 prefill planned without the window, run with ``w`` (CTA-granular
    start, prefill.cuh): the batch as planned, this request's per-head masks."""
    case, live = plan_case(plan, geo, w, "fa2", disable_split_kv=bool(plan.get("disable_split_kv")),
                           fixed_split_size=-1 if plan.get("fixed_split_size") is None else int(plan["fixed_split_size"]))
    if case is None:
        return None
    rm = simulate(case).requests[live.index(req)]
    if rm.status == "undefined":
        return None
    g = case.num_qo_heads // case.num_kv_heads
    return np.stack([rm.mask(h % g) for h in range(hq)])


def tree_oracle(parents) -> tuple[np.ndarray, np.ndarray]:
    """``(depth, ancestor_or_self)`` of a draft tree from its parent links alone (``parents[i]``:
    node ``i``'s parent, -1 for the root): ``depth[i]`` edges up to the root, ``anc[i, j]`` when
    ``j`` is ``i`` or lies on ``i``'s path to the root."""
    n = len(parents)
    depth, anc = np.zeros(n, np.int64), np.eye(n, dtype=bool)
    for i in range(n):
        p, seen = int(parents[i]), {i}
        while p >= 0:
            if p in seen or p >= n:
                raise ValueError(f"parent links {list(parents)} are not a tree")
            seen.add(p)
            anc[i, p] = True
            depth[i] += 1
            p = int(parents[p])
    return depth, anc


def tree_intended(parents, committed: int, nodes: np.ndarray, k_tok: np.ndarray, window: int) -> np.ndarray:
    """(len(nodes), kv) bool: the keys draft ``nodes`` of a request with ``committed`` tokens intend,
    keys named by their index in the request's token row (``k_tok``; -1 another request's): a
    node at depth ``d`` (position ``committed + d``) intends the committed tokens from ``committed +
    d - window`` on and each ancestor-or-self ``c`` with ``d - depth(c) <= window`` (any without a window)."""
    depth, anc = tree_oracle(parents)
    n, w = len(parents), (window if window >= 0 else 1 << 62)
    d = depth[nodes][:, None]
    k = np.asarray(k_tok)[None, :]
    c = np.clip(np.asarray(k_tok) - committed, 0, n - 1)
    old = (k >= 0) & (k < committed) & (k >= committed + d - w)
    draft = (k >= committed) & (k < committed + n) & anc[nodes][:, c] & (d - depth[c][None, :] <= w)
    return old | draft


def _tree_keys(snap: dict, i: int, rows: np.ndarray, row0: int, k_tok: np.ndarray, window: int):
    """A verify call's request ``i``: its query positions, key positions and intended keys from the
    tree's parent links (:func:`tree_intended`); each row's intended token ids for "missing"."""
    tree = snap["spec_tree"]
    parents, committed = tree["parents"][i], int(tree["committed"][i])
    depth, _ = tree_oracle(parents)
    nodes = rows - row0
    if nodes.max() >= len(parents):
        raise ValueError(f"verify request {i}: {len(rows)} query rows for a tree of {len(parents)} nodes")
    n = len(parents)
    q_pos = committed + depth[nodes]
    k_pos = np.where((k_tok >= committed) & (k_tok < committed + n),
                     committed + depth[np.clip(k_tok - committed, 0, n - 1)], k_tok)
    intended = tree_intended(parents, committed, nodes, k_tok, window)
    every = np.arange(committed + n)
    want = [set(every[r].tolist()) for r in tree_intended(parents, committed, nodes, every, window)]
    return q_pos, k_pos, intended, want


def call_requests(p: Pair):
    """``(geometry, [(i, qo, kv, rows, slots)])`` of one effective call, per request with queries:
    its query rows in the call and the KV slots it reads (shared by :func:`call_keys` and
    ``audit.spans.call_spans``)."""
    plan = p.plan[1]
    geo = geometry(p.cls, plan)
    qo_ptr = np.cumsum([0, *geo[0]])
    return geo, [(i, qo, kv, np.arange(qo_ptr[i], qo_ptr[i] + qo), _key_slots(p.cls, plan, i, kv))
                 for i, (qo, kv) in enumerate(zip(*geo)) if qo]


def call_keys(p: Pair, snap: dict, window: int, backend: str | None = None) -> list[RequestKeys]:
    """Per request of one effective call: attended and intended keys (``window``: the intended one;
    ``backend``: what ran, default :func:`recorded_backend`)."""
    plan, fwd = p.plan[1], p.fwd[1]
    backend = backend or recorded_backend(p)
    hq = int(plan["num_qo_heads"])
    geo, requests = call_requests(p)
    out = []
    for i, qo, kv, rows, slots in requests:
        if "spec_tree" in snap and p.cls == PAGED:
            k_tok = _positions_of_slots(snap, i, slots)
            q_pos, k_pos, intended, want = _tree_keys(snap, i, rows, int(rows[0]), k_tok, window)
        else:
            q_pos = snap["positions"].numpy()[rows]
            k_pos = snap["positions"].numpy()[slots] if p.cls == RAGGED else _positions_of_slots(snap, i, slots)
            lo = q_pos[:, None] - (window if window >= 0 else 1 << 62)
            intended = (k_pos[None, :] >= 0) & (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= lo)
            k_tok = k_pos
            want = [set(range(0 if window < 0 else max(int(q) - window, 0), int(q) + 1)) for q in q_pos]
        seen = _kernel_visible(p, plan, fwd, qo, kv, hq, i, geo, backend)
        out.append(RequestKeys(i, rows, q_pos, k_pos, slots, seen, intended, k_tok, want))
    return out


# ----------------------------------------------------------------------------- per path x layer
def keys_of_run(run, window: int | None = None) -> dict:
    """Extra and missing keys of one driven path for one intended ``window`` (default: the
    layer's), per stage: how many queries see keys outside their window, the most per query, keys
    from other requests' slots, undefined rows, and intended positions no call lets a query see."""
    window = run.layer_window if window is None else window
    stages: dict[str, dict] = {}
    for p in pairs(run):
        st = stages.setdefault(p.stage, {"calls": 0, "queries": set(), "extra_queries": set(), "extra_keys": 0,
                                         "max_extra_per_query": 0, "foreign_keys": 0, "undefined_rows": 0,
                                         "seen": {}, "example": None})
        st["calls"] += 1
        for rk in call_keys(p, run.snapshot, window):
            st["queries"].update(rk.rows.tolist())
            st["foreign_keys"] += int((rk.k_pos < 0).sum())
            if rk.attended is None:
                st["undefined_rows"] += len(rk.rows)
                continue
            ex = rk.extra.sum(2).max(0)  # (qo,) the most any head sees
            st["extra_keys"] += int(ex.sum())
            st["max_extra_per_query"] = max(st["max_extra_per_query"], int(ex.max()))
            for r in np.nonzero(ex)[0]:
                st["extra_queries"].add(int(rk.rows[r]))
                if st["example"] is None:
                    keys = rk.k_pos[rk.extra[:, r].any(0)]
                    st["example"] = {"query_position": int(rk.q_pos[r]), "extra_key_positions": keys[:8].tolist(),
                                     "n_extra": int(ex[r])}
            seen = rk.attended.any(0)  # (qo, kv) by some head
            for r, t in enumerate(rk.rows.tolist()):
                st["seen"].setdefault(t, (rk.want[r], set()))[1].update(rk.k_id[seen[r]].tolist())
    out = {}
    for name, st in stages.items():
        missing = sum(len(want - seen) for want, seen in st["seen"].values())
        out[name] = {"calls": st["calls"], "queries": len(st["queries"]), "queries_with_extra": len(st["extra_queries"]),
                     "extra_keys": st["extra_keys"], "max_extra_per_query": st["max_extra_per_query"],
                     "missing_keys": missing, "foreign_keys": st["foreign_keys"],
                     "undefined_rows": st["undefined_rows"], "example": st["example"]}
    return out


def verdict(stages: dict) -> str:
    """``exact`` | ``extra`` (some query sees keys outside its window) | ``missing`` | ``undefined``."""
    if any(s["extra_keys"] or s["foreign_keys"] for s in stages.values()):
        return "extra"
    if any(s["undefined_rows"] for s in stages.values()):
        return "undefined"
    if any(s["missing_keys"] for s in stages.values()):
        return "missing"
    return "exact"
