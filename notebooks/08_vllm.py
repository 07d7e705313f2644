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
# # 08 · vLLM: does its FlashInfer backend attend with the window and cap my model's layers ask for?
#
# The same question this project answers for sglang, for vLLM releases 0.20.0 to 0.34.0 (issue #27).
# `swa-repro audit --vllm X --model FAMILY --gpu G` drives release X's own FlashInfer backend on CPU
# (its metadata builder and `FlashInferImpl`, FlashInfer replaced by recording stand-ins) and
# compares what each kernel is told with what the layer asks for; the table below is the committed
# `docs/audit/vllm-releases.json` (`swa-repro audit --release-table --vllm table`), read here, not
# re-derived: each release's wheel is large, and one release's audit takes about half a minute.
#
# *Exploring here.* Opened with `make lab`, this file is your copy in `scratch/` (git-ignored), not
# the tracked one in `notebooks/`: a save, and JupyterLab's autosave every two minutes, write that
# copy only, and the next `make lab` keeps your edits. Change the cell tagged `parameters`, then
# *Run All*: this run's figures, checks and parameters go to
# `artifacts/interactive/<notebook>-<hash of the parameters>/`; `artifacts/` itself is `make repro`'s.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"  # relative: from the repo root; a run in the lab writes under <this>/interactive/

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("08_vllm", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver

output_dir = artifact_set("08_vllm", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "08_vllm")

# %%
from swa_repro.notebook import plots, vllm_page
from swa_repro.notebook.checks import Checks

checks = Checks("08_vllm", output_dir)
save = figure_saver(output_dir)
t = vllm_page.load()
df = vllm_page.cells(t)
print(t["provenance"]["command"], "|", t["provenance"]["date"], "| swa-repro", t["provenance"]["swa_repro_commit"])

# %% [markdown]
# ## 1. The table, per GPU class
#
# **affected**: a kernel that runs is told another window, cap, scale or sinks than the layer asks
# ("cap dropped by X": vLLM calls kernel X directly, without the soft cap); *layer != HF*: the
# kernels get what the layer asks, but the layer asks for another window than transformers' mask;
# *refused*: the release will not serve the family with FlashInfer on that GPU class. Where
# FlashInfer is not the default backend (column `default_backend`), a cell applies with
# `--attention-config.backend FLASHINFER`.

# %%
df.drop_duplicates(["vllm", "gpu"]).pivot(index="vllm", columns="gpu", values="default_backend")

# %%
vllm_page.grid(df, "sm100")

# %%
vllm_page.grid(df, "sm90")

# %%
vllm_page.grid(df, "sm80")

# %% [markdown]
# ## 2. One picture: every release, GPU class and family

# %%
plots.publish(vllm_page.heatmap(df, "vLLM's FlashInfer backend, as shipped"), "08_vllm_states", save)

# %% [markdown]
# ## 3. With the opt-in fix (`--fix cap-route`)
#
# Soft-capped layers stay on the planned wrappers, which take the cap
# (`swa-repro audit --vllm X --fix cap-route --diff` prints the edit); the same audit, every release.

# %%
fixed = vllm_page.cells(vllm_page.load(fixed=True))
fixed[fixed.family == "gemma2"].pivot(index="vllm", columns="gpu", values="cell")

# %%
sm100 = df[(df.gpu == "sm100") & (df.family == "gemma2")]
checks.expect(set(sm100.state) == {"affected"} and sm100.cell.str.contains("cap dropped").all(),
              "gemma2 on sm100 (FlashInfer by default): the soft cap is dropped in every release")
checks.expect(set(df[df.gpu == "sm100"].default_backend) == {"FLASHINFER"}
              and set(df[df.gpu != "sm100"].default_backend) == {"FLASH_ATTN"},
              "FlashInfer is sm100's default backend, FlashAttention sm90's and sm80's, in every release")
checks.expect(not fixed.cell.str.contains("cap dropped").any(), "with --fix cap-route no cap is dropped")
both = df.merge(fixed, on=["vllm", "gpu", "family"], suffixes=("", "_fixed"))
checks.expect((both[both.state != "affected"].state == both[both.state != "affected"].state_fixed).all(),
              "the fix changes only cells that were affected");

# %% [markdown]
# ## 4. Other serving options: a quantized KV cache, a larger block
#
# The same audit with `--kv-cache-dtype fp8` and `nvfp4` (the layer's impl, KV-cache spec and
# builder made for that cache, after the release's own `validate_configuration`), and with
# `--block-size 128` at the kernel page the release gives it. Each cache has its own answer: a
# release refusing one cache has not refused the family.

# %%
opts, opts_fixed = vllm_page.options(t), vllm_page.options(vllm_page.load(fixed=True))
latest = opts[opts.vllm == opts.vllm.iloc[-1]]
latest.pivot(index=["gpu", "cache_dtype"], columns="family", values="cell")

# %%
pg = vllm_page.pages(t)
pg.pivot(index="vllm", columns=["gpu", "family"], values="page").loc[:, ["sm90", "sm100"]]

# %%
nv90 = latest[(latest.gpu == "sm90") & (latest.family == "gemma2") & (latest.cache_dtype == "nvfp4")]
checks.expect(len(nv90) == 1 and nv90.default_state.iloc[0] == "affected" and nv90.state.iloc[0] == "not affected",
              "latest release, sm90: Gemma-2 with an NVFP4 cache keeps its cap (decode on the wrapper), unlike the default cache")
checks.expect(not opts_fixed.cell.str.contains("cap dropped").any(),
              "with --fix cap-route no quantized cache drops a cap either")
checks.expect(len(pg) > 0 and set(pg[pg.page > 64].gpu) <= {"sm100"},
              "pages over 64 (trtllm-gen's) come only on sm100");

# %% [markdown]
# ## 5. On the kernel
#
# The table reads what each kernel is *told*. The live step runs vLLM's own backend on FlashInfer's
# kernels (`swa-repro audit --vllm X --mode live`, `scripts/gpu_vllm.sh`) and holds each row's output
# to the float64 reference at what the layer asks for, on random data whose logits reach twice the cap.
# On CUDA this page runs it here (Gemma-2, decode and mixed batches); elsewhere it reads the committed
# H200 recording, and says which.

# %%
docs, source = vllm_page.live(info.mode)
print("live results:", source)
lv = vllm_page.live_rows(docs)
lv[lv.family == "gemma2"]

# %%
shipped, fixed_live = lv[(lv.site == "shipped") & (lv.family == "gemma2")], lv[(lv.site == "fixed") & (lv.family == "gemma2")]
xqa = shipped[shipped.kernel == "xqa_batch_decode_with_kv_cache"]
checks.expect(len(xqa) > 0 and (xqa.told_cap == 0).all() and (xqa.wrong_rows == xqa.rows).all(),
              "as shipped on sm90, every Gemma-2 row vLLM sends to XQA is wrong: XQA is told no cap")
checks.expect(len(fixed_live) > 0 and (fixed_live.wrong_rows == 0).all() and (fixed_live.told_cap == 50).all(),
              "with --fix cap-route every Gemma-2 row is right, each kernel told the cap")
checks.expect(bool(lv.told_agrees.all()), "every kernel did exactly what vLLM told it (the audit's reading holds)");

# %% [markdown]
# With an NVFP4 cache (section 4's reading: on sm90 from 0.32.0 vLLM decodes it on fa2's decode wrapper,
# not XQA) the same check on the kernel: keys and values drawn on NVFP4's grid, so the release's cache
# write stores them exactly and the float64 reference holds.

# %%
nv_docs, nv_source = vllm_page.live_nvfp4(info.mode)
print("live results:", nv_source)
nv = vllm_page.live_rows(nv_docs)
nv = nv[nv.family == "gemma2"]
nv

# %%
checks.expect(len(nv) > 0 and (nv.wrong_rows == 0).all() and (nv.told_cap == 50).all()
              and "xqa_batch_decode_with_kv_cache" not in set(nv.kernel) and bool(nv.told_agrees.all()),
              "with an NVFP4 cache every Gemma-2 row is right on the kernel: fa2's wrappers, each told the cap");

# %%
checks.close()
