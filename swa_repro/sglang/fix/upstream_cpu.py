"""docs/upstream's registered regression test (and sglang's own FlashInfer kit tests,
tests/sglang_kit_flashinfer_cases.py) on a CPU, to check their logic without a GPU.

A test file imports only sglang and torch, so it runs here unchanged in a child with a release's
overlay first on ``sys.path`` (``run_child``), shipped or fixed (``fix.overlay``), its attention kit
as released or with the kit edits (``kit_copy.kit_overlay``: what the upstream change brings with
the test). Around it: the audit's CPU replacements around the backend (``audit.env.audit_env``:
device="cuda" buffers on the CPU, the kv-indices port, ``merge_state``) and, in place of the three
FlashInfer wrappers, stand-ins that keep FlashInfer's plan-time contract and compute exact
attention: the window mask and the tanh cap are applied only when ``plan()`` asked for them
(``window_left >= 0``, ``logits_soft_cap > 0``), with the values ``forward()`` last set, as the
compiled kernels do. CPU adaptations of the test module only: its
``skipIf(no CUDA / no flashinfer)`` is lifted, the kit functions it calls get ``device="cpu"``, and
it runs under ``torch.no_grad()`` (the kit writes grad-requiring K/V into the pool, which CUDA's
store kernel takes and the CPU fallback refuses: ``sglang.kit`` says where).

Child: ``python -m swa_repro.sglang.fix.upstream_cpu OVERLAY OUT_JSON TEST_FILE...``.
"""

from __future__ import annotations

import json
import math
import sys
import unittest
from pathlib import Path
from unittest import mock

import torch

from swa_repro.core.outputs import write_atomic
from swa_repro.kernel import graph_buffers
from swa_repro.kernel.signatures import DecodeSignature, PagedPrefillSignature, RaggedPrefillSignature
from swa_repro.kernel.wrappers import unpack_paged_kv_cache
from swa_repro.engine import bytecode


def attend(q, k, v, *, sm_scale, causal, window, cap, mask=None):
    """float64 attention of one request, FlashInfer's conventions: query i sits at key position
    ``m - n + i``; ``mask`` (n*m, flattened) replaces causality; LSE in base 2."""
    n, hq = q.shape[:2]
    m, hk = k.shape[:2]
    g = hq // hk
    s = torch.einsum("nhd,mhd->hnm", q.double(), k.double().repeat_interleave(g, 1)) * sm_scale
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    i = torch.arange(n).view(-1, 1) + (m - n)
    j = torch.arange(m).view(1, -1)
    vis = mask.reshape(n, m).bool().cpu() if mask is not None else (j <= i if causal else torch.ones(n, m, dtype=torch.bool))
    if window >= 0:
        vis = vis & (j >= i - window)
    s = s.masked_fill(~vis, -math.inf)
    lse = torch.logsumexp(s, -1)  # (h, n)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]), nan=0.0)
    o = torch.einsum("hnm,mhd->nhd", p, v.double().repeat_interleave(g, 1))
    return o, (lse / math.log(2)).T


class _PlanTime:
    """What the compiled module applies: the window / cap only if plan() selected them."""

    def _keep_plan(self, a):
        self._module_window = int(a.window_left) >= 0
        self._module_cap = (a.logits_soft_cap or 0.0) > 0

    def _params(self, q):
        sm = self._sm_scale if self._sm_scale is not None else q.shape[-1] ** -0.5
        return dict(sm_scale=sm, window=int(self._window_left) if self._module_window else -1,
                    cap=float(self._logits_soft_cap or 0.0) if self._module_cap else 0.0)

    @staticmethod
    def _out(q, parts, return_lse):
        o = torch.cat([p[0] for p in parts]).to(q.dtype).to(q.device)
        lse = torch.cat([p[1] for p in parts]).float().to(q.device)
        return (o, lse) if return_lse else o


class PlanTimePaged(_PlanTime, PagedPrefillSignature):
    """Reads its indices and mask where the kernel does, at run time (``graph_buffers.paged_reads``):
    a CUDA-graph wrapper from the buffers it was given, which another wrapper may have planned into
    since (sglang's verify wrappers share one ``custom_mask_buf``)."""

    def _plan(self, a):
        self._keep_plan(a)

    def _run(self, a):
        self._run_window(a.window_left)
        k_cache, v_cache = unpack_paged_kv_cache(a.paged_kv_cache)
        k_cache, v_cache = k_cache.flatten(0, 1), v_cache.flatten(0, 1)
        b = graph_buffers.paged_reads(self)
        qo_ptr, kv_ptr, idx = b["qo_indptr"], b["paged_kv_indptr"], b["paged_kv_indices"]
        kv_lens = graph_buffers.kv_lens(kv_ptr, b["paged_kv_last_page_len"], self._page_size)
        parts, off = [], 0
        for r in range(len(qo_ptr) - 1):
            qa, qb, ka = int(qo_ptr[r]), int(qo_ptr[r + 1]), int(kv_ptr[r])
            n = kv_lens[r]
            ids = _slots(idx[ka: int(kv_ptr[r + 1])], self._page_size, n).to(k_cache.device)
            mask = None
            if b["custom_mask"] is not None:
                mask, off = b["custom_mask"][off: off + (qb - qa) * n], off + (qb - qa) * n
            parts.append(attend(a.q[qa:qb], k_cache[ids], v_cache[ids], causal=self._causal, mask=mask,
                                **self._params(a.q)))
        return self._out(a.q, parts, a.return_lse)


def _slots(pages, page_size: int, n: int):
    """The first ``n`` token slots of a request's pages (flashinfer page.py: slot = page * ps + i)."""
    return (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:n]


