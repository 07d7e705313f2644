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
# # 03 · Apply the backend patch (in memory) and watch what sglang plans
#
# sglang's FlashInfer backend plans its sliding-window paged prefill wrapper in two methods of
# `FlashInferIndicesUpdaterPrefill`: `update_sliding_window` trims each request's KV to the last
# `W + extend_len` keys and calls `call_begin_forward`, which calls the wrapper's `begin_forward`.
# Here: where sglang is and what state its backend file is in, the two methods as loaded, the
# upstream fix (PR #31501) as a diff, the fix applied **in memory only** (the installed file is
# not touched), and the `plan()` arguments sglang's own code issues before and after, read off a
# trace of every wrapper call. On CUDA the wrappers are the real FlashInfer ones; without CUDA
# they are the CPU kernel model behind the same calls (the first output says which). Last, the
# fixes for every finding class, on the release you choose: its file's state per fix, each
# fix's diff, and how to apply them for real.
#
# *Exploring here.* Opened with `make lab`, this file is your copy in `scratch/` (git-ignored), not
# the tracked one in `notebooks/`: a save, and JupyterLab's autosave every two minutes, write that
# copy only, and the next `make lab` keeps your edits. Change the cell tagged `parameters`, then
# *Run All*: this run's figures, checks and parameters go to
# `artifacts/interactive/<notebook>-<hash of the parameters>/`; `artifacts/` itself is `make repro`'s.

# %% tags=["parameters"]
mode = "auto"  # auto | live | model
output_dir = "artifacts"  # relative: from the repo root; a run in the lab writes under <this>/interactive/
# one sliding-window EXTEND batch: the seed case (story.SEED_SHAPES: three fresh requests of
# 6/8/12 tokens, window 4, the upstream regression case); a value set here replaces that shape,
# None keeps it. window_left is RadixAttention.sliding_window_size: W keys left of the query.
prefix_lens = None
extend_lens = None
window_left = None
num_qo_heads = None
num_kv_heads = None
head_dim = None
page_size = None
# the section "Choose the fixes for the release you run": that release's own backend file (its cached
# overlay, installed from the package index on first use) and the `swa-repro patch --fix` fixes for it
sglang_release = "0.5.23"
fixes = "all"  # all, or a comma list of swa_repro.sglang.fix.ORDER names

# %%
from swa_repro.notebook import param_cell

params_ok = param_cell.check("03_apply_backend_patch", globals())  # a bad one stops the notebook here

# %%
from swa_repro.notebook.artifacts import artifact_set
from swa_repro.notebook.runner import announce_mode

output_dir = artifact_set("03_apply_backend_patch", globals())  # this run's folder (the first cell says which)
info = announce_mode(mode, output_dir, "03_apply_backend_patch")

# %%
from swa_repro.notebook import story
from swa_repro.notebook.checks import Checks
from swa_repro.sglang import backend_view as V
from swa_repro.sglang import harness as H

checks = Checks("03_apply_backend_patch", output_dir)
case = story.seed_case(prefix_lens=prefix_lens, extend_lens=extend_lens, window_left=window_left,
                       num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       page_size=page_size).with_(name="03_case")
digest_before = V.file_digest()

# %% [markdown]
# ## Where sglang is, and the state of its backend file

# %%
where = H.sglang_info()
where

# %%
checks.expect(where["state"] in ("unfixed", "fixed"), "the installed backend file is recognised (unfixed or fixed)",
              state=where["state"], file=where["backend_file"]);

# %% [markdown]
# ## The two methods as loaded
#
# `update_sliding_window` (wrapper 0 is the sliding-window wrapper; the paged-only branch trims
# to `sliding_window_size + seq_lens - prefix_lens` keys) and `call_begin_forward` (the paged
# `begin_forward(...)` call at the end: note what is *not* among its keyword arguments). Only those
# lines are shown; `print(V.method_source("call_begin_forward"))` prints a whole method.

# %%
from swa_repro.notebook.show import excerpt

print(excerpt(V.method_source("update_sliding_window"), "paged_kernel_lens = torch.minimum", more=2))

# %%
print(excerpt(V.method_source("call_begin_forward"), ".begin_forward(", last=True))

# %%
checks.expect(("window_left" in V.method_source("call_begin_forward")) == (where["state"] == "fixed"),
              "call_begin_forward mentions window_left exactly when the file is fixed");

# %% [markdown]
# ## The upstream fix as a diff against the installed file

# %%
diff = V.patch_diff()
print(diff or "(the installed file is already fixed: no diff)")

# %%
checks.expect(where["state"] == "fixed" or ("+" in diff and "window_left" in diff),
              "the diff adds window_left to the paged plan");

