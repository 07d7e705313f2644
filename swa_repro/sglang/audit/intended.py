"""What each draft token of a speculative verify intends, from the tree's parent links alone
(never from the custom mask sglang builds): its depth, its ancestors, and the committed and draft
keys within the window of its real position ``committed + depth`` (``audit.keys``' docstring,
**intended**; ``audit.spans`` holds the same rule as ranges)."""

from __future__ import annotations

import numpy as np


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
