"""Random batch paged prefill cases for ``swa-repro fuzz``: seed -> the same list of Cases, always.

Axes drawn per case (numpy ``default_rng(seed)``; nothing depends on the GPU, so a prebuild-only
run and the probing run on the same seed see the same cases): batch size, prefix (0 or 1..max_len)
and extend (1..max_len) lengths log-uniform, GQA group 1-8 (odd ones split a query row's heads
across CTA_TILE_Q boundaries), head_dim, page size (odd ones included), window class (0, < kv,
>= kv), split-KV allowed or disabled, plan variant (bug: plan without ``window_left``; fix: with
it; ``plans`` may pin one variant per backend, which halves that backend's JIT builds without
changing any other draw), backend. Each case is bounded to ``max_tokens`` keys in all so probing fits memory and time.
``flashinfer_version``, ``sm_count`` and ``arch`` are filled in after drawing (:func:`for_device`).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from swa_repro.core.case import HEAD_DIMS, Case
from swa_repro.core.errors import UsageError

PAGE_SIZES = (1, 1, 16, 16, 2, 3, 7, 13, 32, 64)  # sglang's 1 and flashinfer's 16 drawn twice as often
GROUPS = tuple(range(1, 9))
MAX_QO_HEADS = 16
GEN_BACKENDS = ("fa2", "fa3", "auto")
PLAN_VARIANTS = ("bug", "fix")
AXES = ("backend", "head_dim", "group", "page_size", "window_class", "split_kv_allowed", "plan_variant",
        "batch_size", "max_kv")


def _log_uniform(rng, lo: int, hi: int) -> int:
    """Integer in ``[lo, hi]``, log-uniform so short and long lengths are both common."""
    return int(min(hi, max(lo, round(float(np.exp(rng.uniform(np.log(lo), np.log(hi + 1)))) - 0.5))))


def _lengths(rng, batch: int, max_len: int, max_tokens: int) -> tuple[list[int], list[int]]:
    """Per request prefix (0 with probability 0.3) and extend (>= 1), scaled down so the keys
    of the whole batch stay within ``max_tokens``."""
    pre = [0 if rng.random() < 0.3 else _log_uniform(rng, 1, max_len) for _ in range(batch)]
    ext = [_log_uniform(rng, 1, max_len) for _ in range(batch)]
    total = sum(pre) + sum(ext)
    if total > max_tokens:
        f = max_tokens / total
        pre = [int(p * f) for p in pre]
        ext = [max(1, int(e * f)) for e in ext]
    return pre, ext


def _window(rng, max_kv: int) -> int:
    """0 (10 %), at least the longest KV (15 %), else log-uniform below it."""
    u = rng.random()
    if u < 0.10 or max_kv <= 1:
        return 0
    if u < 0.25:
        return max_kv + int(rng.integers(0, 64))
    return _log_uniform(rng, 1, max_kv - 1)


def _heads(rng) -> tuple[int, int]:
    g = int(rng.choice(GROUPS))
    hk = int(rng.choice((1, 2, 4)))
    hk = max(1, min(hk, MAX_QO_HEADS // g))
    return g * hk, hk


def parse_plans(text: str, backends=GEN_BACKENDS) -> dict:
    """``"bug,fix"`` / ``"fa3:bug"`` / ``"fa2:bug,fa2:fix,fa3:fix"`` -> ``{backend: variants}``.
    A bare variant applies to every backend without an entry of its own; ``auto`` (fa3 on sm90)
    follows fa3's entries unless it has its own."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    bare, own = [], {}
    for item in items:
        b, _, v = item.rpartition(":")
        if v not in PLAN_VARIANTS or (b and b not in GEN_BACKENDS):
            raise UsageError(f"--plans takes comma-separated bug, fix or BACKEND:bug / BACKEND:fix "
                             f"(BACKEND one of {','.join(GEN_BACKENDS)}); got {item!r}")
        (own.setdefault(b, []) if b else bare).append(v)
    if not items:
        raise UsageError("--plans selects no plan variant: give bug, fix or both")
    default = tuple(sorted(set(bare))) or PLAN_VARIANTS
    out = {b: tuple(sorted(set(own.get(b, ())))) or default for b in GEN_BACKENDS}
    if "auto" not in own and "fa3" in own:
        out["auto"] = out["fa3"]
    return {b: out[b] for b in backends}


def _plan_window(window: int, u: float, variants) -> int:
    """The plan's ``window_left``: fix (the window) when ``u < 0.5`` unless ``variants`` pins one."""
    fix = variants == ("fix",) or (len(variants) == 2 and u < 0.5)
    return window if fix else -1


