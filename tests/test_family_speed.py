"""Issue #41's speed targets: each mechanism that makes one release's table row cheaper, held by a count
(parses, signature builds, tensor writes), so a change that brings the cost back fails here, not only in
``benchmarks.family_audit``'s timing."""

from __future__ import annotations

import ast
import inspect

import torch

from swa_repro.engine import config_reads as cr
from swa_repro.sglang import release_configs, releases_kit, swa_archs


def _files(tmp_path):
    """A release's ``srt/`` with two model files, one importing the other (``test_swa_archs``' shape)."""
    srt = tmp_path / "sglang" / "srt"
    (srt / "models").mkdir(parents=True)
    (srt / "models" / "base.py").write_text(
        "class Attn:\n    def __init__(self, config):\n        self.w = config.sliding_window\n"
        "        self.attn = RadixAttention(1, sliding_window_size=self.w - 1)\n")
    (srt / "models" / "a.py").write_text(
        "from sglang.srt.models.base import Attn\n"
        "class WinModel:\n    def __init__(self, config):\n        self.h = config.hidden_size\n        self.l = Attn(config)\n"
        "EntryClass = [WinModel]\n")
    return srt


def test_a_model_file_is_parsed_once_for_discovery_config_reads_and_class_names(tmp_path, monkeypatch):
    """``swa_archs.discover``, ``config_reads`` (asked again after each key ``arch_cells.filled_config``
    fills) and ``release_configs.class_names`` read the same files: one parse each in a process
    (before: swa_archs and class_names each kept their own parse beside ``config_reads.model_tree``)."""
    srt = _files(tmp_path)
    parsed = []
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda src, *a, **k: parsed.append(1) or real(src, *a, **k))
    cr.model_tree.cache_clear()
    found = swa_archs.discover(srt)
    assert [a.architecture for a in found] == ["WinModel"] and found[0].windows == ("base.py:4",)
    walks = []
    real_reachable = cr._reachable
    monkeypatch.setattr(cr, "_reachable", lambda *a, **k: walks.append(1) or real_reachable(*a, **k))
    for _ in range(3):
        reads = cr.config_reads(srt / "models" / "a.py", "WinModel", branches=False, build_only=True)
        assert reads == {"hidden_size": "a.py:4", "sliding_window": "base.py:3"}
        reads["mutated"] = "by a caller"  # each call's dict is its own
    assert "WinModel" in release_configs.class_names(srt / "models" / "a.py")
    from swa_repro.sglang import model_configs
    from swa_repro.sglang.audit import arch_fill

    # the EntryClass lookup and the plan's forms read the same parse too (before: one more each)
    assert model_configs.model_file_in(srt / "models", "WinModel") == srt / "models" / "a.py"
    assert arch_fill.read_forms({"hidden_size": 8}, [srt / "models" / "a.py"]) == {}
    assert len(parsed) == 2, f"{len(parsed)} parses of 2 model files"
    assert len(walks) == 1, "config_reads walked the same class again"


def test_a_stand_in_signature_is_built_once_for_every_call_bound(monkeypatch):
    """A release row binds ~26k recorded calls to the stand-ins' signatures (``audit.calls.bind`` /
    ``given``): the signature of each (class, method) is built once, not per call."""
    from swa_repro.sglang.audit import calls
    from swa_repro.sglang.audit.env import RAGGED

    built = []
    real = inspect.signature
    monkeypatch.setattr(inspect, "signature", lambda fn, *a, **k: built.append(fn) or real(fn, *a, **k))
    calls.signature.cache_clear()
    for i in range(20):
        b = calls.bind(RAGGED, "forward", [i, i + 1, i + 2], {"causal": True})
        assert (b["q"], b["causal"], b["pos_encoding_mode"]) == (i, True, "NONE")
        assert calls.given(RAGGED, "forward", [i, i + 1, i + 2], {"causal": True}) == {"q", "k", "v", "causal"}
    assert len(built) == 1


class _Pool:
    def __init__(self, rows, cols):
        self.req_to_token = torch.zeros(rows, cols, dtype=torch.int32)


