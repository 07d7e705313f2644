"""The committed list of cases ``swa-repro record`` runs on the GPU.

Coverage: GQA group 1/2/4/8; head_dim 64/128/256; page size 1 and 16; with and without prefix;
one request and many; split-KV on (one long request, few queries: the no-window plan splits) and
off (``disable_split_kv`` and naturally unsplit); fa2, fa3 and auto; plan without ``window_left``
(the bug, ``*_bug``) and with it (the fix, ``*_fix``). Distinct compiled modules are kept few
(fa2 JIT-builds in ~30 s, fa3 in ~100 s): see :func:`modules_needed` and
``python -m swa_repro.evidence.cases``, which also checks the model's predictions.

``flashinfer_version``, ``sm_count`` and ``arch`` are filled in at record time from the GPU.
"""

from __future__ import annotations

import sys

from swa_repro.core.errors import UsageError
from swa_repro.core.case import Case

H = dict(num_qo_heads=4, num_kv_heads=4, head_dim=128, page_size=16)


def _pair(name, **kw):
    """A bug case and its fix: the same shapes, plan with ``window_left=-1`` vs ``=window_left``."""
    bug = Case(name=f"{name}_bug", plan_window_left=-1, **kw)
    return [bug, bug.with_(plan_window_left=bug.window_left, name=f"{name}_fix")]


CASES: list[Case] = [
    # the seed case: three fresh requests, window 4, MHA, page 16
    *_pair("seed", prefix_lens=(0, 0, 0), extend_lens=(6, 8, 12), window_left=4, **H),
    # GQA 4 with prefixes and many query tiles (CTA_TILE_Q 128 -> 32 queries per tile); 67 tiles
    # exceed the 66-CTA split budget (2*132/4), so the plan does not split
    *_pair("gqa4_prefix_tiles", prefix_lens=(300, 40), extend_lens=(1100, 1000), window_left=64,
           num_qo_heads=16, num_kv_heads=4, head_dim=128, page_size=16),
    # sglang's page size 1, GQA 8 (one KV head), one request with a prefix
    Case(name="gqa8_page1_bug", prefix_lens=(100,), extend_lens=(64,), window_left=16,
         num_qo_heads=8, num_kv_heads=1, head_dim=128, page_size=1),
    # GQA 2 at head_dim 64, many requests of mixed shapes
    Case(name="gqa2_hd64_many_bug", prefix_lens=(0, 17, 64, 5, 200, 0), extend_lens=(40, 23, 90, 7, 33, 130),
         window_left=32, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16),
    # head_dim 256 (CTA_TILE_Q never 128 there), MHA; KV within the minimum chunk: no split
    Case(name="hd256_bug", prefix_lens=(50, 0), extend_lens=(70, 30), window_left=16,
         num_qo_heads=2, num_kv_heads=2, head_dim=256, page_size=16),
    # one long (8k) request: the no-window plan does not split (64 q tiles fit the CTA budget)
    Case(name="long8k_unsplit_bug", prefix_lens=(0,), extend_lens=(8192,), window_left=256, **H),
    # split-KV: one request, long prefix, few queries; the no-window plan splits the KV
    *_pair("split_long", prefix_lens=(4000,), extend_lens=(64,), window_left=128, **H),
    Case(name="split_long_nosplit_bug", prefix_lens=(4000,), extend_lens=(64,), window_left=128,
         disable_split_kv=True, **H),
    # split-KV with a single query row: the plan's and the run's chunk strides differ, but row 0's
    # partial-output slots line up, so the model predicts a defined result (exact here)
    Case(name="split_single_row_bug", prefix_lens=(4000,), extend_lens=(1,), window_left=128, **H),
    # sglang's own layout: page size 1, each request's KV trimmed to the last W + extend keys
    Case(name="sglang_trim_page1_bug", prefix_lens=(128, 40), extend_lens=(300, 90), window_left=128,
         num_qo_heads=8, num_kv_heads=8, head_dim=128, page_size=1),
    # split-KV over a batch: the long request exceeds W + CTA_TILE_Q, the short ones do not
    Case(name="split_batch_bug", prefix_lens=(3000, 100, 80), extend_lens=(48, 40, 24), window_left=64, **H),
    # fa3 (sm90) and auto (fa3 on sm90): the window ignored entirely without the swa module
    *_pair("fa3_gqa4", prefix_lens=(64, 0), extend_lens=(100, 20), window_left=8, backend="fa3",
           num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16),
    Case(name="auto_gqa4_bug", prefix_lens=(64, 0), extend_lens=(100, 20), window_left=8, backend="auto",
         num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=16),
]

BY_NAME: dict[str, Case] = {c.name: c for c in CASES}


def select(names: str) -> list[Case]:
    """``all`` or comma-separated names -> cases; unknown names raise with the known ones."""

    if names.strip() == "all":
        return list(CASES)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if not wanted:
        raise UsageError(f"--cases selects no case: give names from {', '.join(BY_NAME)}, or 'all'")
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise UsageError(f"--cases: unknown case(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)} or 'all'")
    return [BY_NAME[n] for n in wanted]


def module_label(case: Case) -> str:
    """The part of the JIT module uri that differs between our cases."""
    return f"{case.resolved_backend}/hd{case.head_dim}/use_swa_{case.plan_window_left >= 0}"


def modules_needed(cases=CASES) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in cases:
        out.setdefault(module_label(c), []).append(c.name)
    return out


def risky_last(cases) -> list[Case]:
    """Order for recording: cases the model calls ``undefined`` (split-KV reads of partial outputs
    nobody wrote) run last, so a fault there cannot cost the others."""
    from swa_repro.kernel.model import simulate

    return sorted(cases, key=lambda c: "undefined" in simulate(c).statuses)


def table(cases=CASES) -> str:
    from swa_repro.kernel.model import simulate

    rows = [("case", "backend", "g", "hd", "page", "W", "plan_W", "split", "cta_q", "model status")]
    for c in cases:
        s = simulate(c).summary()
        rows.append((c.name, c.backend, str(c.group_size), str(c.head_dim), str(c.page_size), str(c.window_left),
                     str(c.plan_window_left), str(s["split_kv"]), str(s["cta_tile_q"]), ",".join(s["status"])))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(x.ljust(n) for x, n in zip(r, w)) for r in rows]
    lines += ["", "modules to JIT-build:"]
    lines += [f"  {m}: {', '.join(names)}" for m, names in modules_needed(cases).items()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
    sys.exit(0)