def generate(seed: int, n: int, *, backends=("fa2", "fa3"), head_dims=(64, 128, 256), max_len: int = 2048,
             max_tokens: int = 6144, max_batch: int = 6, flashinfer_version: str | None = None,
             plans: dict | None = None) -> list[Case]:
    """``n`` random cases from ``seed``; named ``fuzz_s<seed>_<index>``. ``plans`` (from
    :func:`parse_plans`) pins plan variants per backend; the draws are the same either way."""
    check_args(n, backends, head_dims, max_len, max_tokens, max_batch)
    plans = plans or {}
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        backend = str(rng.choice(list(backends)))
        batch = int(min(max_batch, _log_uniform(rng, 1, max_batch)))
        pre, ext = _lengths(rng, batch, max_len, max_tokens)
        hq, hk = _heads(rng)
        window = _window(rng, max(p + e for p, e in zip(pre, ext)))
        variants = plans.get(backend, PLAN_VARIANTS)
        kw = dict(prefix_lens=pre, extend_lens=ext, num_qo_heads=hq, num_kv_heads=hk,
                  head_dim=int(rng.choice(list(head_dims))), page_size=int(rng.choice(PAGE_SIZES)),
                  window_left=window, plan_window_left=_plan_window(window, rng.random(), variants), backend=backend,
                  disable_split_kv=bool(rng.random() < 0.25), name=f"fuzz_s{seed}_{k}")
        if flashinfer_version:
            kw["flashinfer_version"] = flashinfer_version
        out.append(Case(**kw))
    return out


def check_args(n, backends, head_dims, max_len, max_tokens, max_batch) -> None:
    """UsageError (one line, exit 2) for anything the generator cannot honour."""
    if n < 1:
        raise UsageError(f"--cases must be >= 1; got {n}")
    bad = [b for b in backends if b not in GEN_BACKENDS]
    if bad or not backends:
        raise UsageError(f"--backends takes a comma-separated subset of {','.join(GEN_BACKENDS)}; got {bad or '(none)'}")
    allowed = set.intersection(*(set(HEAD_DIMS["fa3" if b == "auto" else b]) for b in backends))
    bad = [d for d in head_dims if d not in allowed]
    if bad or not head_dims:
        raise UsageError(f"--head-dims takes a comma-separated subset of {sorted(allowed)}; got {bad or '(none)'}")
    if max_len < 1 or max_batch < 1 or max_tokens < 2:
        raise UsageError("--max-len and --max-batch must be >= 1 and --max-tokens >= 2")


def for_device(cases, *, flashinfer_version: str, sm_count: int, arch) -> list[Case]:
    """The same draws, stamped with the GPU and flashinfer they run on."""
    return [c.with_(flashinfer_version=flashinfer_version, sm_count=int(sm_count), arch=tuple(arch)) for c in cases]


def plan_variant(case: Case) -> str:
    """bug: planned without ``window_left`` (sglang <= 0.5.15.post1's paged path); fix: with it."""
    return "bug" if case.plan_window_left < 0 else "fix"


def window_class(case: Case) -> str:
    if case.window_left == 0:
        return "0"
    return ">=kv" if case.window_left >= max(case.kv_lens) else "<kv"


def axis_values(case: Case) -> dict:
    """The value of each generation axis for one case (keys: :data:`AXES`)."""
    kv = max(case.kv_lens)
    backend = case.backend if case.backend != "auto" else f"auto->{case.resolved_backend}"
    return {"backend": backend, "head_dim": case.head_dim, "group": case.group_size, "page_size": case.page_size,
            "window_class": window_class(case), "split_kv_allowed": not case.disable_split_kv,
            "plan_variant": plan_variant(case), "batch_size": case.batch_size,
            "max_kv": "<=128" if kv <= 128 else "<=1024" if kv <= 1024 else ">1024"}


def axes_covered(cases, extra: dict | None = None) -> dict:
    """Per axis, cases per value (string keys, sorted): the 'axes covered' table of a report.
    ``extra`` maps further axis names to one value per case (e.g. the planned split-KV)."""
    cols = {a: [axis_values(c)[a] for c in cases] for a in AXES}
    cols.update(extra or {})
    return {a: {str(k): v for k, v in sorted(Counter(vals).items(), key=lambda kv: str(kv[0]))}
            for a, vals in cols.items()}


def module_labels(cases) -> list[str]:
    """Distinct JIT modules the cases need (``backend/hd/use_swa``): each costs a JIT build."""
    return sorted({f"{c.resolved_backend}/hd{c.head_dim}/use_swa_{c.plan_window_left >= 0}" for c in cases})
