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
# # 00 · The bug on one page
#
# **sglang ≤ 0.5.15.post1 plans FlashInfer's sliding-window *paged* prefill without
# `window_left`, so the per-element window mask is compiled out and queries attend to keys
# outside their window.** This notebook shows the effective mask of the seed case and computes
# the verdict on *this* machine: on a CUDA GPU with flashinfer it runs the real kernel; elsewhere
# it runs the CPU kernel model and holds it to the committed GPU recordings. The first output
# below says which.
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
# the seed case is story.SEED_SHAPES (three fresh requests of 6/8/12 tokens, window 4, 4/4 heads,
# page 16); a value set here replaces that shape, None keeps it (e.g. window_left = 8)
prefix_lens = None
extend_lens = None
window_left = None
num_qo_heads = None
num_kv_heads = None
head_dim = None
page_size = None
backend = "fa2"  # what sglang constructs the wrapper with
seed = 0

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("00_overview", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver

output_dir = artifact_set("00_overview", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "00_overview")

# %%
from swa_repro.kernel.model import simulate
from swa_repro.notebook import plots, story
from swa_repro.notebook.checks import Checks
from swa_repro.notebook.show import show

checks = Checks("00_overview", output_dir)
save = figure_saver(output_dir)
recordings, note = story.load_recordings_or_empty(recordings_dir or None)
print(note)

# %% [markdown]
# ## Where it comes from (sources as installed)
#
# | step | source |
# |---|---|
# | sglang builds the paged prefill wrapper with `backend="fa2"` | sglang 0.5.15.post1 `srt/layers/attention/flashinfer_backend.py:309`, `:450-455` |
# | the paged-only prefill branch trims each request's KV to the last `W + extend_len` keys | `flashinfer_backend.py:1697-1704` (`FlashInferIndicesUpdaterPrefill.update_sliding_window`, `:1653`) |
# | …and plans it **without** `window_left` (page size 1) | `flashinfer_backend.py:1960-1979` (`call_begin_forward`, `:1822`) |
# | the window is passed only to the deprecated `forward(window_left=layer.sliding_window_size)` | `flashinfer_backend.py:1138-1150` |
# | `plan()` picks the compiled module from `window_left >= 0  # use_sliding_window` | flashinfer 0.6.12 `prefill.py:2035` (0.7.2.post1: `:3689`) |
# | `forward()` overwrites `self._window_left`, so `run()`'s `assert window_left == self._window_left` passes | `prefill.py:2136`, `:2317` (0.7.2.post1: `:3969`, `:4313`) |
# | each CTA starts its KV loop at the window start of its *first* query row | `include/flashinfer/attention/prefill.cuh:2441-2442` (0.7.2.post1: `:3826-3827`) |
#
# With the element mask compiled out, every query row of a CTA attends from that CTA's
# `kv_start = max(0, kv_len - qo_len + floor(t*CTA_TILE_Q/g) - W)` up to its causal limit.
# sglang PR #31501 (released in 0.5.16) passes `window_left` at plan time.

# %%
bug = story.seed_case(fix=False, prefix_lens=prefix_lens, extend_lens=extend_lens, window_left=window_left,
                      num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                      page_size=page_size, backend=backend)
bug = story.for_machine(bug, info.mode)  # live: this GPU's SM count, arch and flashinfer version
fix = story.with_fix(bug, True)
show([{"case": c.name, **simulate(c).summary()} for c in (bug, fix)])

# %% [markdown]
# ## The effective mask, planned the sglang way
#
# Intended window, the model's effective mask (orange: each CTA's `kv_start`), the real kernel's
# (live probe or recording, when there is one), their difference from the intended mask (red:
# extra keys attended, blue: window keys dropped) and the CTA tile map.

# %%
evidence, why = story.evidence_for(bug, info.mode, recordings)
print(why)
fig = plots.plot_case(bug, story.model_for(bug, evidence), evidence)
plots.publish(fig, "00_overview_seed_bug", save)

# %% [markdown]
# The same shapes planned **with** `window_left` (the fix):

# %%
evidence_fix, why_fix = story.evidence_for(fix, info.mode, recordings)
print(why_fix)
fig = plots.plot_case(fix, story.model_for(fix, evidence_fix), evidence_fix)
plots.publish(fig, "00_overview_seed_fix", save)

# %% [markdown]
# ## Verdict on this machine
#
# Live: the real kernel, planned both ways, `forward(window_left=W)`, every row held to a float64
# reference. Model: the kernel model's statuses, checked against every committed GPU recording of
# these shapes.

# %%
v = story.verdict(info, bug, recordings, seed=seed)
print(v.sentence)
for line in v.evidence:
    print("  evidence:", line)

# %%
checks.expect(v.bug_present_without_window, "bug present when plan() gets no window_left", detail=v.without_window)
checks.expect(v.fixed_with_window, "no wrong row when plan() gets window_left", detail=v.with_window)
for side in (v.without_window, v.with_window):
    if side.recordings_agree is None and info.mode == "model":
        print(f"NOTE: no GPU recording of {side.case}: model-vs-kernel check skipped (not passed)")
    elif side.recordings_agree is not None:
        checks.expect(side.recordings_agree, f"kernel model equals the GPU recording(s) of {side.case}",
                      flashinfer=side.recordings)
if evidence is not None and info.mode == "live":
    rows = story.compare_model_to_recording(evidence, simulate(bug))
    checks.expect(all(r.agree for r in rows), "kernel model equals the live probe of the seed case", rows=rows)
checks.close()
