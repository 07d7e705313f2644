"""One request's rows as ranges, small enough to keep in an audit document: what a keys heatmap draws.

``spans.stage_spans`` holds, per token row of a stage, the key ids the row intends and the ones the
calls of the stage let it see (the union over heads and over a ragged + paged pair). At a real window
that is thousands of rows of a few ranges each; here the request with the most rows is kept as
*runs*: consecutive positions whose ranges all move by the same step from one row to the next
(a sliding window: one run; fa2's per-CTA leak: one run per tile). :func:`decode` gives the rows back
exactly; ``tests/test_family_answer.py`` holds the round trip.
"""

from __future__ import annotations


def merge(ranges) -> list[list[int]]:
    """Inclusive ``(lo, hi)`` ranges -> sorted, disjoint, non-adjacent ``[lo, hi]`` (empty ones dropped)."""
    out: list[list[int]] = []
    for lo, hi in sorted((int(a), int(b)) for a, b in ranges if b >= a):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def request_rows(stage: dict) -> dict | None:
    """The request of ``stage`` (``spans.stage_spans``' value) with the most rows, encoded; None
    without rows. ``undefined``: positions whose output is no masked softmax (split-KV without
    the window), drawn as such, never as keys."""
    import numpy as np

    from swa_repro.sglang.audit import rowsets
    from swa_repro.sglang.audit.spans import stage_rows

    sr = stage_rows(stage)
    if not len(sr["rows"]):
        return None
    by_first = np.argsort(sr["order"], kind="stable")  # rows in the order they first came
    reqs = sr["request"][by_first]
    counts = {}
    for r in reqs.tolist():  # requests in the order their first row came: the first of the largest wins
        counts[r] = counts.get(r, 0) + 1
    chosen = max(counts, key=counts.get)
    mine = reqs == chosen
    rows, q = sr["rows"][by_first][mine], sr["q_pos"][by_first][mine]
    defined = np.isin(rows, sr["defined"])
    order = np.lexsort((rows[defined], q[defined]))
    return {"queries": len(rows), "undefined": merge((p, p) for p in q[~defined].tolist()),
            "runs": encode_flat(q[defined][order], rows[defined][order], rowsets.union(sr["want"]), sr["seen"])}


def encode_flat(q, t, want, seen) -> list[dict]:
    """:func:`encode` of the lines ``(q[k], want of row t[k], seen of row t[k])`` (``q``
    ascending; ``want`` and ``seen`` ``rowsets.union`` forms), over arrays: a row joins the
    previous row's run where its position is the next, its range counts the same, and (from the
    run's third row on) its endpoints move by the run's step."""
    import numpy as np

    from swa_repro.sglang.audit import rowsets

    if not len(t):
        return []
    wlo, whi, nw = rowsets.padded(want, t)
    slo, shi, ns = rowsets.padded(seen, t)
    flat = np.concatenate([np.stack([wlo, whi], 2).reshape(len(t), -1), np.stack([slo, shi], 2).reshape(len(t), -1)], 1)
    split = 2 * wlo.shape[1]  # want's slots, then seen's (a row's unused slots hold 0)
    step = np.zeros_like(flat)
    step[1:] = flat[1:] - flat[:-1]  # meaningful where the shapes agree (unused slots are 0 in both)
    follows = np.zeros(len(t), bool)
    follows[1:] = (q[1:] == q[:-1] + 1) & (nw[1:] == nw[:-1]) & (ns[1:] == ns[:-1])
    same = np.zeros(len(t), bool)
    same[2:] = (step[2:] == step[1:-1]).all(1)
    starts, start = [0], 0
    for i in np.flatnonzero(~follows | ~same).tolist():  # where a run may end; elsewhere a row joins
        if i and (not follows[i] or i != start + 1):
            starts.append(i)
            start = i
    ends = starts[1:] + [len(t)]
    runs = []
    for a, b in zip(starts, ends):
        n_w, n_s = int(nw[a]), int(ns[a])
        d = step[a + 1] if b - a > 1 else np.zeros_like(step[a])
        runs.append({"q": int(q[a]), "n": b - a, "want": np.stack([wlo[a, :n_w], whi[a, :n_w]], 1).tolist(),
                     "seen": np.stack([slo[a, :n_s], shi[a, :n_s]], 1).tolist(),
                     "step": d[:2 * n_w].tolist() + d[split:split + 2 * n_s].tolist()})
    return runs


def _flat(want, seen) -> tuple:
    return tuple(x for r in (*want, *seen) for x in r)


def encode(lines) -> list[dict]:
    """``[(position, want ranges, seen ranges), ...]`` (positions ascending) -> runs
    ``{"q": first position, "n": rows, "want": [[lo, hi]..], "seen": [..], "step": [d..]}``: row
    ``k`` of a run is at ``q + k`` with every endpoint ``e + k * d``."""
    runs: list[dict] = []
    prev = None
    for q, want, seen in lines:
        flat, shape = _flat(want, seen), (len(want), len(seen))
        if runs and prev is not None and prev[0] + 1 == q and prev[2] == shape:
            step = tuple(a - b for a, b in zip(flat, prev[1]))
            run = runs[-1]
            if run["n"] == 1 or tuple(run["step"]) == step:
                run["step"], run["n"] = list(step), run["n"] + 1
                prev = (q, flat, shape)
                continue
        runs.append({"q": q, "n": 1, "want": [list(r) for r in want], "seen": [list(r) for r in seen],
                     "step": [0] * len(flat)})
        prev = (q, flat, shape)
    return runs


def decode(runs) -> list[tuple[int, list, list]]:
    """:func:`encode`'s inverse: ``[(position, want ranges, seen ranges), ...]``."""
    out = []
    for run in runs:
        nw, flat0 = len(run["want"]), _flat(run["want"], run["seen"])
        for k in range(run["n"]):
            e = [a + k * d for a, d in zip(flat0, run["step"])]
            pairs = [e[i:i + 2] for i in range(0, len(e), 2)]
            out.append((run["q"] + k, pairs[:nw], pairs[nw:]))
    return out
