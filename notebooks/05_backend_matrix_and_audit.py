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
# # 05 · Beyond this bug: the plan/forward contract audit, real models, the backend matrix
#
# Is the release you run affected? The release table below answers it for every sglang release from
# 0.5.10 on, each cell read off that release's own recorded calls (`swa-repro audit --release-table`);
# then the same question for the release on this machine, with what each finding does and what to do.
#
# FlashInfer compiles `window_left` and `logits_soft_cap` into the module it picks at `plan()`;
# sglang passes some of them only to `forward()`. The audit drives every path of sglang's
# FlashInfer backend that plans a wrapper (on CPU, with recording stand-ins for the wrappers) and
# lists each parameter whose `forward()` value differs from its plan value. Then: what the
# paged-only bug does to real model configurations, and which FlashInfer backend does what.
#
# *Exploring here.* Opened with `make lab`, this file is your copy in `scratch/` (git-ignored), not
# the tracked one in `notebooks/`: a save, and JupyterLab's autosave every two minutes, write that
# copy only, and the next `make lab` keeps your edits. Change the cell tagged `parameters`, then
# *Run All*: this run's figures, checks and parameters go to
# `artifacts/interactive/<notebook>-<hash of the parameters>/`; `artifacts/` itself is `make repro`'s.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"  # relative: from the repo root; a run in the lab writes under <this>/interactive/
prompts = [1024, 8192, 32768]
prefixes = [0, 4096]

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("05_backend_matrix_and_audit", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver

output_dir = artifact_set("05_backend_matrix_and_audit", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "05_backend_matrix_and_audit")

# %%
import pandas as pd

from swa_repro.core.case import Case
from swa_repro.notebook import matrix, plots, release_answer
from swa_repro.notebook.checks import Checks
from swa_repro.sglang import model_configs
from swa_repro.sglang.audit import core as audit
from swa_repro.sglang.audit import reports as ar
from swa_repro.sglang.audit import table as audit_table
from swa_repro.sglang.audit.reports import advice, report_table, verdict

checks = Checks("05_backend_matrix_and_audit", output_dir)
save = figure_saver(output_dir)

# %% [markdown]
# ## 0. Which release has which finding (the committed release table)
#
# holds: the layer's window or soft cap reaches `forward()` but not `plan()`, with a visible effect;
# fixed: it reaches `plan()`; absent: the release has no such path; not driven: with why
# (`docs/audit/releases.md` has the recorded call behind every cell).

# %%
table = audit_table.committed()
pd.DataFrame(release_answer.table_frame_rows(table))

# %% [markdown]
# The release on this machine, audited as it is installed (no in-process patch):

# %%
as_installed = audit.run_audit(mode=info.mode)  # live: every driven call also runs on real FlashInfer
print(audit.header(as_installed.release, None))
print(f"mode {as_installed.mode}, sglang's tensors on {as_installed.device}")
answer = release_answer.answer(as_installed.to_dict(), table)
print(release_answer.render(answer))

# %%
row = audit_table.committed_row(as_installed.release["sglang"])
checks.expect(not audit.incomplete(as_installed.to_dict()),
              "the audit drove every path x layer run this release has (no verdict from an undriven path)",
              not_driven=audit.incomplete(as_installed.to_dict()))
checks.expect(row is not None and audit_table.cells(as_installed.to_dict()) == row["cells"],
              "this machine's audit re-derives its release's row of the committed table");
# %% [markdown]
# The verdict about keys, not parameters: for every driven call, the token positions each query
# really attends (the call's KV mapped back through sglang's req-to-token pool) against the keys
# its layer intends; in live mode also the measured error of the real kernel's output against the
# float64 reference over the intended keys (with and without the layer's soft cap).
# %%
keys_table = pd.DataFrame(audit.key_table(as_installed.to_dict()))
keys_table
# %%
checks.expect(set(keys_table[keys_table.path == "extend_paged"].query("layer.str.startswith('swa')").verdict)
              == ({"extra"} if as_installed.release["state"] == "unfixed" else {"exact"}),
              "paged-only SWA layers: queries see keys outside their window exactly when the backend is unfixed")
if as_installed.mode == "live":
    ran = keys_table.dropna(subset=["live_rows"])
    checks.expect(len(ran) > 0 and bool(((ran.live_wrong_rows > 0) == (ran.predicted_wrong_rows > 0)).all()),
                  "live: the real kernel's output is wrong in exactly the runs the key-level verdict predicts",
                  runs=len(ran))

# %% [markdown]
# ## 1. The audit of sglang's FlashInfer calls, as installed and with the fix (PR #31501) as a what-if

# %%
patched = audit.run_audit("patched")  # WHAT-IF: the fix swapped in in-process
print("paths driven:", sorted({d["path"] for d in as_installed.driven}))
print("not driven:", as_installed.not_driven or "none")
pd.DataFrame(report_table(as_installed.findings))

# %%
pd.DataFrame(report_table(patched.findings))

# %% [markdown]
# Which public reports hold on the installed sglang, read off the findings above:

# %%
reports = ar.reports([as_installed, patched])
pd.DataFrame([{"report": r["report"], "as installed": verdict(r["as installed"]),
               "what-if patched": verdict(r["patched"])} for r in reports])

# %%
paged = [f for f in as_installed.findings if f.path == "extend_paged" and f.parameter == "window_left"]
checks.expect(any(f.effect == "wrong" for f in paged) == (as_installed.release["state"] == "unfixed"),
              "as installed: the audit finds the paged-only window exactly when the backend is unfixed")
checks.expect(not [f for f in patched.findings if f.path == "extend_paged" and f.parameter == "window_left"],
              "patched: the paged-only wrapper is planned with its window")
checks.expect(all(f.plan_value == -1 and f.forward_value >= 0 for f in paged if f.kind == "mismatch"),
              "every paged-only finding is plan -1 vs forward W");

# %% [markdown]
# ## 2. Real model configurations (transformers' published defaults, sglang's conversion)

# %%
specs = model_configs.model_specs()
print(model_configs.absent_models())
pd.DataFrame(model_configs.table(specs))

# %%
cells = matrix.model_matrix(specs, prompts, prefixes)
pd.DataFrame([c.to_dict() for c in cells])

# %% [markdown]
# How many of a request's queries attend keys outside their window, per model (its own heads,
# head_dim and window) and prompt length, from the table above: sglang's paged-only layout,
# fa2 planned without the window on an H200, as the kernel model predicts it. A query at most
# `window_left` tokens into the sequence cannot leak (0); beyond it every query but the first
# row of each CTA tile does, by up to `max_leak` keys (the table's column). Hatched: undefined
# (split-KV planned for no window, the output is no masked softmax at all).

# %%
plots.publish(plots.leak_heatmaps(cells, prompts, prefixes), "05_backend_matrix_and_audit_leak_heatmap", save)

# %%
windowed = [c for c in cells if c.status not in ("no window", "not modelled")]
checks.expect(any(c.status in ("leak", "undefined") for c in windowed),
              "some real SWA model leaks or is undefined on the paged-only path without the fix")
checks.expect(all(c.max_leak == 0 for c in windowed if c.prompt + min(c.prefix, c.window_left) <= c.window_left + 1),
              "no leak when every key is inside the window")
checks.expect(all((c.leak_frac > 0) == (c.max_leak > 0) for c in windowed if c.leak_frac is not None),
              "heatmap: a cell's fraction of leaking queries is > 0 iff some query leaks");

# %% [markdown]
# ## 3. The backend matrix (model), with the GPU recordings beside it where one exists

# %%
recordings, note = matrix.load_recordings_or_empty()
print(note)
base = Case(prefix_lens=(0,), extend_lens=(300,), window_left=64, num_qo_heads=4, num_kv_heads=4, head_dim=128,
            page_size=16)
bm = pd.DataFrame(matrix.backend_matrix(base, recordings))
bm

# %%
checks.expect(set(bm[bm.resolved == "fa3"].model) == {"leak"}, "fa3 / auto on sm90 without the window: plain causal (leak)")
recorded = bm.dropna(subset=["recorded"])
if len(recorded):
    checks.expect((recorded.model == recorded.recorded).all(), "the model agrees with every recorded cell",
                  cells=len(recorded))
else:  # a check over no cell would pass whatever the model said: say so instead of counting it
    print(f"no committed recording has this exact case ({len(recordings)} recordings): nothing to compare here; "
          "tests/test_recordings.py holds the model to every recording")

# %% [markdown]
# flashinfer #4972 (fa2, non-causal sliding window, qo_len < kv_len, split-KV) on the installed
# flashinfer:

# %%
probe = matrix.probe_4972() if info.mode == "live" else matrix.Probe4972(False, None, "not run: needs CUDA")
print(probe)

# %% [markdown]
# ## 4. What a user of each model should do (from the findings)

# %%
for row in advice(specs, as_installed, patched):
    print(f"{row['model']} (window_left={row['window_left']}, soft cap={row['soft_cap']:g}):")
    for t in row["do"] or ["nothing found"]:
        print("  -", t)

# %%
checks.close()