def test_the_kits_token_slot_writes_skip_tensor_setitem_and_land_in_the_pool(monkeypatch):
    """The kit's ``_make_forward_batch`` writes ``req_to_token`` one element at a time (0.5.23
    dense_attention.py:741-742); on a CPU pool each write goes to a numpy view of the same memory:
    the same values, no ``Tensor.__setitem__`` per element, and the tensor itself back afterwards."""
    runner = type("R", (), {})()
    runner.req_to_token_pool = _Pool(2, 64)
    t = runner.req_to_token_pool.req_to_token
    kit_writes = []

    def make_forward_batch(case, runner, *, max_context_len, device, loc_fn=None):  # the kit's loop, as shipped
        rt = runner.req_to_token_pool.req_to_token
        for r in range(2):
            for p in range(max_context_len):
                rt[r, p] = 1000 * r + p
        rt[1, :2] = torch.tensor([7, 8], dtype=torch.int32)  # a slice: the tensor's own write
        kit_writes.append(int(torch.sum(rt)))  # a torch function on it sees the tensor
        return "batch"

    kit = type("K", (), {"_make_forward_batch": staticmethod(make_forward_batch)})
    monkeypatch.setattr(releases_kit, "kit_module", lambda: kit)
    monkeypatch.setattr(releases_kit, "kit_case", lambda kit, case, mode: case)
    setitems = []
    real = torch.Tensor.__setitem__
    monkeypatch.setattr(torch.Tensor, "__setitem__", lambda self, k, v: (self is t and setitems.append(k))
                        or real(self, k, v))
    assert releases_kit.forward_batch("case", runner, "extend", 64, "cpu") == "batch"
    assert runner.req_to_token_pool.req_to_token is t
    want = torch.tensor([[1000 * r + p for p in range(64)] for r in range(2)], dtype=torch.int32)
    want[1, :2] = torch.tensor([7, 8])
    assert torch.equal(t, want) and kit_writes == [int(want.sum())]
    assert len(setitems) == 1, f"{len(setitems)} Tensor.__setitem__ calls for 128 element writes"


def test_large_zero_outputs_and_backend_buffers_are_not_written_whole(monkeypatch):
    """A stand-in's zero output and a backend's ``torch.zeros(..., device="cuda")`` buffer on a CPU host
    (``engine.standins``): zeros as ``torch.zeros`` gives them (values, shape, dtype, writable), but from
    1 MB up not through ``torch.zeros`` (a memset of every page; calloc maps pages only where written)."""
    from swa_repro.engine import standins

    made = []
    real = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: made.append(a) or real(*a, **k))
    q = torch.empty(4096, 64, 256, dtype=torch.bfloat16)
    o, lse = standins._zeros(q, 256, True)
    big = standins.CpuTorch().zeros((4096, 1024), dtype=torch.int32, device="cuda")
    small = standins.CpuTorch().zeros(3, 4, dtype=torch.int64, device="cuda")
    assert made == [((3, 4),)], "a large zero tensor went through torch.zeros"
    for t, shape, dtype in ((o, (4096, 64, 256), torch.bfloat16), (lse, (4096, 64), torch.float32),
                            (big, (4096, 1024), torch.int32), (small, (3, 4), torch.int64)):
        assert (tuple(t.shape), t.dtype, t.device.type) == (shape, dtype, "cpu") and not t.any()
    o[7, 3, 5] = 2.5
    big[-1, -1] = 9
    assert float(o.sum()) == 2.5 and int(big.sum()) == 9 and o.is_contiguous()