class PlanTimeRagged(_PlanTime, RaggedPrefillSignature):
    def _plan(self, a):
        if a.custom_mask is not None:
            raise NotImplementedError("ragged custom masks are not modelled")
        self._keep_plan(a)
        self._qo, self._kv = a.qo_indptr.cpu().long(), a.kv_indptr.cpu().long()

    def _run(self, a):
        parts = []
        for r in range(len(self._qo) - 1):
            qa, qb, ka, kb = (int(x) for x in (self._qo[r], self._qo[r + 1], self._kv[r], self._kv[r + 1]))
            parts.append(attend(a.q[qa:qb], a.k[ka:kb], a.v[ka:kb], causal=self._causal, **self._params(a.q)))
        return self._out(a.q, parts, a.return_lse)


class PlanTimeDecode(_PlanTime, DecodeSignature):
    def _plan(self, a):
        self._keep_plan(a)
        self._kv, self._idx = a.indptr.cpu().long(), a.indices.cpu().long()

    def _run(self, a):
        self._run_window(a.window_left)
        k_cache, v_cache = unpack_paged_kv_cache(a.paged_kv_cache)
        k_cache, v_cache = k_cache.flatten(0, 1), v_cache.flatten(0, 1)
        parts = []
        for r in range(len(self._kv) - 1):
            ids = self._idx[int(self._kv[r]): int(self._kv[r + 1])].to(k_cache.device)
            parts.append(attend(a.q[r: r + 1], k_cache[ids], v_cache[ids], causal=True, **self._params(a.q)))
        return self._out(a.q, parts, a.return_lse)


class _Result(unittest.TestResult):
    """Also records the subtests that passed (``addSubTest`` with no error)."""

    def __init__(self):
        super().__init__()
        self.subtests: dict[str, str] = {}

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        params = ", ".join(f"{k}={v}" for k, v in subtest.params.items() if k != "backend")
        key = f"{_name(test)}[{params}]"
        if err is None:
            self.subtests[key] = "pass"
        else:
            kind = "fail" if issubclass(err[0], test.failureException) else "error"
            self.subtests[key] = f"{kind}: {_message(err[1])}"


def _name(test) -> str:
    return getattr(test, "test_case", test).id().rsplit(".", 1)[-1]


def _last_line(tb: str) -> str:
    return tb.strip().splitlines()[-1][:300]


def _message(e: BaseException) -> str:
    """One line: the exception's type unless an assertion, and its message (assert_close's
    mismatch count and greatest differences)."""
    text = " ".join(str(e).split())
    return (text if isinstance(e, AssertionError) else f"{type(e).__name__}: {text}")[:300]


def on_cpu(mod) -> None:
    """The module's kit functions called with ``device="cpu"`` (a call that names a device keeps
    it), its test classes' CUDA skip lifted."""
    import functools
    import inspect

    for name, obj in list(vars(mod).items()):
        if inspect.isfunction(obj) and obj.__module__.startswith("sglang.test.kits.") \
                and "device" in inspect.signature(obj).parameters:
            setattr(mod, name, functools.partial(obj, device="cpu"))
        elif isinstance(obj, type) and issubclass(obj, unittest.TestCase) and "__unittest_skip__" in vars(obj):
            obj.__unittest_skip__ = False


def run_cases(test_file: Path) -> dict:
    """``{"tests": {test: status}, "subtests": {"test[params]": status}}`` on the CPU; a status is
    ``pass`` / ``fail: ...`` / ``error: ...`` / ``skipped: ...`` (a test fails when a subtest does)."""
    import importlib.util

    from swa_repro.sglang import harness, releases
    from swa_repro.sglang.audit import env
    from swa_repro.sglang.trace import Trace

    releases.ensure_sgl_kernel()
    spec = importlib.util.spec_from_file_location(f"upstream_cpu_{test_file.stem}", test_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    on_cpu(mod)
    fb = harness.backend_module()
    stand_ins = dict(zip(harness.WRAPPER_NAMES, (PlanTimePaged, PlanTimeRagged, PlanTimeDecode)))
    suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
    tests = {_name(t): "pass" for t in _flatten(suite)}  # a run empties the suite
    result = _Result()
    with mock.patch.dict(env.STAND_INS, stand_ins), env.audit_env(Trace(), fb, use_paged=False, device="cpu"), \
            torch.no_grad():
        suite.run(result)
    for kind, items in (("fail", result.failures), ("error", result.errors)):
        for t, tb in items:
            if not hasattr(t, "test_case"):  # a subtest's failure: its test's status comes from below
                tests[_name(t)] = f"{kind}: {_last_line(tb)}"
    for t, why in result.skipped:
        tests[_name(t)] = f"skipped: {why}"
    for name, status in tests.items():
        bad = [k for k, v in result.subtests.items() if k.startswith(f"{name}[") and v != "pass"]
        if bad and status == "pass":
            first = result.subtests[bad[0]]
            kind, why = first.split(": ", 1)
            tests[name] = f"{kind}: {len(bad)} subtest(s), first {bad[0]}: {why}"[:300]
    return {"tests": tests, "subtests": result.subtests}


def _flatten(suite):
    for t in suite:
        yield from (_flatten(t) if isinstance(t, unittest.TestSuite) else [t])


def main(argv=None) -> int:
    """``OVERLAY OUT_JSON TEST_FILE...`` -> ``{test file name: run_cases(it)}`` in OUT_JSON."""
    overlay, out, *test_files = (Path(x) for x in (argv or sys.argv[1:]))
    sys.path.insert(0, str(overlay.resolve()))  # before anything imports sglang
    bytecode.share(overlay.resolve())  # a fixed / kit copy: the release's compiled modules
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    write_atomic(out, json.dumps({f.name: run_cases(f) for f in test_files}, indent=1).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