# %% [markdown]
# ## Applied in memory
#
# `sglang_patch.patched()` swaps the two methods of the loaded class for their fixed form and
# restores them on exit; `unpatched()` does the same with the original (pre-fix) form.

# %%
fixed_cbf = V.method_source("call_begin_forward", patched=True)
print(fixed_cbf[-900:])

# %%
checks.expect("window_left" in fixed_cbf, "inside patched(), call_begin_forward passes window_left")
checks.expect("window_left" not in V.method_source("call_begin_forward", patched=False),
              "inside unpatched(), call_begin_forward has no window_left");

# %% [markdown]
# ## What sglang plans, before and after
#
# The same batch through sglang's `FlashInferAttnBackend` on the paged-only route
# (`SGLANG_FLASHINFER_USE_PAGED=1`), unpatched and patched. Every wrapper call is recorded; below
# are the keyword arguments of the `begin_forward` of the wrapper the sliding-window layer runs
# on, and of its `forward`.

# %%
before = H.run_case(case, patched=False, mode=info.mode)
after = H.run_case(case, patched=True, mode=info.mode)
{"unpatched plan": V.swa_plan_kwargs(before), "patched plan": V.swa_plan_kwargs(after)}

# %%
{"unpatched forward": V.swa_forward_kwargs(before), "patched forward": V.swa_forward_kwargs(after)}

# %%
checks.expect("window_left" not in V.swa_plan_kwargs(before), "unpatched: plan() gets no window_left (the bug)")
checks.expect(V.swa_plan_kwargs(after).get("window_left") == case.window_left,
              "patched: plan() gets window_left = the layer's sliding_window_size")
checks.expect(V.swa_forward_kwargs(before)["window_left"] == case.window_left == V.swa_forward_kwargs(after)["window_left"],
              "both: the window reaches forward() (which overwrites the wrapper's window)");

# %% [markdown]
# ## What it does to the output
#
# Each request's output against the exact float64 reference computed on the full sequences
# with the layer's window.

# %%
{"unpatched": before.row(), "patched": after.row()}

# %%
checks.expect(before.passed == (not H.reaches_past_window(case)),
              "unpatched fails iff some query's trimmed KV holds a key outside its window",
              max_abs_err=before.max_abs_err)
checks.expect(after.passed, "patched matches the exact reference", max_abs_err=after.max_abs_err)
checks.expect(V.file_digest() == digest_before, "the installed backend file is byte-for-byte unchanged");

# %% [markdown]
# ## Choose the fixes for the release you run
#
# PR #31501 is one of eight finding classes (`docs/audit/releases.md`); `swa-repro patch --fix`
# has one source edit per class, written against sglang 0.5.14-0.5.23. This section reads the
# backend file of the release you run (`sglang_release`: that release's own package, not the
# installed one) and, from its structure, each fix's state in it: `needed`, `applied` (the
# release ships it) or `unknown` (not a structure the fix knows). Nothing is written. A release
# that cannot be had (no network, no cached copy) or that the fixes refuse: one line, and the
# rest of the section skips.

# %%
from swa_repro.notebook import fix_view as FV
from swa_repro.notebook.show import show
from swa_repro.sglang import fix as F

release = FV.load_release(sglang_release, fixes)
print(release.line)

# %%
if release.text:
    show(FV.state_rows(release))

# %% [markdown]
# Each chosen fix as its own diff: the file with the fixes before it applied, then with it too
# (one line of context), so a diff shows only what that fix edits.

# %%
if release.fixed:
    steps = FV.step_diffs(release)
    print("\n\n".join(FV.diff_text(name, diff) for name, diff in steps))

# %%
if release.fixed:
    shipped, fixed = F.states(release.text, release.names), F.states(release.fixed)
    checks.expect(all(s.state != "unknown" for s in shipped.values()), "every chosen fix knows the release's file",
                  states={n: s.state for n, s in shipped.items()})
    checks.expect(all(fixed[n].state == "applied" for n in release.names), "with the chosen fixes, each reads applied")
    checks.expect(all(bool(diff) == (shipped[n].state == "needed" and not F.FIXES[n].requires) for n, diff in steps),
                  "a fix edits the file exactly when the release needs it (a composite fix: through its parts)")

# %% [markdown]
# ## Applying them for real
#
# The same fixes, written to a file: `--out FILE` writes a fixed copy, `--in-place` edits the
# installed file and keeps a backup for `swa-repro patch revert`. `swa-repro audit --sglang X
# --fix NAMES` asks the audit's questions of the fixed release (notebook 04 shows it).

# %%
if release.fixed:
    print("\n".join(FV.apply_commands(release, where["sglang"])))

# %%
if release.text:
    checks.expect(FV.file_unchanged(release), "the release's backend file is unchanged")
checks.close()
