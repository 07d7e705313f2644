"""The keys each query of a recorded call attends, as ranges: ``audit.keys``' interval form.

``audit.keys`` builds ``(Hq, qo, kv)`` masks, fine at window 8 and gigabytes at a real window (4096
keys, prompts past it). Here every set is a few inclusive ranges per row, in the manner of
flash-attention's ``flash_attn/cute/block_info.py`` (as ``kernel.model.CtaGeometry``): a frozen
dataclass answers one question per method and returns ranges.

* :class:`CallSpans`: the key *indices* FlashInfer lets row ``r`` of one request see: causal
  ``j <= kv - qo + r`` (variants.cuh:79-86), the window ``j + qo + W >= kv + r`` only where it is
  compiled in and the backend applies it (variants.cuh:88-89); sglang's custom mask (a verify's
  few draft rows) run-length encoded instead; a paged fa2 call planned without the window from the
  kernel model's intervals; fa2's CTA start with a custom mask (prefill.cuh:3826-3827);
* :class:`KeyMap`: key index -> token id (position; a verify: its request row), as runs of
  consecutive ids, ``-1`` a slot that is not the request's (foreign);
* intended ids per row: ``[q - W, q]``, or a draft tree's committed range and ancestors
  (``audit.intended.tree_oracle``, from parent links alone).

Extra = attended - |attended ids & intended| (foreign keys count as extra); missing = intended ids
no call of the stage lets the query see. Same rules and output as ``audit.keys.keys_of_run``
(``tests/test_audit_spans.py`` holds the two equal on every path of the synthetic audit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swa_repro.kernel.model import fa2_cta_tile_q, simulate
from swa_repro.sglang.audit import attended as aa
from swa_repro.sglang.audit import calls as ac
from swa_repro.sglang.audit import intended as ai
from swa_repro.sglang.audit import keys as ak
from swa_repro.sglang.audit import rowsets
from swa_repro.sglang.audit.env import DECODE, PAGED, RAGGED

BIG = 1 << 62


@dataclass(frozen=True)
class CallSpans:
    """One request of one effective call, as FlashInfer runs it (key indices ``0..kv-1``)."""
    qo: int
    kv: int
    causal: bool
    window: int  # the window applied per element; -1: none (compiled out, dropped, or ignored)

    def last_key(self, r: np.ndarray) -> np.ndarray:
        """Row ``r`` sits at key ``kv - qo + r`` (causal); every key otherwise."""
        return self.kv - self.qo + r if self.causal else np.full_like(r, self.kv - 1)

    def first_key(self, r: np.ndarray) -> np.ndarray:
        """``j + qo + W >= kv + r`` (variants.cuh:88-89); 0 without a window."""
        return np.zeros_like(r) if self.window < 0 else np.maximum(self.kv - self.qo + r - self.window, 0)

    def ranges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)`` ``(1, qo, 1)``: one range per row, every head the same."""
        r = np.arange(self.qo)
        return self.first_key(r)[None, :, None], self.last_key(r)[None, :, None]


