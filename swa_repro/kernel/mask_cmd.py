"""``swa-repro mask``: effective masks of one case, from the kernel model or the real kernel.

Writes ``mask_0, mask_1, ...`` (bool, extend_len x kv_len; union over the query heads) and
``status`` (one string per request) to an ``.npz``, and prints a JSON summary.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from swa_repro.core.case import Case, CaseError


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip() != "")
    except ValueError:
        raise CaseError(f"{flag} takes comma-separated integers like 0,4,8; got {text!r}") from None
    return vals


def add_case_args(p) -> None:
    """The shape flags shared by every command that takes one case."""
    p.add_argument("--backend", default="fa2", help="fa2 | fa3 | auto")
    p.add_argument("--plan-window-left", type=int, default=-1, help="window given to plan(): -1 = the bug")
    p.add_argument("--window-left", type=int, default=4, help="the layer's window, given to forward()")
    p.add_argument("--prefix-lens", required=True, help="comma-separated, one per request")
    p.add_argument("--extend-lens", required=True, help="comma-separated, one per request")
    p.add_argument("--num-qo-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--disable-split-kv", action="store_true")
    p.add_argument("--sm-count", type=int, default=132, help="SMs of the GPU modelled (H100/H200: 132)")
    p.add_argument("--flashinfer-version", default="0.7.2.post1", help="modelled flashinfer: 0.6.12 | 0.7.2.post1")


def case_from_args(a) -> Case:
    return Case(
        prefix_lens=_ints(a.prefix_lens, "--prefix-lens"), extend_lens=_ints(a.extend_lens, "--extend-lens"),
        num_qo_heads=a.num_qo_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, page_size=a.page_size,
        window_left=a.window_left, plan_window_left=a.plan_window_left, backend=a.backend,
        disable_split_kv=a.disable_split_kv, sm_count=a.sm_count, flashinfer_version=a.flashinfer_version,
    )


def register(sub) -> None:
    p = sub.add_parser("mask", help="effective masks of one case (model or live probe) -> .npz")
    p.add_argument("--mode", choices=("model", "live"), default="model")
    add_case_args(p)
    p.add_argument("--out", required=True, help="output .npz")
    p.set_defaults(func=main)


def masks_for(case: Case, mode: str) -> tuple[list[np.ndarray], list[str], dict]:
    """Per-request union masks, statuses and a summary, from the model or the real kernel."""
    if mode == "model":
        from swa_repro.kernel.model import simulate

        res = simulate(case)
        return [r.mask() for r in res.requests], res.statuses, res.summary()
    from swa_repro.core.mode import require_live

    require_live()
    from swa_repro.kernel.probe import probe_case

    pr = probe_case(case)
    return pr.union_masks(), pr.statuses(), pr.summary()


def main(a) -> int:
    case = case_from_args(a)
    if not a.out.endswith(".npz"):
        raise CaseError(f"--out must name an .npz file; got {a.out!r}")
    masks, status, summary = masks_for(case, a.mode)
    arrays = {f"mask_{i}": m for i, m in enumerate(masks)}
    np.savez_compressed(a.out, status=np.array(status), **arrays)
    json.dump({"mode": a.mode, "case": case.to_dict(), "out": a.out, **summary}, sys.stdout)
    sys.stdout.write("\n")
    return 0
