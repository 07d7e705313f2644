# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · `plan()` with and without `window_left`
#
# FlashInfer's `BatchPrefillWithPagedKVCacheWrapper` fixes three things at `plan()` time that the
# later `forward()`/`run()` cannot change: the compiled module (with or without the sliding-window
# element mask), the query tile `CTA_TILE_Q`, and whether and how the KV is split across CTAs.
# sglang ≤ 0.5.15.post1 planned without `window_left` and passed the window only to `forward()`.
# Step by step: which module is chosen, what the plan decides, why `forward()` runs but `run()`
# refuses, which rows come out wrong, and how fa2 and fa3 differ.
#
# *Exploring here.* Opened with `make lab`, this file is your copy in `scratch/` (git-ignored), not
# the tracked one in `notebooks/`: a save, and JupyterLab's autosave every two minutes, write that
# copy only, and the next `make lab` keeps your edits. Change the cell tagged `parameters`, then
# *Run All*: this run's figures, checks and parameters go to
# `artifacts/interactive/<notebook>-<hash of the parameters>/`; `artifacts/` itself is `make repro`'s.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"  # relative: from the repo root; a run in the lab writes under <this>/interactive/
recordings_dir = ""  # empty: the committed recordings/ of this repo
# the seed case is story.SEED_SHAPES; a value set here replaces that shape, None keeps it
prefix_lens = None
extend_lens = None
window_left = None
num_qo_heads = None
num_kv_heads = None
head_dim = None
page_size = None
# a case with more queries than one CTA tile, GQA 4 (recorded for fa3/auto as fa3_gqa4_*)
tile_prefix_lens = [64, 0]
tile_extend_lens = [100, 20]
tile_window_left = 8
tile_num_qo_heads = 8
tile_num_kv_heads = 2
# one long request with few queries: the plan without a window splits the KV
split_prefix = 4000
split_extend = 64
split_window_left = 128
seed = 0

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("01_plan_with_and_without_window_left", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver

output_dir = artifact_set("01_plan_with_and_without_window_left", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "01_plan_with_and_without_window_left")

# %%
from swa_repro.kernel.model import simulate
from swa_repro.kernel.probe import RANDOM_ATOL as TOL
from swa_repro.notebook import plots, story, tables
from swa_repro.notebook.checks import Checks
from swa_repro.notebook.show import show

checks = Checks("01_plan_with_and_without_window_left", output_dir)
save = figure_saver(output_dir)
recordings, note = story.load_recordings_or_empty(recordings_dir or None)
print(note)
bug = story.seed_case(False, prefix_lens=prefix_lens, extend_lens=extend_lens, window_left=window_left,
                      num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size)
tiles_bug = bug.with_(name="tiles_bug", prefix_lens=tile_prefix_lens, extend_lens=tile_extend_lens,
                      window_left=tile_window_left, num_qo_heads=tile_num_qo_heads, num_kv_heads=tile_num_kv_heads)
split_bug = bug.with_(name="split_long_bug", prefix_lens=(split_prefix,), extend_lens=(split_extend,),
                      window_left=split_window_left)
bug, tiles_bug, split_bug = (story.for_machine(c, info.mode) for c in (bug, tiles_bug, split_bug))
fix = story.with_fix(bug, True)
cases = [bug, fix, tiles_bug, story.with_fix(tiles_bug, True), split_bug, story.with_fix(split_bug, True)]

# %% [markdown]
# ## 1. The module is chosen at plan time
#
# `plan()` passes `window_left >= 0,  # use_sliding_window` to `get_batch_prefill_module`
# (flashinfer 0.6.12 `prefill.py:2035`, 0.7.2.post1 `:3689`); the module's name carries
# `use_swa_True/False`. sglang 0.5.15.post1 calls `wrapper_paged.begin_forward(...)` with no
# `window_left` (`srt/layers/attention/flashinfer_backend.py:1960-1979`), so it gets
# `use_swa_False`. In live mode the module is read off `wrapper._cached_module`; in model mode it is
# named by flashinfer's own `get_batch_prefill_uri` (flashinfer imports without a GPU).

# %%
modules = tables.module_table(cases, info.mode)
show(modules, max_width=200)

# %%
for row in modules:
    swa, planned = row.effective_use_sliding_window, row.plan_window_left >= 0
    checks.expect(swa == planned, f"{row.case}: module has the window mask iff plan() got window_left",
                  use_sliding_window=swa)
    checks.expect(f"use_swa_{planned}" in row.effective_module, f"{row.case}: module name says use_swa_{planned}",
                  module=row.effective_module)

# %% [markdown]
# ## 2. What else the plan fixes: CTA_TILE_Q and split-KV
#
# `CTA_TILE_Q` comes from the average packed query length (`FA2DetermineCtaTileQ`,
# `include/flashinfer/utils.cuh:384`); `wrapper._plan_info[3]` holds it, `[14]` says split-KV.
# Planned without a window, the split-KV search (`scheduler.cuh:101`) sizes KV chunks for the
# *whole* KV; at run time the kernel counts chunks from the *run's* window
# (`prefill.cuh:2727-2728`, 0.7.2.post1 `:4293-4294`). When the two counts differ the merge reads
# partial outputs that were never written: the model calls that `undefined`.

# %%
show(tables.plan_table(cases))
if info.mode == "live":
    show(modules, cols=["case", "module (live)", "use_sliding_window (live)", "cta_tile_q (live)", "split_kv (live)"])

# %%
m_split = simulate(split_bug)
checks.expect(m_split.plan.split_kv and m_split.requests[0].num_chunks_plan != m_split.requests[0].num_chunks_run,
              "one long request planned without window: split-KV with planned != written chunk count",
              planned=m_split.requests[0].num_chunks_plan, written=m_split.requests[0].num_chunks_run)
checks.expect(m_split.statuses == ["undefined"], "model calls that request undefined", status=m_split.statuses)
checks.expect(simulate(story.with_fix(split_bug, True)).statuses == ["exact"], "planned with the window it is exact")
if info.mode == "live":
    for row in modules:
        checks.expect((row.live_cta_tile_q, row.live_split_kv) == (row.cta_tile_q, row.split_kv),
                      f"{row.case}: model's CTA_TILE_Q / split_kv equal the real plan_info",
                      live=(row.live_cta_tile_q, row.live_split_kv), model=(row.cta_tile_q, row.split_kv))

# %% [markdown]
# ## 3. `forward()` runs, `run()` refuses
#
# The deprecated `forward(window_left=W)` overwrites `self._window_left` (`prefill.py:2136`) and
# then calls `run()`, whose `assert window_left == self._window_left` (`prefill.py:2317`) therefore
# passes — with the module planned without the mask. Calling `run(window_left=W)` directly after
# the same plan trips that assert. In live mode these are the real wrapper's calls; in model mode
# `ModelPagedPrefillWrapper` (same contract, kernel replaced by the model).

# %%
calls = tables.forward_vs_run(bug, info.mode, seed) + tables.forward_vs_run(fix, info.mode, seed)
show(calls, max_width=110)

# %%
fwd_bug, run_bug, fwd_fix, run_fix = calls
checks.expect(fwd_bug.returned, "plan without window + forward(window_left=W) returns (silently)")
checks.expect(run_bug.asserted, "plan without window + run(window_left=W) raises AssertionError",
              outcome=run_bug.error)
checks.expect(fwd_fix.returned and run_fix.returned, "plan with window: forward() and run() both return");

# %% [markdown]
# ## 4. Which rows come out wrong
#
# Per query row, the largest |output − float64 reference| over heads and dims (bf16 inputs,
# random data, tolerance 3e-2), next to the number of keys outside the window the model says the
# row attends. Without the window at plan time the rows that see extra keys are wrong; planned with
# it, none is. (In model mode, committed GPU errors of the same case are shown alongside.)

# %%
err_bug = tables.row_error_table(bug, info.mode, seed, recordings)
err_fix = tables.row_error_table(fix, info.mode, seed, recordings)
show(err_bug)

# %%
wrong = [r for r in err_bug if not r.err <= TOL]
checks.expect(len(wrong) > 0, "planned without window_left, some rows are wrong", wrong_rows=len(wrong))
checks.expect(all(r.extra_keys > 0 for r in wrong), "every wrong row is a row the model says attends extra keys",
              rows=[(r.req, r.row) for r in wrong if r.extra_keys == 0])
checks.expect(all(r.err <= TOL for r in err_fix), "planned with window_left, every row matches the reference",
              max_err=max(r.err for r in err_fix))
for version in err_bug[0].gpu_err:
    differ = [(r.req, r.row) for r in err_bug + err_fix if (r.gpu_err[version] > TOL) != (r.err > TOL)]
    checks.expect(not differ, f"err (GPU, fi {version}): the recorded real kernel is wrong on exactly the same rows",
                  rows=differ)

# %%
fig = plots.plot_case(bug, simulate(bug, tiles=True), requests=[bug.batch_size - 1],
                      title=f"{bug.name}: the longest request, planned without window_left")
plots.publish(fig, "01_plan_with_and_without_window_left_seed_longest", save)

# %% [markdown]
# ## 5. fa2 vs fa3
#
# fa2 leaks at CTA granularity: a row sees back to its CTA's `kv_start`
# (`prefill.cuh:2441-2442`), so with few queries (the seed) it is exactly plain causal attention,
# and with many queries each tile of `CTA_TILE_Q/g` rows leaks up to that many keys. fa3 (sm90)
# masks per element only through the compiled module, so without the window module it is plain
# causal everywhere. `auto` resolves to fa3 on sm90. sglang constructs the wrapper with
# `backend="fa2"` (`flashinfer_backend.py:309`).

# %%
bt_seed = tables.backend_table(bug, info.mode, seed=seed, recordings=recordings)
bt_tiles = tables.backend_table(tiles_bug, info.mode, seed=seed, recordings=recordings)
show(bt_seed + bt_tiles, max_width=90)

# %%
by = {r.case: r for r in bt_seed + bt_tiles}
checks.expect(by["seed_fa2_bug"].plain_causal, "seed, fa2 without window: few queries, equals plain causal")
checks.expect(not by["tiles_fa2_bug"].plain_causal and by["tiles_fa3_bug"].plain_causal,
              "many queries: fa2 leaks per CTA tile, fa3 ignores the window entirely",
              fa2_extra=by["tiles_fa2_bug"].max_extra_keys, fa3_extra=by["tiles_fa3_bug"].max_extra_keys)
checks.expect(all(set(by[f"{s}_{b}_fix"].status) == {"exact"} for s in ("seed", "tiles") for b in ("fa2", "fa3", "auto")),
              "every backend planned with the window is exact")
for name, r in by.items():
    if r.unavailable:
        print(f"NOTE: {name}: {r.unavailable} (check skipped)")
    elif name.endswith("_fix"):
        checks.expect(sum(r.wrong_rows) == 0, f"{name}: no wrong row", wrong=r.wrong_rows)
    else:
        checks.expect(sum(r.wrong_rows) > 0, f"{name}: rows wrong without the window", wrong=r.wrong_rows)
    if r.recorded:
        checks.expect(all(st == r.status for st in r.recorded.values()),
                      f"{name}: recorded status equals the model's", recorded=r.recorded, model=r.status)

# %%
checks.close()
