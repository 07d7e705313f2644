# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 05 · Beyond this bug: the plan/forward contract audit, real models, the backend matrix
#
# FlashInfer compiles `window_left` and `logits_soft_cap` into the module it picks at `plan()`;
# sglang passes some of them only to `forward()`. The audit drives every path of sglang's
# FlashInfer backend that plans a wrapper (on CPU, with recording stand-ins for the wrappers) and
# lists each parameter whose `forward()` value differs from its plan value. Then: what the
# paged-only bug does to real model configurations, and which FlashInfer backend does what.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"
prompts = [1024, 8192, 32768]
prefixes = [0, 4096]

# %%
from swa_repro.notebook.runner import announce_mode

info = announce_mode(mode, output_dir, "05_backend_matrix_and_audit")

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from swa_repro.sglang import audit, model_configs

from swa_repro.notebook import matrix
from swa_repro.notebook.checks import Checks
from swa_repro.core.case import Case
from swa_repro.notebook.runner import save_figure

checks = Checks("05_backend_matrix_and_audit", output_dir)

# %% [markdown]
# ## 1. The audit of sglang's FlashInfer calls, without and with the fix (PR #31501)

# %%
unpatched = audit.run_audit(patched=False)
patched = audit.run_audit(patched=True)
print("paths driven:", sorted({d["path"] for d in unpatched.driven}))
print("not driven:", unpatched.not_driven or "none")
pd.DataFrame(audit.report_table(unpatched.findings))

# %%
pd.DataFrame(audit.report_table(patched.findings))

# %% [markdown]
# Which public reports hold on the installed sglang, read off the findings above:

# %%
reports = audit.reports([unpatched, patched])
pd.DataFrame([{"report": r["report"], "unpatched": audit.verdict(r["unpatched"]),
               "patched": audit.verdict(r["patched"])} for r in reports])

# %%
paged = [f for f in unpatched.findings if f.path == "extend_paged" and f.parameter == "window_left"]
checks.expect(any(f.effect == "wrong" for f in paged), "unpatched: the audit finds the paged-only window (plan -1, forward W)")
checks.expect(not [f for f in patched.findings if f.path == "extend_paged" and f.parameter == "window_left"],
              "patched: the paged-only wrapper is planned with its window")
checks.expect(all(f.plan_value == -1 and f.forward_value >= 0 for f in paged if f.kind == "mismatch"),
              "every paged-only finding is plan -1 vs forward W")

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
# Leaked keys per query (max) over prompt length × window, sglang's paged-only layout, fa2 on an
# H200 as the kernel model predicts it, 8 query / 4 KV heads of dim 256 (blank: undefined,
# split-KV chunk counts disagree):

# %%
windows = sorted({s.window_left for s in specs if s.has_window})
fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
for ax, prefix in zip(axes, prefixes):
    grid = matrix.leak_grid(windows, prompts, prefix=prefix)
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="magma_r", aspect="auto", vmin=0)
    ax.set(xticks=range(len(prompts)), xticklabels=prompts, yticks=range(len(windows)), yticklabels=windows,
           xlabel="prompt length", ylabel="window_left", title=f"cached prefix {prefix}")
    for (i, j), v in np.ndenumerate(grid):
        ax.text(j, i, "undef." if np.isnan(v) else int(v), ha="center", va="center", color="tab:blue")
    fig.colorbar(im, ax=ax, label="max leaked keys / query")
save_figure(fig, "05_backend_matrix_and_audit_leak_heatmap", output_dir)

# %%
windowed = [c for c in cells if c.status not in ("no window", "not modelled")]
checks.expect(any(c.status in ("leak", "undefined") for c in windowed),
              "some real SWA model leaks or is undefined on the paged-only path without the fix")
checks.expect(all(c.max_leak == 0 for c in windowed if c.prompt + min(c.prefix, c.window_left) <= c.window_left + 1),
              "no leak when every key is inside the window")

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
checks.expect((recorded.model == recorded.recorded).all(), "the model agrees with every recorded cell",
              cells=len(recorded))

# %% [markdown]
# flashinfer #4972 (fa2, non-causal sliding window, qo_len < kv_len, split-KV) on the installed
# flashinfer:

# %%
probe = matrix.probe_4972() if info.mode == "live" else matrix.Probe4972(False, None, "not run: needs CUDA")
print(probe)

# %% [markdown]
# ## 4. What a user of each model should do (from the findings)

# %%
for row in audit.advice(specs, unpatched, patched):
    print(f"{row['model']} (window_left={row['window_left']}, soft cap={row['soft_cap']:g}):")
    for t in row["do"] or ["nothing found"]:
        print("  -", t)

# %%
checks.close()