def test_the_column_plan_is_computed_once_per_release_content_and_code(tmp_path, monkeypatch):
    """``arch_cells.plan`` (every model file read, ~80 config classes built: ~11 CPU-s for 0.5.23) goes
    through the result cache keyed on the release's RECORD, the code and the libraries: a second process
    (or test file) asking for the same release reads it; another release content computes it again; a
    stored plan and a fresh one are the same JSON types."""
    from swa_repro.sglang.audit import arch_cache, arch_cells

    assert arch_cells.plan.uncached.__module__ == arch_cells.__name__  # the table's plan is the cached one
    monkeypatch.setenv("SWA_REPRO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SWA_REPRO_NO_CACHE", raising=False)
    overlay = tmp_path / "overlay"
    (overlay / "sglang-9.9.dist-info").mkdir(parents=True)
    (overlay / "sglang-9.9.dist-info" / "RECORD").write_text("sglang/srt/models/a.py,sha256=aaa,10\n")
    runs = []

    def fake_plan(version, ov):
        runs.append(version)
        return {"A": {"small": {"config": {"layer_types": ("sliding", "full")}}}}, {"B": {"family": "B"}}

    plan = arch_cache.cached_plan(fake_plan)
    first = plan("9.9", overlay)
    assert plan("9.9", overlay) == first and runs == ["9.9"]
    assert first[0]["A"]["small"]["config"]["layer_types"] == ["sliding", "full"]  # as stored: JSON's list
    (overlay / "sglang-9.9.dist-info" / "RECORD").write_text("sglang/srt/models/a.py,sha256=bbb,10\n")
    plan("9.9", overlay)
    assert runs == ["9.9", "9.9"]
    monkeypatch.setenv("SWA_REPRO_NO_CACHE", "1")
    plan("9.9", overlay)
    assert len(runs) == 3


def test_the_benchmark_counts_the_cpu_of_a_process_its_child_left_behind(tmp_path):
    """``benchmarks.family_audit.timed`` counts every process's CPU: an orphan of the CLI's tree (a fork
    server it did not wait for) is adopted by the benchmark (a subreaper) and reaped, not lost to init."""
    import subprocess
    import sys

    script = tmp_path / "m.py"
    script.write_text(
        "import os, resource, subprocess, sys\n"
        "from benchmarks.family_audit import reap_orphans, subreaper\n"
        "assert subreaper()\n"
        "burn = 'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass'\n"
        "subprocess.run(['sh', '-c', f'{sys.executable} -c \"{burn}\" &'])\n"  # the shell exits at once
        "reap_orphans()\n"
        "r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(r.ru_utime + r.ru_stime)\n")
    from benchmarks.family_audit import ROOT

    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) >= 0.5, f"the orphan's 0.6 CPU-s not counted: {out.stdout}"


def test_a_plan_call_is_decoded_and_bound_once_for_its_arguments_and_the_names_it_passed(monkeypatch):
    """``audit.calls.bound``: a recorded plan's bound arguments (defaults applied) and the names it
    passed come from one decode and one bind (``pairs`` and ``core.plan_texts`` asked ``bind`` and
    ``given`` apart: every plan call was decoded and bound twice)."""
    from swa_repro.sglang.audit import calls
    from swa_repro.sglang.audit.env import RAGGED

    binds = []
    real = inspect.Signature.bind
    monkeypatch.setattr(inspect.Signature, "bind", lambda self, *a, **k: binds.append(1) or real(self, *a, **k))
    for i in range(10):
        b, passed = calls.bound(RAGGED, "forward", [i, i + 1, i + 2], {"causal": True})
        assert (b["q"], b["pos_encoding_mode"]) == (i, "NONE") and passed == {"q", "k", "v", "causal"}
    assert len(binds) == 10


def _fake_memory_pool(monkeypatch, **flags):
    """A ``sglang.srt.mem_cache.memory_pool`` whose ``_set_kv_buffer_impl`` is the release's naive copy
    (0.5.23 memory_pool.py:216-218), counting its calls."""
    import sys
    import types

    mp = types.ModuleType("sglang.srt.mem_cache.memory_pool")
    mp.calls = []

    def impl(k, v, k_cache, v_cache, indices, row_dim, store_dtype, device_module, *rest):
        mp.calls.append(indices)
        k_cache[indices] = k
        v_cache[indices] = v

    mp._set_kv_buffer_impl = impl
    for n in ("_is_cuda", "_is_hip", "_is_xpu", "_is_npu", "_is_cpu"):
        setattr(mp, n, flags.get(n, False))
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.memory_pool", mp)
    return mp