def mask_runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` ``(qo, K)`` inclusive runs of each row of a bool ``(qo, kv)`` mask (a verify's
    custom mask: a few draft rows), padded with empty runs ``(0, -1)``."""
    qo = mask.shape[0]
    edges = np.diff(np.pad(mask.astype(np.int8), ((0, 0), (1, 1))), axis=1)
    rs, starts = np.nonzero(edges == 1)
    _, ends = np.nonzero(edges == -1)
    k = max(np.bincount(rs, minlength=qo).max(initial=0), 1)
    lo, hi = np.zeros((qo, k), np.int64), np.full((qo, k), -1, np.int64)
    slot = np.arange(len(rs)) - np.searchsorted(rs, rs)
    lo[rs, slot], hi[rs, slot] = starts, ends - 1
    return lo, hi


@dataclass(frozen=True)
class KeyMap:
    """Key index -> token id, as maximal runs of consecutive ids (``-1``: foreign slot)."""
    k_id: np.ndarray

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(first index, last index, id of the first)`` of each run of consecutive valid ids."""
        k = np.asarray(self.k_id, np.int64)
        valid = k >= 0
        cont = np.zeros(len(k), bool)  # j continues the run of j - 1
        cont[1:] = valid[1:] & valid[:-1] & (k[1:] == k[:-1] + 1)
        starts = np.nonzero(valid & ~cont)[0]
        ends = np.nonzero(valid & ~np.append(cont[1:], False))[0]
        return starts, ends, k[starts]

    def foreign(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Foreign keys inside each index range (prefix sums)."""
        csum = np.concatenate([[0], np.cumsum(np.asarray(self.k_id) < 0)])
        a, b = np.clip(lo, 0, len(csum) - 1), np.clip(hi + 1, 0, len(csum) - 1)
        return np.where(hi >= lo, csum[b] - csum[a], 0)

    def ids(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index ranges ``(..., K)`` -> id ranges ``(..., K * S)`` (one per run they cross)."""
        a, b, first = self.segments()
        lo_, hi_ = np.maximum(lo[..., None], a), np.minimum(hi[..., None], b)
        shape = (*lo.shape[:-1], -1)
        return (first + lo_ - a).reshape(shape), np.where(hi_ >= lo_, first + hi_ - a, first + lo_ - a - 1).reshape(shape)


def overlap(alo, ahi, blo, bhi) -> np.ndarray:
    """``|A & B|`` per leading index, A ``(..., K)`` and B ``(..., M)`` each a disjoint union of ranges."""
    lo = np.maximum(alo[..., :, None], blo[..., None, :])
    hi = np.minimum(ahi[..., :, None], bhi[..., None, :])
    return np.clip(hi - lo + 1, 0, None).sum((-1, -2))


def size(lo, hi) -> np.ndarray:
    return np.clip(hi - lo + 1, 0, None).sum(-1)


# ----------------------------------------------------------------------------- what the kernel lets a row see
def kernel_ranges(p: ac.Pair, plan: dict, fwd: dict, qo: int, kv: int, req: int, geo, backend: str):
    """``(lo, hi)`` ``(H, qo, K)`` key indices (``H``: 1 or one per head column), or None (undefined
    rows, split-KV). ``backend``: what FlashInfer runs (``cutlass`` applies no window)."""
    causal = True if p.cls == DECODE else bool(fwd.get("causal", True))
    mask = plan.get("custom_mask")
    compiled, w = int(plan["window_left"]) >= 0, int(fwd["window_left"])
    rule = kernel_rule(p, plan, fwd, backend)
    spans = CallSpans(qo, kv, causal, w if compiled and rule != "cutlass" else -1)
    if rule == "fa2 leak":
        return _fa2_leak(plan, w, req, geo)
    if mask is None:
        return spans.ranges()
    off = sum(a * b for a, b in zip(geo[0][:req], geo[1][:req]))
    lo, hi = mask_runs(mask[off: off + qo * kv].view(qo, kv).bool().numpy())
    lo, hi = np.maximum(lo, spans.first_key(np.arange(qo))[:, None])[None], hi[None]
    if w >= 0 and p.cls == PAGED:  # a custom mask runs on fa2: each CTA starts at its first row's window
        lo = np.maximum(lo, _cta_start(plan, geo, qo, kv, w)[:, :, None])
    return lo, np.where(hi >= lo, hi, lo - 1)


def kernel_rule(p: ac.Pair, plan: dict, fwd: dict, backend: str) -> str:
    """All that :func:`kernel_ranges` reads of the backend FlashInfer runs: ``cutlass`` (a window
    compiled in but not applied), ``fa2 leak`` (``audit.attended.leaks``: a causal fa2 call, paged or
    ragged, planned without the window and run with one: the kernel model's CTA leak), else
    ``other``. Two GPU classes whose calls get the same rules let every row see the same keys."""
    if int(plan["window_left"]) >= 0 and backend == "cutlass":
        return "cutlass"
    return "fa2 leak" if aa.leaks(p, plan, fwd, backend) else "other"


def _cta_start(plan: dict, geo, qo: int, kv: int, w: int) -> np.ndarray:
    """(Hq, qo) first key of the fa2 CTA holding each (row, head): the rule of
    ``audit.attended._fa2_cta_start``."""
    group = int(plan["num_qo_heads"]) // int(plan["num_kv_heads"])
    live = [n for n in geo[0] if n > 0]
    tile = fa2_cta_tile_q(sum(n * group for n in live) // max(len(live), 1), int(plan["head_dim_qk"]))
    packed = np.arange(qo)[None, :] * group + (np.arange(int(plan["num_qo_heads"])) % group)[:, None]
    return kv + (packed // tile * tile) // group - (qo + w)


def _fa2_leak(plan: dict, w: int, req: int, geo):
    """The kernel model's intervals (``kernel.model.simulate``) of a paged fa2 call planned without
    the window and run with ``w``: ``(group, qo, 1)``; None where its rows are undefined."""
    case, live = aa.plan_case(plan, geo, w, "fa2", disable_split_kv=bool(plan.get("disable_split_kv")),
                              fixed_split_size=-1 if plan.get("fixed_split_size") is None
                              else int(plan["fixed_split_size"]))
    if case is None:
        return None
    rm = simulate(case).requests[live.index(req)]
    if rm.status == "undefined":
        return None
    lo, hi = rm.intervals.lo.T[:, :, None].astype(np.int64), rm.intervals.hi.T[:, :, None].astype(np.int64)
    return np.where(lo < 0, 0, lo), np.where(lo < 0, -1, hi)


def default_backend(p: ac.Pair, plan: dict) -> str:
    """What runs without a GPU class: ``audit.attended.recorded_backend``."""
    return aa.recorded_backend(p)


# ----------------------------------------------------------------------------- what the layer intends
def window_ranges(q_pos: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(qo, 1)``: positions ``[q - W, q]``, ``[0, q]`` without a window (``core.intervals.intended_bounds``)."""
    lo = np.zeros_like(q_pos) if window < 0 else np.maximum(q_pos - window, 0)
    return lo[:, None], q_pos[:, None]


def tree_ranges(parents, committed: int, nodes: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """``(len(nodes), 1 + n)`` ids draft ``nodes`` intend (``audit.intended.tree_intended`` as ranges):
    committed ids from ``committed + d - W`` on, and id ``committed + c`` of each ancestor-or-self
    ``c`` with ``d - depth(c) <= W``."""
    depth, anc = ai.tree_oracle(parents)
    w, d, ids = (window if window >= 0 else BIG), depth[nodes], committed + np.arange(len(parents))
    ok = anc[nodes] & (d[:, None] - depth[None, :] <= w)
    lo = np.concatenate([np.maximum(committed + d - w, 0)[:, None], np.where(ok, ids, 0)], 1)
    hi = np.concatenate([np.full((len(nodes), 1), committed - 1), np.where(ok, ids, -1)], 1)
    return lo, hi


@dataclass(frozen=True, eq=False)
class RequestSpans:
    """One request of one call: rows, positions, key ids, what the kernel lets each row see and
    what the layer intends."""
    rows: np.ndarray  # (qo,) batch token rows
    q_pos: np.ndarray  # (qo,) their positions
    keys: KeyMap  # (kv,) key ids (positions; a verify: request row index)
    k_pos: np.ndarray  # (kv,) key positions, -1 foreign
    seen: tuple | None  # (lo, hi) (H, qo, K) key indices; None: undefined rows
    want: tuple  # (lo, hi) (qo, M) intended ids
    req: int = 0  # the request's index in its call


def call_spans(p: ac.Pair, snap: dict, window: int, backend: str) -> list[RequestSpans]:
    """Per request of one effective call (``audit.keys.call_keys`` in ranges)."""
    plan, fwd = p.plan[1], p.fwd[1]
    geo, requests = ak.call_requests(p)
    out = []
    for i, qo, kv, rows, slots in requests:
        if "spec_tree" in snap and p.cls == PAGED:
            k_id = ak._positions_of_slots(snap, i, slots)
            parents, committed = snap["spec_tree"]["parents"][i], int(snap["spec_tree"]["committed"][i])
            depth, n, nodes = ai.tree_oracle(parents)[0], len(parents), rows - rows[0]
            if nodes.max() >= n:
                raise ValueError(f"verify request {i}: {qo} query rows for a tree of {n} nodes")
            q_pos = committed + depth[nodes]
            draft = (k_id >= committed) & (k_id < committed + n)
            k_pos = np.where(draft, committed + depth[np.clip(k_id - committed, 0, n - 1)], k_id)
            want = tree_ranges(parents, committed, nodes, window)
        else:
            q_pos = snap["positions"].numpy()[rows]
            k_pos = snap["positions"].numpy()[slots] if p.cls == RAGGED else ak._positions_of_slots(snap, i, slots)
            k_id, want = k_pos, window_ranges(q_pos, window)
        seen = kernel_ranges(p, plan, fwd, qo, kv, i, geo, backend)
        out.append(RequestSpans(rows, q_pos, KeyMap(np.asarray(k_id, np.int64)), k_pos, seen, want, i))
    return out


# ----------------------------------------------------------------------------- per path x layer
def _example(rs: RequestSpans, r: int, n_extra: int) -> dict:
    """The first extra query: its position and (at most 8) extra key positions, one row of length kv."""
    kv = len(rs.k_pos)
    vis = np.zeros(kv + 1, np.int64)
    lo, hi = rs.seen[0][:, r, :].ravel(), rs.seen[1][:, r, :].ravel()
    ok = hi >= lo
    np.add.at(vis, lo[ok], 1)
    np.add.at(vis, hi[ok] + 1, -1)
    k = rs.keys.k_id
    meant = np.zeros(kv, bool)
    for a, b in zip(rs.want[0][r], rs.want[1][r]):
        meant |= (k >= a) & (k <= b)
    extra = (np.cumsum(vis)[:kv] > 0) & ~(meant & (k >= 0))
    return {"query_position": int(rs.q_pos[r]), "extra_key_positions": rs.k_pos[extra][:8].tolist(), "n_extra": n_extra}


def keys_of_run(run, window: int | None = None, backend_of=default_backend) -> dict:
    """``audit.keys.keys_of_run`` in ranges: per stage, queries seeing keys outside ``window``
    (default: the layer's), the most per query, foreign keys, undefined rows, missing keys.
    ``backend_of(pair, plan)``: what FlashInfer runs for that call (a GPU class resolves ``auto``)."""
    return summary(stage_spans(run, window, backend_of))


def stage_spans(run, window: int | None = None, backend_of=default_backend) -> dict:
    """Per stage, every call's requests folded in (:func:`_add`): counts, and per call its token
    rows, their positions and request, and the id ranges each row intends and is let see
    (``audit.rowsets``; :func:`stage_rows` joins them per row, ``audit.rows`` draws them)."""
    window = run.layer_window if window is None else window
    stages: dict[str, dict] = {}
    for p in ac.pairs(run):
        st = stages.setdefault(p.stage, {"calls": 0, "extra_keys": 0, "max_extra_per_query": 0, "foreign_keys": 0,
                                         "undefined_rows": 0, "example": None, "requests": [], "extra_rows": [],
                                         "defined": []})
        st["calls"] += 1
        for rs in call_spans(p, run.snapshot, window, backend_of(p, p.plan[1])):
            _add(st, rs)
    return stages


def summary(stages: dict) -> dict:
    """:func:`stage_spans` -> :func:`keys_of_run`'s counts per stage."""
    out = {}
    for name, st in stages.items():
        rows = stage_rows(st)
        out[name] = {"calls": st["calls"], "queries": len(rows["rows"]),
                     "queries_with_extra": len(np.unique(np.concatenate([np.zeros(0, np.int64), *st["extra_rows"]]))),
                     "extra_keys": st["extra_keys"], "max_extra_per_query": st["max_extra_per_query"],
                     "missing_keys": rows["missing"], "foreign_keys": st["foreign_keys"],
                     "undefined_rows": st["undefined_rows"], "example": st["example"]}
    return out


def _add(st: dict, rs: RequestSpans) -> None:
    """One request of one call into its stage's counts."""
    st["requests"].append((np.asarray(rs.rows, np.int64), np.asarray(rs.q_pos, np.int64), rs.req))
    st["foreign_keys"] += int((rs.k_pos < 0).sum())
    if rs.seen is None:
        st["undefined_rows"] += len(rs.rows)
        return
    lo, hi = rs.seen
    ilo, ihi = rs.keys.ids(lo, hi)  # (H, qo, K * S)
    ex = (size(lo, hi) - overlap(ilo, ihi, rs.want[0][None], rs.want[1][None])).max(0)  # (qo,) the most any head sees
    st["extra_keys"] += int(ex.sum())
    st["max_extra_per_query"] = max(st["max_extra_per_query"], int(ex.max()))
    hits = np.nonzero(ex)[0]
    st["extra_rows"].append(np.asarray(rs.rows[hits], np.int64))
    if len(hits) and st["example"] is None:
        st["example"] = _example(rs, int(hits[0]), int(ex[hits[0]]))
    rows = np.asarray(rs.rows, np.int64)
    st["defined"].append((rows, rs.want, rowsets.union(rowsets.flat(rows[None, :, None], ilo, ihi))))


def stage_rows(st: dict) -> dict:
    """Per token row of a stage (memoized in ``st``): ``rows`` every row once, its position and
    request (``q_pos``, ``request``: the last call's, as a dict update keeps), ``order``: each
    row's first appearance; of the rows some call defined, ``want`` the ranges the first such
    call intends for it (``rowsets.flat``, as given), ``seen`` the union of what every call lets
    it see (``rowsets.union``), and ``missing``: intended ids no call lets it see."""
    if "_rows" in st:
        return st["_rows"]
    t = np.concatenate([np.zeros(0, np.int64), *(r for r, _, _ in st["requests"])])
    q = np.concatenate([np.zeros(0, np.int64), *(p for _, p, _ in st["requests"])])
    req = np.concatenate([np.zeros(0, np.int64), *(np.full(len(r), i, np.int64) for r, _, i in st["requests"])])
    rows, first = np.unique(t, return_index=True)
    last = len(t) - 1 - np.unique(t[::-1], return_index=True)[1]
    d_rows = np.concatenate([np.zeros(0, np.int64), *(r for r, _, _ in st["defined"])])
    picked = np.zeros(len(d_rows), bool)
    picked[np.unique(d_rows, return_index=True)[1]] = True  # the first call that defines each row
    wants, at = [], 0
    for r, (wlo, whi), _ in st["defined"]:
        k = picked[at:at + len(r)]
        wants.append(rowsets.RowRanges(*(np.asarray(a, np.int64) for a in np.broadcast_arrays(
            r[k][:, None], wlo[k], whi[k]))))
        at += len(r)
    want = rowsets.RowRanges(*(np.concatenate([np.zeros(0, np.int64), *(getattr(w, f).ravel() for w in wants)])
                               for f in ("t", "lo", "hi")))
    seen = rowsets.union(rowsets.concat(u for _, _, u in st["defined"]))
    missing = int(np.clip(want.hi - want.lo + 1, 0, None).sum() - rowsets.overlap_sizes(seen, want.t, want.lo, want.hi).sum())
    st["_rows"] = {"rows": rows, "q_pos": q[last], "request": req[last], "order": first, "defined": np.unique(d_rows),
                   "want": want, "seen": seen, "missing": missing}
    return st["_rows"]
