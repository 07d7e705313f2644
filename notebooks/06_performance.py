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
# # 06 · What the fix costs and saves
#
# sglang ≤ 0.5.15.post1 plans FlashInfer's paged prefill **without** `window_left` and passes the
# window only to `forward()`. Notebooks 01–05 show that this is wrong; this one asks what it costs:
#
# * **fa3** compiles the module without the window, so it computes the **whole causal triangle**:
#   a 32k-token request with a 1k window does ~16x the work it needs.
# * **fa2** starts each CTA's KV loop at the window start of its first row: little extra work,
#   but wrong results (and split-KV trouble).
# * **the fix** (`plan(window_left=W)`, sglang PR #31501): how close to the H200's limit, and how it
#   compares with FlexAttention and SDPA with an explicit mask.
#
# The numbers come from `benchmarks/h200_swa_prefill.py`, run on an H200 with CUDA events,
# warm-up, medians and rotated random inputs, and committed with provenance; useful FLOPs count only
# the in-window (query, key) pairs. In **model** mode this notebook plots the committed results;
# in **live** mode it also re-measures a small subset on this GPU.
#
# *Exploring here.* Opened with `make lab`, this file is your copy in `scratch/` (git-ignored), not
# the tracked one in `notebooks/`: a save, and JupyterLab's autosave every two minutes, write that
# copy only, and the next `make lab` keeps your edits. Change the cell tagged `parameters`, then
# *Run All*: this run's figures, checks and parameters go to
# `artifacts/interactive/<notebook>-<hash of the parameters>/`; `artifacts/` itself is `make repro`'s.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"  # relative: from the repo root; a run in the lab writes under <this>/interactive/
live_seq_len = 8192  # live mode: one request of this many tokens
live_windows = [128, 1024]
live_backends = "fa2"  # fa3 modules take ~100 s each to build
live_budget_s = 300
gpu_results = ""  # default: the committed benchmarks/results/h200_swa_prefill.json
cpu_results = ""  # default: the committed benchmarks/results/cpu_model.json

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("06_performance", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver

output_dir = artifact_set("06_performance", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "06_performance")

# %%
import sys
from pathlib import Path

import swa_repro
from IPython.display import Markdown, display
from swa_repro.notebook import plots
from swa_repro.notebook.checks import Checks

# benchmarks/ sits beside the library in the repository
REPO = next(c for c in (Path(swa_repro.__file__).resolve().parents[1], Path.cwd().parent, Path.cwd())
            if (c / "benchmarks" / "report.py").exists())
sys.path.insert(0, str(REPO))
from benchmarks import common, cpu_model, figures, report  # noqa: E402

checks = Checks("06_performance", output_dir)
save = figure_saver(output_dir)
gpu_path = Path(gpu_results) if gpu_results else common.GPU_RESULTS
cpu_path = Path(cpu_results) if cpu_results else common.CPU_RESULTS
gpu, cpu = common.load_json(gpu_path), common.load_json(cpu_path)
for name, doc, path in (("GPU study", gpu, gpu_path), ("CPU benchmark", cpu, cpu_path)):
    if doc is None:
        print(f"{name}: NOT MEASURED YET — {path} is missing; only what exists is plotted.")
    else:
        p = doc["provenance"]
        print(f"{name}: {p.get('gpu') or p.get('cpu')}, {p.get('date')}  ({path})")

# %% [markdown]
# ## The targets, as measured
#
# The same table `benchmarks/REPORT.md` carries (rendered by `benchmarks/report.py`).

# %%
display(Markdown("\n".join(report.render_targets(gpu, cpu))))

# %% [markdown]
# ## The results files are well-formed, and every useful-FLOP count follows from its shape
#
# Useful FLOPs = batch × query heads × (in-window causal pairs) × 4·d. The pair count has a closed
# form (`benchmarks.common.window_pairs`), tested against the brute-force mask in
# `tests/test_benchmarks.py`; here it is recomputed for every committed record.

# %%
if gpu is not None:
    problems = common.validate_gpu_results(gpu)
    checks.expect(not problems, "GPU results file is well-formed", problems=problems[:5])
    timed = common.timed_records(gpu["records"])
    checks.expect(not common.flops_mismatches(timed), "useful FLOPs recomputed from each record's shape match the file",
                  n=len(timed))
    checks.expect(not common.rate_mismatches(timed), "useful TFLOP/s = useful FLOPs / time for every record",
                  n=len(timed))
    print(f"{len(timed)} timed records, {len(gpu['records']) - len(timed)} not measured; status: {gpu['status']}")
if cpu is not None:
    checks.expect(not common.validate_cpu_results(cpu), "CPU results file is well-formed")

# %% [markdown]
# ## Time against the window
#
# One request (batch 1) and a batch, 8:1 GQA. The fix (solid) should fall with the window;
# fa3 planned without it (dashed) should stay at plain causal (grey line) whatever the window.

# %%
fig = figures.time_vs_window(gpu["records"], f"committed: {gpu['provenance'].get('gpu')} (grey: plain causal)") \
    if gpu is not None else None
if fig is not None:
    plots.publish(fig, "06_performance_time_vs_window", save)
else:
    print("No GPU timings committed yet: nothing to plot here. The lead runs "
          f"`{report.GPU_COMMAND}` on the H200.")

# %% [markdown]
# ## What the bug costs, and the fix against the limit
#
# For each backend: buggy / fixed time, next to the ratio of pairs each computes. fa3 without the
# window is expected to do `causal pairs / window pairs` times the work.

# %%
if gpu is not None:
    display(Markdown("\n".join(report.cost_tables(gpu["records"]))))
    pairs = report.fa3_fixed_vs_buggy(gpu["records"])
    if pairs:
        checks.expect(all(a < b for a, b in pairs),
                      "fa3: the fix is faster than planning without the window wherever W <= L/8",
                      n=len(pairs), worst=max(a / b for a, b in pairs))
    fixed_err = common.fixed_rel_errs(gpu["records"])
    if fixed_err:
        checks.expect(max(fixed_err) < 1e-2, "every fixed kernel matches the windowed float32 reference (< 1e-2)",
                      worst=max(fixed_err))
    fa3_bug = common.fa3_buggy_windowed(gpu["records"])
    if fa3_bug:
        checks.expect(all(r.get("rel_err") is None or r["rel_err"] > 1e-2 for r in fa3_bug),
                      "fa3 planned without the window misses the windowed reference (the bug, seen in timing runs)",
                      n=len(fa3_bug))
    fig = figures.peak_fraction(gpu["records"])
    if fig is not None:
        plots.publish(fig, "06_performance_peak_fraction", save)

# %% [markdown]
# ## The kernel model on the CPU
#
# `swa_repro.kernel.model.simulate` on one 32k-token request: committed timings, and one more
# measurement on this machine now (target ≤ 1 s).

# %%
name, case, tiles = cpu_model.model_cases()[0]
res, now = cpu_model.time_simulate(case, tiles, repeats=3)
print(f"{name}: {now['median_s']:.3f} s on this machine now (median of 3); status {res.statuses}")
checks.expect(res.statuses == ["leak"], "the 32k fa2 case planned without the window is modelled as a leak",
              status=res.statuses)
if cpu is not None:
    plots.publish(figures.kernel_model_times(cpu), "06_performance_kernel_model", save)

# %% [markdown]
# ## Live: re-measure a small subset on this GPU
#
# Only in live mode: the same script, restricted to one request of `live_seq_len` tokens, GQA 8:1,
# `live_backends`, written to `output_dir` (never over the committed file).

# %%
if info.mode == "live":
    from benchmarks import h200_swa_prefill as study  # noqa: E402

    live_path = Path(output_dir) / "06_performance_live.json"
    rc = study.main(["--backends", live_backends, "--seq-lens", str(live_seq_len), "--batch", "1",
                     "--windows", ",".join(map(str, live_windows)), "--gqa", "32:4", "--no-probe",
                     "--budget-s", str(live_budget_s), "--out", str(live_path)])
    live = common.load_json(live_path)
    checks.expect(rc == 0 and not common.validate_gpu_results(live), "live re-measurement wrote well-formed results",
                  problems=common.validate_gpu_results(live)[:5] if live else ["no file"])
    fixed_live = [r for r in live["records"] if r["variant"] == "fixed" and r.get("rel_err") is not None]
    checks.expect(fixed_live and max(r["rel_err"] for r in fixed_live) < 1e-2,
                  "live: the fix matches the windowed reference", n=len(fixed_live))
    fig = figures.time_vs_window(live["records"], f"live: {live['provenance'].get('gpu')}")
    if fig is not None:
        plots.publish(fig, "06_performance_live", save)
    else:
        print("live: no measurements without errors to plot")
else:
    print(f"Mode {info.mode}: no GPU re-measurement; the plots above are the committed H200 results.")

# %%
checks.close()