def test_the_family_audits_kv_copies_are_skipped_only_where_they_cannot_fail(monkeypatch):
    """The family audit's trace keeps k/v and the KV pool by shape only, so the pool's copy of k/v
    (``_set_kv_buffer_impl``, ~50 CPU-s of 0.5.23's table child) is skipped where it is an exact row copy
    at in-range indices; a copy the release would refuse (a shape, an index out of range, a dtype) still
    runs the release's function and raises there; outside the audit the release's function is back."""
    from swa_repro.sglang.audit.env import unread_kv_writes

    mp = _fake_memory_pool(monkeypatch)
    shipped = mp._set_kv_buffer_impl
    cache = torch.ones(8, 2, 4, dtype=torch.bfloat16)
    k = torch.zeros(3, 2, 4, dtype=torch.bfloat16)
    at = torch.tensor([0, 5, -1])
    with unread_kv_writes():
        mp._set_kv_buffer_impl(k, k, cache, cache, at, 8, torch.bfloat16, None)
        assert mp.calls == [] and bool((cache == 1).all()), "an exact copy the audit never reads was made"
        for bad_k, bad_at in ((torch.zeros(3, 8, dtype=torch.bfloat16), at), (k, torch.tensor([0, 5, 8])),
                              (k.float(), at), (k, at.int())):
            try:
                mp._set_kv_buffer_impl(bad_k, bad_k, cache, cache, bad_at, 8, torch.bfloat16, None)
            except (IndexError, RuntimeError):
                pass
            assert mp.calls[-1] is bad_at, "a copy that may fail did not run the release's own function"
    assert mp._set_kv_buffer_impl is shipped
    mp._is_cuda = True
    with unread_kv_writes():  # a GPU dispatch at import: the release's function, always
        assert mp._set_kv_buffer_impl is shipped


