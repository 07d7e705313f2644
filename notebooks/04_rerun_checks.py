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
# # 04 · Rerun the checks through sglang, unpatched and patched
#
# A case matrix through sglang's own `FlashInferAttnBackend` (paged-only route, and the
# deterministic-inference route for one case), each case run with the backend as released
# (0.5.15.post1: plan without `window_left`) and with the upstream fix applied in memory. Every
# output is held to the exact float64 reference on the full sequences. Expectation, from
# geometry alone: unpatched fails exactly the cases where some query's KV (sglang hands each
# request its last `W + extend_len` keys) holds a key outside its window; patched passes all.
# Then the effective mask of a failing case, sglang's own attention test kit as a peer suite, and
# every finding class's check on a chosen release, as shipped and with the chosen fixes.
# With `save_traces = True` every run's wrapper calls are saved as traces (~120 MB), so
# `swa-repro replay` can re-issue them on a GPU.
#
# *Exploring here.* Opened with `make lab`, this file is your copy in `scratch/` (git-ignored), not
# the tracked one in `notebooks/`: a save, and JupyterLab's autosave every two minutes, write that
# copy only, and the next `make lab` keeps your edits. Change the cell tagged `parameters`, then
# *Run All*: this run's figures, checks and parameters go to
# `artifacts/interactive/<notebook>-<hash of the parameters>/`; `artifacts/` itself is `make repro`'s.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"  # relative: from the repo root; a run in the lab writes under <this>/interactive/
cases = []  # names from swa_repro.sglang.check.MATRIX; empty: all
failing_case = "upstream_no_prefix_6_8_12"  # the one whose masks are drawn
peer = True  # also run sglang's own dense_attention kit (extend cases)
save_traces = False  # True: every wrapper call under <output_dir>/traces/ (~120 MB), for `swa-repro replay`
# the section "Rerun every finding's check after the fixes": that release audited as shipped and
# with these `swa-repro patch --fix` fixes (its cached overlay, installed from the package index on first use)
sglang_release = "0.5.23"
fixes = "all"  # all, or a comma list of swa_repro.sglang.fix.ORDER names

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("04_rerun_checks", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver

output_dir = artifact_set("04_rerun_checks", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "04_rerun_checks")

# %%
from pathlib import Path

from swa_repro.notebook import plots
from swa_repro.notebook.checks import Checks
from swa_repro.sglang import check as C

checks = Checks("04_rerun_checks", output_dir)
save = figure_saver(output_dir)
trace_dir = Path(output_dir) / "traces" if save_traces else None

# %% [markdown]
# ## The matrix

# %%
runs = C.run_matrix(info.mode, cases=set(cases), trace_dir=trace_dir, keep=True)
peer_rows = {s: C.peer_suite(info.mode, p) for s, p in (("unpatched", False), ("patched", True))} if peer else None
doc = C.matrix_doc(info, [row for row, _ in runs], peer_rows)
print(C.format_table(doc))

# %%
for row, _ in runs:
    checks.expect(row["as_expected"], f"{row['case']} ({row['route']}, {'patched' if row['patched'] else 'unpatched'}): "
                  f"{'passes' if row['expected_pass'] else 'fails'} as expected",
                  max_abs_err=row["max_abs_err"], why=row["why"])
checks.expect(all(r["passed"] for r, _ in runs if r["patched"]), "patched: every case matches the exact reference")
checks.expect(any(not r["passed"] for r, _ in runs if not r["patched"]), "unpatched: the bug shows in this matrix");

# %% [markdown]
# ## Effective vs intended mask of a failing case
#
# The kernel model of the sliding-window wrapper's run, rebuilt from the recorded `plan` and
# `forward` arguments, on the KV sglang handed it (already trimmed to the last `W + extend_len`
# keys, page size 1). Unpatched first, then patched.

# %%
by_key = {(row["case"], row["route"], row["patched"]): res for row, res in runs}
if (failing_case, "paged", False) in by_key:
    unpatched, patched = by_key[(failing_case, "paged", False)], by_key[(failing_case, "paged", True)]
    plots.publish(plots.harness_figure(unpatched), "04_rerun_checks_unpatched_masks", save)
    plots.publish(plots.harness_figure(patched), "04_rerun_checks_patched_masks", save)
    checks.expect(unpatched.why["max_extra_keys_per_row"] > 0 and not unpatched.passed,
                  f"{failing_case} unpatched: keys outside the window are attended", why=unpatched.why)
    checks.expect(set(patched.model.statuses) == {"exact"} and patched.passed,
                  f"{failing_case} patched: the effective mask is the intended window");

# %% [markdown]
# ## Peer suite: sglang's own attention test kit
#
# `sglang.test.kits.attention_unittest.attention_methods.dense_attention.run_dense_attention_case`,
# unchanged, on its extend cases (its two SWA window-edge cases and the dense ones), through the
# same backend and the same wrapper substitution, with head_dim 128. The kit's own tolerance is
# `atol = rtol = 3e-2` after an output projection.

# %%
if peer_rows:
    for state, rows in peer_rows.items():
        for r in rows:
            if r["passed"] is not None:
                checks.expect(r["passed"] == r["expected_pass"],
                              f"kit {r['case']} ({state}): {'passes' if r['expected_pass'] else 'fails'} as expected",
                              error=r.get("error"))

# %% [markdown]
# ## Rerun every finding's check after the fixes
#
# The matrix above asks one finding class (#31501) of the installed release. The audit asks all
# eight of a release's own code (`swa-repro audit --sglang X`, from its recorded wrapper calls,
# on CPU in either mode, ~25 s a run): here the release `sglang_release` as shipped, then with
# `fixes` applied to a copy of it (`--fix`). Per class: holds / fixed / absent / not driven; per
# path: whether a sliding-window layer's queries attend exactly their window. A release that
# cannot be had (no network, no cached copy) or that the fixes refuse: one line, and it skips.

# %%
from IPython.display import display

from swa_repro.notebook import fix_view as FV

release = FV.load_release(sglang_release, fixes)
audits = FV.audit_pair(release) if release.fixed else None
print(release.skipped or f"sglang {release.version}: audited as shipped and with --fix {','.join(release.names)}")

# %%
classes = FV.class_rows(*audits, release.names) if audits else []
FV.frame(classes) if audits else None

# %% [markdown]
# The same runs, key by key: a cell says how many queries see keys outside their window (and
# the most extra keys one sees), and intended keys no call lets a query see.

# %%
if audits:
    keys = FV.key_rows(*audits)
    display(FV.frame(keys))
    plots.publish(FV.keys_figure(keys, f"sglang {release.version}: sliding-window layer, as shipped and with "
                                       "the fixes"), "04_rerun_checks_fix_keys", save)

# %% [markdown]
# Each chosen fix's class must read fixed (or absent: the release has none of its paths), each
# other class as shipped (a fix edits its own paths only), and every path a chosen window fix is
# about, or that was exact already, must be exact after.

# %%
if audits:
    for r in classes:
        if r.chosen:
            checks.expect(r.after in ("fixed", "absent"), f"{r.finding}: {r.after} with the fixes (was {r.before})",
                          evidence=r.evidence)
    checks.expect(all(r.after == r.before for r in classes if not r.chosen), "every class not chosen reads as shipped",
                  changed=[r.finding for r in classes if not r.chosen and r.after != r.before])
    for k in keys:
        if FV.held_exact(k, release.names):
            checks.expect(k.after_verdict == "exact", f"{k.path}: sliding-window keys {k.after} with the fixes "
                          f"(was {k.before})")
    left = [k.path for k in keys if not FV.held_exact(k, release.names)]
    print(f"not held to exact (their fixes were not chosen): {', '.join(left)}" if left else "")
    checks.expect(audits[1]["release"]["fixes"]["fixes"] == list(release.names),
                  "the second audit ran on the release with exactly the chosen fixes");

# %% [markdown]
# ## Replaying these traces on a GPU
#
# With `save_traces = True` the traces under `traces/` hold every wrapper call sglang made
# (arguments by value; `swa-repro sglang-check --trace-dir DIR` writes the same). On any
# CUDA machine with `torch` and `flashinfer-python==0.6.12` (no sglang needed):
# `swa-repro replay artifacts/traces/*.model.pt` re-issues them on the real kernels and compares
# with the model's recorded outputs and with the exact reference.

# %%
print(f"{len(list(trace_dir.glob('*.pt')))} traces in {trace_dir}" if trace_dir else
      "traces not saved: `swa-repro run 04 --parameters save_traces=True` saves them")
checks.close()
