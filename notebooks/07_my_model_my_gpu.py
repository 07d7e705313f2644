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
# # 07 · My model, my GPU, my release: is it affected, and which fix makes it exact?
#
# Set `model` (your checkpoint: its `config.json` or the folder holding it, read without weights; or a
# family: gemma2, gemma3, gpt-oss, exaone4, cohere2, gemma4, mistral, qwen2-swa), `gpu`
# (`auto`: this machine's GPU class from its compute capability, or sm80 / sm90 / sm100) and
# `sglang_release` (`installed`, or a release 0.5.14-0.5.23). The release's own code builds the
# model's attention layers from a small config of your values (or the family's published ones: its
# real head_dim, heads, window and cap), derives the runner's window as it does, and every path of its FlashInfer backend is driven
# on CPU at the real window with prompts past it: the answer is re-derived here, not quoted from
# `docs/audit/families.md`. The audit is cached by content, so a second run costs seconds.
#
# *Exploring here.* Opened with `make lab`, this file is your copy in `scratch/` (git-ignored), not
# the tracked one in `notebooks/`: a save, and JupyterLab's autosave every two minutes, write that
# copy only, and the next `make lab` keeps your edits. Change the cell tagged `parameters`, then
# *Run All*: this run's figures, checks and parameters go to
# `artifacts/interactive/<notebook>-<hash of the parameters>/`; `artifacts/` itself is `make repro`'s.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"  # relative: from the repo root; a run in the lab writes under <this>/interactive/
model = "gemma2"  # a checkpoint's config.json or its folder (e.g. "./my-model"), or a family (families.FAMILIES)
gpu = "auto"  # auto (this GPU's class; without CUDA sm90, said so) | sm80 | sm90 | sm100
sglang_release = "installed"  # installed, or a release 0.5.14-0.5.23

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("07_my_model_my_gpu", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode, figure_saver

output_dir = artifact_set("07_my_model_my_gpu", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "07_my_model_my_gpu")

# %%
import pandas as pd

from swa_repro.notebook import family_answer, key_heatmap, plots
from swa_repro.notebook.checks import Checks
from swa_repro.sglang.audit import family_evidence

checks = Checks("07_my_model_my_gpu", output_dir)
save = figure_saver(output_dir)

# %% [markdown]
# ## 1. Which release, which GPU class
#
# The family audit runs on CPU in either mode (sglang's calls are recorded and the keys each query
# attends counted as ranges); a GPU only names its class, which decides what FlashInfer runs.

# %%
family, gpu_class, release = family_answer.check(model, gpu, sglang_release)  # a family, or your config.json read
name = family_answer.name_of(family)
print(f"sglang {release}; GPU class {gpu_class.why}")
print("the audit runs on CPU" + ("" if info.mode == "live" else " (no CUDA here: the CPU audit is all there is)"))

# %% [markdown]
# ## 2. The verdict per layer kind and path, at the family's real window

# %%
audit = family_answer.family_audit(release, family, gpu_class.name)
print(f"window {audit['config']['sliding_window']} (HF), runner sliding_window_size {audit['build']['runner_window']} "
      f"({audit['build']['runner_rule']}), cap {audit['config']['cap']:g}")
pd.DataFrame(family_answer.verdict_rows(audit))

# %%
answer = audit["answer"]
print("ANSWER:", answer["state"], *(f"\n  {w}" for w in ([answer["why"]] if isinstance(answer.get("why"), str)
                                                          else answer.get("why") or [])))

# %% [markdown]
# ## 3. The keys each query attends, at the real window
#
# One request per prefill path (the longest: past the window), drawn from the audit's ranges: a
# rectangle per run of rows, never a dense mask. Blue: attended and inside the window; red:
# attended outside it; orange: inside it and not attended. Then the same, zoomed to where it goes wrong.

# %%
title = f"{name} on sglang {release}, {gpu_class.name}: keys each query attends"
plots.publish(key_heatmap.figure(key_heatmap.panels_of(audit), title), "07_my_model_my_gpu_keys", save)

# %%
plots.publish(key_heatmap.figure(key_heatmap.panels_of(audit), title + " (zoomed)", zoomed=True),
              "07_my_model_my_gpu_keys_zoomed", save)

# %%
drawn = [r for row in key_heatmap.panels_of(audit) for _, r in row if r is not None]
checks.expect(drawn and all(key_heatmap.agrees(r) for r in drawn),
              "every panel draws extra / missing keys only where the audit counts them", panels=len(drawn));

# %% [markdown]
# ## 4. What to do, and the check that it works
#
# The audit's own remedy for this family on this GPU class (`sglang.audit.family_fix.remedy`, the one
# `swa-repro audit --model` and `doctor --model` print: the backend's fixes, the model file's and the
# GPU class's, or what to do where sglang has no fix); then the family audited again on a copy of the
# release with the remedy's fixes, which must say not affected, or layer != HF where the model file
# gives its layers another window than transformers' mask (Cohere2's, kept as vLLM keeps it).

# %%
fix = family_answer.fix_answer(release, family, gpu_class.name, audit)
print(family_answer.fix_sentence(fix))

# %%
pd.DataFrame(family_answer.verdict_rows(fix["fixed"] or {}))  # empty: nothing to fix, or no fix applies

# %%
if fix["fixed"] is not None:
    plots.publish(key_heatmap.figure(key_heatmap.panels_of(fix["fixed"]), title + " with the fixes above (zoomed)",
                                     zoomed=True), "07_my_model_my_gpu_keys_fixed", save)

# %%
checks.expect(fix["exact"] == (not family_answer.bad(fix["fixed"] if fix["fixed"] is not None else audit)),
              "the fix's verdict is the fixed copy's own audit", fixes=fix["fixes"])
checks.expect(fix["fixed"] is None or len(family_answer.bad(fix["fixed"])) < len(family_answer.bad(audit)),
              "the fixes leave fewer wrong paths than the release as shipped")
checks.expect(not fix["fixes"] or fix["fixed_state"] in ("not affected", "layer != HF"),
              "with the audit's remedy, the audit of the release says not affected (or layer != HF: every "
              "path serves what the layer asks, the model file's window is not HF's)", remedy=fix["command"],
              answer=fix["fixed_state"]);

# %% [markdown]
# ## 5. On the real kernel
#
# What FlashInfer itself did with these calls, as shipped and with the fixes, against the float64
# reference at the family's window and cap: the committed evidence of `scripts/gpu_family.sh` on a
# GPU (`recordings/family-live/`), read the same way in either mode. sm80's row ran its fa2 on the
# same card; sm100's kernels need a Blackwell card.

# %%
call, live_rows = family_evidence.family_rows(name, release, gpu_class.name)  # the families' published configs
print(family_evidence.sentence(call, name, release, gpu_class.name))
pd.DataFrame(live_rows)

# %%
checks.expect(call is None or family_evidence.consistent(call, name),
              "the kernel is never off the reference where the key audit of the same run is clean",
              call=None if call is None else call.name);

# %%
checks.close()
