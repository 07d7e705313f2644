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

One module per idea: the effective calls and what each kernel was told (``audit.calls``), the keys
the kernel lets each row see (``audit.attended``), what a draft tree's tokens intend
(``audit.intended``); here, per request, the two held together, and the report per path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swa_repro.sglang.audit.attended import _kernel_visible, recorded_backend
from swa_repro.sglang.audit.calls import Pair, geometry, pairs
from swa_repro.sglang.audit.env import PAGED, RAGGED
from swa_repro.sglang.audit.intended import tree_intended, tree_oracle


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
    row = snap["req_to_token"][int(snap["req_pool_indices"][i])].numpy().astype(np.int64)
    pos = np.nonzero(row > 0)[0]  # slot 0 is sglang's padding slot
    order = np.argsort(row[pos], kind="stable")
    slot, pos = row[pos][order], pos[order]
    want = np.asarray(slots).astype(np.int64)
    if not len(slot):
        return np.full(want.shape, -1, np.int64)
    last = np.append(slot[1:] != slot[:-1], True)  # a slot held twice: its last position, as a dict kept it
    slot, pos = slot[last], pos[last]
    at = np.clip(np.searchsorted(slot, want), 0, len(slot) - 1)
    return np.where(slot[at] == want, pos[at], -1).astype(np.int64)


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
