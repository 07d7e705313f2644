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
    by_req: dict[int, list[int]] = {}
    for t, r in stage["request"].items():
        by_req.setdefault(r, []).append(t)
    if not by_req:
        return None
    rows = max(by_req.values(), key=len)
    q = {t: int(stage["q_pos"][t]) for t in rows}
    defined = sorted((q[t], t) for t in rows if t in stage["seen"])
    lines = [(p, merge(stage["seen"][t][0]), merge(stage["seen"][t][1])) for p, t in defined]
    return {"queries": len(rows), "undefined": merge((q[t], q[t]) for t in rows if t not in stage["seen"]),
            "runs": encode(lines)}


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
