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
# Then the effective mask of a failing case, and sglang's own attention test kit as a peer suite.
# With `save_traces = True` every run's wrapper calls are saved as traces (~120 MB), so
# `swa-repro replay` can re-issue them on a GPU.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"  # relative: from the repo root
cases = []  # names from swa_repro.sglang.check.MATRIX; empty: all
failing_case = "upstream_no_prefix_6_8_12"  # the one whose masks are drawn
peer = True  # also run sglang's own dense_attention kit (extend cases)
save_traces = False  # True: every wrapper call under <output_dir>/traces/ (~120 MB), for `swa-repro replay`

# %%
from swa_repro.notebook.runner import announce_mode, figure_saver, output_path

output_dir = output_path(output_dir)  # also when the kernel runs in notebooks/ (the lab)
info = announce_mode(mode, output_dir, "04_rerun_checks")

# %%
from pathlib import Path

from swa_repro.notebook import plots
from swa_repro.sglang import check as C
from swa_repro.notebook.checks import Checks

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