def test_merge_state_reads_no_stand_in_output_it_knows_is_zero():
    """sglang's ragged+prefix extend merges two stand-in outputs (``_safe_merge_state``); a fresh
    stand-in output is known zero without a scan (``Tensor.any`` over tokens x heads x head_dim was ~5
    CPU-s of 0.5.23's table child), and one written since, also through a view, is read again."""
    from torch.overrides import TorchFunctionMode

    from swa_repro.engine import standins

    class Anys(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Anys.n += func in (torch.Tensor.any, torch.any)
            return func(*args, **(kwargs or {}))

    q = torch.zeros(5, 2, 4, dtype=torch.bfloat16)
    (a, sa), (b, sb) = standins._zeros(q, 4, True), standins._zeros(q, 4, True)
    assert standins.known_zero(a) and standins.known_zero(b)
    with Anys():
        v, _ = standins.merge_state(a, sa, b, sb)
    assert Anys.n == 0 and not v.any()
    b[1:2].view(-1)[0] = 2.0  # written through a view: no longer known
    assert not standins.known_zero(b) and not standins.known_zero(a[1:])
    with Anys():
        v, _ = standins.merge_state(a, sa, b, sb)
    assert Anys.n >= 1 and float(v[1, 0, 0]) == 1.0  # (0 * 1 + 2 * 1) / 2


def test_slot_positions_are_a_vectorised_lookup_that_keeps_the_dicts_answers():
    """``keys._positions_of_slots`` (each call of every run: ~7 CPU-s of 0.5.23's table child as a dict and
    a list comprehension per call) answers as the dict did: a slot's last position in the request's
    req-to-token row, -1 for a slot not in it, slot 0 (padding) never."""
    import numpy as np

    from swa_repro.sglang.audit import keys

    def by_dict(row, slots):
        where = {int(s): p for p, s in enumerate(row) if s > 0}
        return np.array([where.get(int(s), -1) for s in slots], np.int64)

    g = torch.Generator().manual_seed(3)
    for n in (0, 1, 7, 300):
        table = torch.randint(0, 40, (3, n), generator=g, dtype=torch.int32)  # repeats and zeros on purpose
        snap = {"req_to_token": table, "req_pool_indices": torch.tensor([2, 0, 1])}
        slots = torch.randint(-2, 45, (50,), generator=g).numpy()
        for i in range(3):
            got = keys._positions_of_slots(snap, i, slots)
            assert got.dtype == np.int64 and got.tolist() == by_dict(table[snap["req_pool_indices"][i]].numpy(),
                                                                      slots).tolist()
    assert keys._positions_of_slots(snap, 0, np.array([], np.int64)).shape == (0,)


def test_a_runs_effective_calls_are_paired_once_and_again_when_its_trace_changes(monkeypatch):
    """``calls.pairs`` is asked ~9 times per run by a family audit (record, findings, wrappers, spans per GPU
    class); it pairs a run once, hands each caller its own list, and pairs again once the trace grew."""
    from swa_repro.sglang.audit import calls
    from swa_repro.sglang.audit.paths import PathRun

    made = []
    monkeypatch.setattr(calls, "_pairs", lambda run: made.append(1) or ["pair"] * len(run.trace.calls))
    trace = type("T", (), {"calls": [1, 2]})()
    run = PathRun("decode", None, trace, 4, 0.0)
    first = calls.pairs(run)
    first.append("mine")
    assert [calls.pairs(run) for _ in range(8)] == [["pair", "pair"]] * 8 and len(made) == 1
    trace.calls.append(3)
    assert calls.pairs(run) == ["pair"] * 3 and len(made) == 2
    run.graph_stage[0] = "capture"
    calls.pairs(run)
    assert len(made) == 3


def test_a_release_classs_line_is_found_once_per_process(monkeypatch):
    """``families.def_line`` parses a class's whole file to find its line; a family audit asks ~440 times for
    a few dozen classes (the model class, the pool and allocator classes per run): once per object."""
    from swa_repro.sglang import families

    found = []
    real = inspect.getsourcelines
    monkeypatch.setattr(inspect, "getsourcelines", lambda obj: found.append(obj) or real(obj))
    families._def_line.cache_clear()
    lines = {families.def_line(c) for _ in range(5) for c in (_Pool, _files)}
    assert len(lines) == 2 and all(x.endswith(f":{real(c)[1]}") for x, c in zip(sorted(lines), (_files, _Pool)))
    assert found == [_Pool, _files]


def test_a_releases_serverargs_child_runs_beside_its_family_child(monkeypatch):
    """``family_run.audit_release``: the release's ServerArgs facts (``_serving``: a child of ~230 forks,
    ~28 CPU-s for 0.5.23's columns) do not wait for the family child (~40 CPU-s): both are asked at once,
    on the second core; the answer is built from both as before, and a family child's failure is the
    error said."""
    import threading

    import swa_repro.core.cache as core_cache
    from swa_repro.core.errors import UsageError
    from swa_repro.sglang import families as fam
    from swa_repro.sglang.audit import family_fix, family_run

    serving_started = threading.Event()

    def cached_cells(kind, parts, cells, compute, valid=None):
        assert serving_started.wait(5), "the ServerArgs child waited for the family child"
        return [{"release": {"sglang": "0.5.23"}, "family": {"family": c["family"], "paths": [1]}} for c in cells], {}

    def serving(overlay, version, names, ck, archs):
        serving_started.set()
        return {n: {"from": "server", "thread": threading.current_thread().name} for n in names}

    monkeypatch.setattr(family_run, "overlay_for", lambda v, fixes, note, doing, transformers: ("/overlay", {}, None))
    monkeypatch.setattr(fam, "check_release_has", lambda v, overlay, names, explicit: names[:2])
    monkeypatch.setattr(family_run, "child_parts", lambda module, overlay: {})
    monkeypatch.setattr(core_cache, "cached_cells", cached_cells)
    monkeypatch.setattr(family_run, "_serving", serving)
    monkeypatch.setattr(family_run, "answer", lambda f, g: {"state": "not affected", "why": []})
    monkeypatch.setattr(family_fix, "remedy", lambda *a: {"fix": None})
    out = family_run.audit_release("0.5.23", "all", ["sm90"], note=lambda s: None)
    fams = out["sm90"]["families"]
    assert [f["family"] for f in fams] == ["gemma2", "gemma3"]
    assert all(f["serving"]["from"] == "server" and f["serving"]["thread"].startswith("swa-repro-beside")
               for f in fams)

    def failing(*a, **k):
        raise UsageError("auditing sglang 0.5.23 failed: the family child's line")

    monkeypatch.setattr(core_cache, "cached_cells", failing)
    monkeypatch.setattr(family_run, "_serving", lambda *a: (_ for _ in ()).throw(UsageError("the server's line")))
    try:
        family_run.audit_release("0.5.23", "all", ["sm90"], note=lambda s: None)
        raise AssertionError("no error")
    except UsageError as e:
        assert "family child" in str(e)


def test_the_tables_companion_runs_beside_the_releases_from_the_start(monkeypatch):
    """``family_table.build``: the companion (0.5.23 with ``--fix all``, one family child) runs on a thread
    of its own while the releases run, also with ``--jobs 1``: in the pool it ran first and alone, and
    one release's row (its column plan, then its children) waited for it (143 s wall, 61 s of it the
    companion's). Each waits here for the other to have started: run one after the other, neither could.
    The table holds both, and the releases still run ``--jobs`` at a time."""
    import threading

    from swa_repro.sglang.audit import family_run, family_table

    both = threading.Barrier(2, timeout=10)
    running, most = [], []

    def fixed_cells(gpus, version, note):
        both.wait()
        return {"sglang": version, "command": "c", "cells": {g: {"gemma2": {"state": "not affected"}} for g in gpus}}

    def audit_release(version, family, gpus, note, archs, transformers):
        if version == "0.5.23":
            both.wait()
        running.append(version)
        most.append(len(running))
        threading.Event().wait(0.05)
        running.remove(version)
        return {g: {"release": {"sglang": version, "error": "e"}, "gpu": g, "families": []} for g in gpus}

    from swa_repro.engine import forkserver

    warmed = []  # the children's one fork server is started first (forkserver.warm), before any audit
    monkeypatch.setattr(forkserver, "warm", lambda env: warmed.append(len(running) + len(most)))
    monkeypatch.setattr(family_table, "fixed_cells", fixed_cells)
    monkeypatch.setattr(family_run, "audit_release", audit_release)
    table = family_table.build(["0.5.22", "0.5.23", "0.5.21"], ["sm90"], jobs=1, note=lambda s: None, fixed="0.5.23")
    assert table["fixed"]["cells"] == {"sm90": {"gemma2": {"state": "not affected"}}}
    assert [r["sglang"] for r in table["rows"]] == ["0.5.22", "0.5.23", "0.5.21"] and max(most) == 1
    assert warmed == [0]
    # with the release's own transformers every child is plain: no fork server is started for none to use
    family_table.build(["0.5.21"], ["sm90"], jobs=1, note=lambda s: None, transformers="release")
    assert warmed == [0]


def test_a_model_file_is_walked_once_for_its_forms_however_many_columns_ask(tmp_path, monkeypatch):
    """``arch_fill.read_forms``: the three readings (a split list, a number indexed per layer, the one value an
    assert takes) come from one walk of the file (``_form_sites``), not three walks per call: the column plan
    asks each model file ~40 times (every column's every round; ~2 CPU-s of 0.5.23's plan). Answers as before."""
    import ast

    from swa_repro.sglang.audit import arch_fill

    f = tmp_path / "m.py"
    f.write_text("def build(config, layer_id):\n    theta = config.rope_theta\n    x = theta[layer_id]\n"
                 "    e = config.moe_layers_enum.split(',')\n    n = getattr(config, 'num_mtp_layers', 1)\n"
                 "    assert n == 1\n")
    walks, real = [], ast.walk
    monkeypatch.setattr(ast, "walk", lambda node: walks.append(type(node).__name__) or real(node))
    values = {"rope_theta": 1e4, "num_hidden_layers": 2, "moe_layers_enum": [1, 2], "num_mtp_layers": 2}
    for _ in range(3):
        got = arch_fill.read_forms(values, [f])
        assert {k: v for k, (v, _) in got.items()} == {"moe_layers_enum": "1,2", "rope_theta": [1e4, 1e4],
                                                        "num_mtp_layers": 1}
    assert arch_fill.read_forms({"rope_theta": 1e4, "num_hidden_layers": 0}, [f]) == {}
    assert walks.count("Module") <= 2, walks  # the parent map's walk and the forms' one
