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
# # 02 · Masks and CTA skips
#
# What each query row actually attends, drawn key by key: the intended window, the effective mask
# (kernel model, and the real kernel where there is evidence), their difference, each CTA's
# `kv_start`, and the tile map (which KV tiles each CTA computes, and with or without the element
# mask). Then every committed GPU recording is held to the kernel model.
#
# Why the leak has this shape: each fa2 CTA handles `CTA_TILE_Q` packed rows (`q*g + h`) and
# starts its KV loop at the window start of its **first** row,
# `kv_start_idx = sub_if_greater_or_zero(kv_len + (qo_tile_idx * CTA_TILE_Q) / group_size, qo_len + window_left)`
# (flashinfer 0.6.12 `include/flashinfer/attention/prefill.cuh:2441-2442`, 0.7.2.post1
# `:3826-3827`). The per-element window test that would cut the later rows back
# (`attention/variants.cuh:88-89`) exists only in the module compiled with
# `use_sliding_window`, which `plan()` picks from `window_left >= 0` (`prefill.py:2035`) — and
# sglang 0.5.15.post1 plans without it (`srt/layers/attention/flashinfer_backend.py:1960-1979`).
#
# Large cases are reduced by blocks for drawing, never averaged: a cell is red if **any** key of
# its block is attended outside the window, blue if any window key is dropped.
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
# The cases are story.SEED_SHAPES, story.GQA_SHAPES and story.LONG_SHAPES; a value set here
# replaces that shape, None keeps it (e.g. window_left = 8, gqa_window_left = 32).
# the seed case
prefix_lens = None
extend_lens = None
window_left = None
num_qo_heads = None
num_kv_heads = None
head_dim = None
page_size = None
# a GQA case with a prefix and several query tiles (32/8 heads, prefix 200, extend 100, window 64)
gqa_num_qo_heads = None
gqa_num_kv_heads = None
gqa_prefix = None
gqa_extend = None
gqa_window_left = None
# a long request, drawn reduced (model only): 32768 tokens, window 4096
long_extend = None
long_window_left = None
plot_recordings = True  # one figure per recorded case not drawn above (newest flashinfer), model and GPU side by side
fuzz_selftest_cases = 4  # 0: none; else a CPU self-test of the fuzz pipeline (labelled: not kernel evidence)

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("02_masks_and_cta_skips", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver

output_dir = artifact_set("02_masks_and_cta_skips", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "02_masks_and_cta_skips")

# %%
import numpy as np

from swa_repro.kernel.model import simulate
from swa_repro.notebook import fuzz_view, mask_blocks, plots, story
from swa_repro.notebook.checks import Checks
from swa_repro.notebook.show import show

checks = Checks("02_masks_and_cta_skips", output_dir)
save = figure_saver(output_dir)
recordings, note = story.load_recordings_or_empty(recordings_dir or None)
print(note)


# %% [markdown]
# ## The seed case
#
# The shapes it runs with are printed first (the parameters cell may change them). With the
# defaults (`story.SEED_SHAPES`) each request fits in one CTA tile (`CTA_TILE_Q`, in the figure's
# title), so its `kv_start` is 0 and every row attends from key 0: with the mask compiled out this
# is plain causal attention.

# %%
seed_bug = story.seed_case(False, prefix_lens=prefix_lens, extend_lens=extend_lens, window_left=window_left,
                           num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                           page_size=page_size)
seed_bug = story.for_machine(seed_bug, info.mode)
print(story.shapes_line(seed_bug))
m_seed, ev_seed = story.show_case(seed_bug, info.mode, recordings, save, "02_masks_and_cta_skips_seed_bug", checks)

# %%
m_seed_fix, ev_seed_fix = story.show_case(story.with_fix(seed_bug, True), info.mode, recordings, save,
                                          "02_masks_and_cta_skips_seed_fix", checks)

# %%
checks.expect(any(r.extra_keys().any() for r in m_seed.requests), "seed planned without window: extra keys attended")
checks.expect(all(r.status == "exact" for r in m_seed_fix.requests), "seed planned with window: every request exact")
for i, r in enumerate(m_seed.requests):
    checks.expect(np.array_equal(r.kv_start, story.kv_start_formula(seed_bug, i, len(r.kv_start), m_seed.plan.cta_tile_q)),
                  f"seed req {i}: per-CTA kv_start equals max(0, kv_len - qo_len + t*CTA_TILE_Q/g - W)")

# %% [markdown]
# ## A GQA case with a prefix and several query tiles
#
# The shapes are printed first; by default (`story.GQA_SHAPES`) 32 query heads over 8 KV heads
# (g = 4), so one CTA tile of `CTA_TILE_Q = 128` packed rows holds 32 queries: `kv_start` steps every
# `CTA_TILE_Q / g` rows and each step leaks up to `CTA_TILE_Q / g - 1` keys (red triangles). Planned
# without the window, such a request may also be split across CTAs with chunks sized for no window:
# the model calls it `undefined` (see notebook 01). The same shapes with `disable_split_kv=True`
# show the pure tile-granular leak.

# %%
gqa_bug = story.gqa_case(False, num_qo_heads=gqa_num_qo_heads, num_kv_heads=gqa_num_kv_heads, prefix=gqa_prefix,
                         extend=gqa_extend, window=gqa_window_left, head_dim=head_dim, page_size=page_size)
gqa_bug = story.for_machine(gqa_bug, info.mode)
print(story.shapes_line(gqa_bug))
m_gqa, ev_gqa = story.show_case(gqa_bug, info.mode, recordings, save, "02_masks_and_cta_skips_gqa_bug", checks)

# %%
gqa_nosplit = gqa_bug.with_(disable_split_kv=True, name=gqa_bug.name.replace("_bug", "_nosplit_bug"))
m_gqa_nosplit, ev_gqa_nosplit = story.show_case(gqa_nosplit, info.mode, recordings, save,
                                                "02_masks_and_cta_skips_gqa_nosplit_bug", checks)

# %%
m_gqa_fix, ev_gqa_fix = story.show_case(story.with_fix(gqa_bug, True), info.mode, recordings, save,
                                        "02_masks_and_cta_skips_gqa_fix", checks)

# %%
r = m_gqa_nosplit.requests[0]
cta = m_gqa_nosplit.plan.cta_tile_q
checks.expect(np.array_equal(r.kv_start, story.kv_start_formula(gqa_nosplit, 0, len(r.kv_start), cta)),
              "GQA: per-CTA kv_start equals the formula", kv_start=r.kv_start)
checks.expect(len(r.kv_start) > 1, "GQA case spans several query tiles", q_tiles=len(r.kv_start))
checks.expect(r.status == "leak" and int(r.extra_keys().max()) == cta // gqa_nosplit.group_size - 1,
              "GQA without split-KV: leak of up to CTA_TILE_Q/g - 1 extra keys", max_extra=int(r.extra_keys().max()))
checks.expect(m_gqa_fix.statuses == ["exact"], "GQA planned with window: exact")
if m_gqa.plan.split_kv:
    checks.expect(m_gqa.statuses == ["undefined"], "GQA with split-KV planned without window: undefined",
                  planned=m_gqa.requests[0].num_chunks_plan, written=m_gqa.requests[0].num_chunks_run)

# %% [markdown]
# ## A long request, reduced without lying
#
# One request of `long_extend` tokens with window `long_window_left`, drawn at most 128 cells per
# axis. Each leaked key still colours its block: below, the row blocks coloured red are checked to
# be exactly the row blocks that contain a row with extra keys.

# %%
long_bug = story.long_case(False, extend=long_extend, window=long_window_left, num_qo_heads=num_qo_heads,
                           num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size)
long_bug = story.for_machine(long_bug, info.mode)
m_long = simulate(long_bug, tiles=True)
n = long_bug.extend_lens[0]
print(f"{long_bug.name}: model only (a {n}x{n} probe is left to `swa-repro record`)")
plots.publish(plots.plot_case(long_bug, m_long), "02_masks_and_cta_skips_long_bug", save)

# %%
r = m_long.requests[0]
d, block = mask_blocks.request_difference(r, long_bug.window_left, plots.PLOT_CELLS)
row_blocks_red = np.isin(d, (2, 4)).any(1)
rows_with_extra = r.extra_keys() > 0
blocks_with_extra = np.zeros(d.shape[0], bool)
np.logical_or.at(blocks_with_extra, np.arange(len(rows_with_extra)) // block[0], rows_with_extra)
checks.expect(np.array_equal(row_blocks_red, blocks_with_extra),
              "reduced difference: red row blocks are exactly those holding a row with extra keys",
              block=block, red=int(row_blocks_red.sum()), expected=int(blocks_with_extra.sum()))
tile_levels = mask_blocks.reduce_tiles(r.tiles, plots.PLOT_CELLS)[0]
checks.expect(set(np.unique(r.tiles).tolist()) == set(np.unique(tile_levels).tolist()),
              "reduced tile map keeps every tile state present", states=np.unique(r.tiles));

# %% [markdown]
# ## The kernel model against every committed GPU recording
#
# For every recording (`recordings/<flashinfer-version>/`, written by `swa-repro record` on a GPU
# with provenance): wherever the model says `exact` or `leak`, the recorded first/last visible key
# of every (row, head) must equal the model's exactly; wherever it says `undefined`, the recording
# must show missing keys, NaN, or run-to-run differences.

# %%
for rec in recordings:
    print(story.provenance_line(rec))
comparison = story.model_vs_recordings(recordings)
show(comparison)

# %%
if not recordings:
    print("NOTE: no GPU recordings are committed yet, so the model-vs-recording check is SKIPPED, not passed. "
          "Run `swa-repro record` on a CUDA machine and commit recordings/.")
for row in comparison:
    checks.expect(row.agree, f"{row.case} req {row.req} (flashinfer {row.flashinfer}): model "
                  f"{row.model} vs recording {row.recording}", evidence=row.evidence)

# %% [markdown]
# ## Random batches: `swa-repro fuzz`
#
# `swa-repro fuzz --mode live` draws random cases (backend, head_dim, GQA group, page size,
# window, split-KV, plan variant, batch) on a GPU, probes each key by key and holds the kernel
# model to it per request and query head; the runs are committed under `recordings/fuzz/<version>/`
# and replayed here through the model. Per flashinfer version: cases and agreement, what the runs
# covered (backends, head dims, plan variants, GPU, date), which pinned versions no run backs yet,
# then the axes covered by all of them.

# %%
fuzz = fuzz_view.fuzz_view(selftest_cases=fuzz_selftest_cases)
fuzz_view.print_view(fuzz)
if fuzz.is_kernel_evidence:
    for row in fuzz_view.totals_rows(fuzz.report):
        checks.expect(row["disagreeing requests"] == 0 and row["failed to probe"] == 0,
                      f"fuzz: flashinfer {row['flashinfer']}: the kernel model agrees with its real kernel",
                      agree=row["agree"], cases=row["cases"])

# %%
if plot_recordings:
    # one figure per recorded case, from the newest flashinfer (the table above holds every version)
    drawn = (ev_seed, ev_seed_fix, ev_gqa, ev_gqa_nosplit, ev_gqa_fix)  # evidence already drawn by its model
    newest = {r.case.name: r for r in recordings if not any(r is d for d in drawn)}
    for rec in newest.values():
        tag = f"rec_{rec.case.flashinfer_version}_{rec.case.name}".replace(".", "_")
        plots.publish(plots.plot_case(rec.case, simulate(rec.case, tiles=True), rec), f"02_masks_and_cta_skips_{tag}",
                      save)

# %%
checks.close()
