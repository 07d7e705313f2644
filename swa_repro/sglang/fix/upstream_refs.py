"""Upstream issues and PRs on each finding, for the README's "Upstream." lines (issue #26).

A maintainer reading ``docs/upstream`` asks first whether upstream already has this; each finding
here cites the threads found, their state as the thread showed it when read (``state`` can go stale:
re-check before filing), what they change and how our diff differs. Summaries are ours, not the
threads' words. A finding with no thread gets ``()`` and its queries in ``NONE_FOUND``, so "none
found" says what was searched.
"""

from __future__ import annotations

from swa_repro.engine.upstream_refs import FLASHINFER, ISSUE_33915, SGLANG, Ref, ref

# ----------------------------------------------------------------------------- the threads
PR_31501 = ref(31501, SGLANG, "pr", "[flashinfer] Pass window_left at plan time for the SWA paged prefill wrapper",
               "merged", "plan-time `window_left` for the sliding-window paged prefill wrapper on normal "
               "extend (ragged mode and spec verify left as they were), with a paged-mode case in the SWA kit test",
               "nothing to add: 0.5.23 has it, and the audit reads it fixed")
PR_34093 = ref(34093, SGLANG, "pr", "flashinfer: pass logits_soft_cap (and ragged window_left) at plan time; "
               "gemma-2 / grok ran uncapped", "open", "a fix of #33915: the cap on every plan call, the window on "
               "the ragged plan and in the no-prefix ragged forward; kit cases for the cap (ragged, merge, "
               "decode) and the ragged window (no prefix, merge)",
               "the same plan-time idea, split per finding; the thread as read does not show how theirs "
               "plans the one ragged wrapper that sliding-window and full layers share, while ours gives the "
               "sliding-window layers their own, because a runtime `window_left=-1` on a window-planned kernel "
               "is not full attention (fa3 on sm90, split-KV chunk sizing). Theirs comes with kit tests")
PR_32062 = ref(32062, SGLANG, "pr", "[FlashInfer] Plan wrappers from layer-local attention metadata", "open",
               "per-wrapper-group `num_qo_heads` and `window_left` (Laguna: different heads on "
               "sliding-window and full layers), naming the cause shared with ours: one ragged planner for "
               "all groups, the last group's plan winning",
               "the window only, with a second ragged wrapper; theirs is broader (any per-group metadata) "
               "and, if it lands, our ragged diffs reduce to the window plumbing")
PR_26513 = ref(26513, SGLANG, "pr", "Fix FlashInfer SWA EXTEND-with-prefix correctness in merge_state path",
               "merged", "a per-(query, key) window for the paged prefix, as a custom mask, in the ragged + "
               "merge_state extend",
               "complementary: that is the paged half, exact in 0.5.23; ours fixes the ragged half (new "
               "tokens attending each other), which it left unwindowed")
PR_26513_FULL = ref(26513, SGLANG, "pr", PR_26513.title, "merged",
                    "the sliding-window wrapper's paged prefix in the ragged + merge_state extend (the extend's "
                    "K/V is written after the paged pass, so that pass reads the prefix only)",
                    "the same reason for the full layers' wrapper, which 0.5.20 still planned over the whole "
                    "sequence and 0.5.21 over the prefix; ours backports that branch to 0.5.14-0.5.20")
FI_4972 = ref(4972, FLASHINFER, "issue", "[Bug] fa2 paged prefill: non-causal sliding window is wrong on the "
              "first query tile when qo_len < kv_len", "open", "a kernel bug: with a finite `window_left` and "
              "`causal=False`, fa2 prefill gets the leading query rows wrong when split-KV splits the request",
              "not a fix of this finding; with #4992 it shows the planned window sizing split-KV chunks, one "
              "reason ours keeps full layers off a window-planned wrapper")
FI_4992 = ref(4992, FLASHINFER, "pr", "fix(fa2): cover the full KV span of non-causal sliding-window tiles "
              "under split-KV", "open", "a fix of flashinfer #4972, whose scheduler and prefill kernels "
              "sized a request's KV chunks from `window_left` plus one query tile, too short for non-causal tiles",
              "kernel side; our causal ragged and DFlash plans are outside its case, and whether EAGLE's "
              "custom-mask verify (ours plans a window with a tree mask) is inside it the thread does not say")
ISSUE_22679 = ref(22679, SGLANG, "issue", "[Bug] EAGLE/MTP + sliding-window attention broken on both flashinfer "
                  "and triton", "open", "EAGLE/MTP on a sliding-window target failing to start: verify "
                  "and draft-extend left the window metadata (prefix lengths) unset",
                  "a crash before the window question; 0.5.23 derives verify's prefix lengths, and ours is about "
                  "which keys verify then attends")
PR_22892 = ref(22892, SGLANG, "pr", "[Bug] Fix EAGLE + sliding-window attention on flashinfer and triton "
               "backends", "closed", "a fix of #22679: prefix lengths derived for target verify and draft "
               "extend in both backends", "theirs fixes the crash only; ours plans the window on verify")
PR_39160 = ref(39160, SGLANG, "pr", "[Bugfix] Fix FlashInfer EAGLE verification with sliding-window attention",
               "closed", "EAGLE verify's KV start moved into the window and each request's tree mask "
               "compacted to the kept keys, windowed by logical positions; separate packed-mask buffers for "
               "CUDA graphs",
               "see #39287, the same author's follow-up a day later (FlashInfer and Triton)")
PR_39287 = ref(39287, SGLANG, "pr", "[Bugfix] Fix EAGLE sliding-window verification in FlashInfer and Triton",
               "open", "FlashInfer and Triton: a compact tree mask over the retained keys (window applied at "
               "the tree's edge), the KV start passed to EAGLE's FlashInfer metadata; EAGLE SWA chain/tree and "
               "graph-replay tests",
               "both window the tree mask on each node's tree position (theirs opened 2026-09-13, still "
               "open when re-read on 2026-12-06). Ours keeps wrapper 0 on the whole sequence and the tree mask, cuts the window "
               "into the mask, plans it widened by `draft_token_num - 1` and gives each CUDA-graph verify "
               "wrapper its own packed-mask buffer (#39160's cure); theirs reads only the window's keys, which "
               "matters with the sliding-window KV pool, where ours lists (masked) slots outside the window; "
               "theirs is the better fix there and also fixes Triton's flattened-index window; ours changes "
               "FlashInfer's backend only")
PR_27469 = ref(27469, SGLANG, "pr", "dflash add sliding window attention draft layer support", "merged",
               "sliding-window layers for DFlash drafters, and DFlash verify's request-granular "
               "`kv_start_idx` trim", "keeps that trim and plans the window, so early draft queries no "
               "longer see keys past their window")
PR_35208 = ref(35208, SGLANG, "pr", "[flashinfer] Pass window_left at plan time for DFlash verify", "open",
               "plan-time `window_left` for DFlash verify (EAGLE unchanged) and the kit's DFlash reference "
               "mask corrected to per-query windows, making the existing SWA DFlash case a regression test",
               "the same one-line backend change; theirs is better: it also fixes the test reference, which "
               "ours leaves to upstream")
FI_1193 = ref(1193, FLASHINFER, "issue", "logit cap is wrong in flashinfer >= 0.2.0", "closed",
              "Grok-1 / Gemma accuracy on sglang's FlashInfer backend collapsing from flashinfer 0.2 (the "
              "cap moved to plan time)", "the root symptom; it was closed, yet sglang 0.5.23 still plans without "
              "the cap")
PR_33987 = ref(33987, SGLANG, "pr", "fix(flashinfer): plan with logits_soft_cap so attn capping is not dropped",
               "closed", "the cap read from the model's attention layers at backend init and planned on "
               "decode, ragged and paged; `fast_decode_plan` given the cap, a `fast_prefill_plan` replay "
               "asserting it, startup failure on mixed caps",
               "the same source of the cap (the layers' `logit_cap`, so Grok's fallback of 30 is planned) and "
               "the same start-up refusal of mixed caps; ours also refuses, per layer, a non-tanh method")
PR_38525 = ref(38525, SGLANG, "pr", "Fix FlashInfer planning for configured attention logits soft cap", "open",
               "the cap read from `hf_text_config.attn_logit_softcapping` once per indices updater and "
               "planned on ragged, paged, decode and `fast_decode_plan`, `fast_prefill_plan` taking and keeping "
               "it; an SM90 CI test incl. CUDA-graph decode replay",
               "the same plan sites; theirs reads the config key, so a Grok checkpoint without it (grok.py's "
               "fallback of 30) is planned uncapped, ours reads the layers' `logit_cap`; theirs has a CI test "
               "and a cap-taking `fast_prefill_plan`, ours keeps the captured module there")

PR_4823 = ref(4823, SGLANG, "pr", "gemma3: impl `get_attention_sliding_window_size` for attn init", "merged",
              "Gemma-3 output turning to garbage past ~2k tokens because the model class had no "
              "`get_attention_sliding_window_size`, so the attention backends were built without a window",
              "the same hook for Cohere2, returning the window its layers already pass "
              "(`config.sliding_window`, kept as vLLM keeps it); the layers are unchanged")
ISSUE_4570 = ref(4570, SGLANG, "issue", "[Feature] Support Cohere Command-A (Cohere2ForCausalLM arch)", "open",
                 "Cohere2's interleaved sliding-window layers, when `Cohere2ForCausalLM` was a stub",
                 "the class now builds sliding layers, but no runner window: the hook is what it lacks")
ISSUE_34354 = ref(34354, SGLANG, "issue", "[Bug] 请问sglang的语义上 sliding_window_size 到底包不包含当前的token呢？",
                  "closed", "the question (unanswered) whether `sliding_window_size` counts the query (Triton's "
                  "prefill and decode kernels read it differently)", "keys left of the query, as gemma2.py counts; Cohere2's layers "
                  "keep HF's count (Cohere's convention, as vLLM keeps it), which the audit reports as `layer != HF`")
FI_5133 = ref(5133, FLASHINFER, "pr", "feat(prefill): let backend=\"auto\" reach cuDNN/CUTLASS on Blackwell "
              "ragged prefill", "merged", "`auto` moving windowless, capless ragged prefill on sm100 to cuDNN or "
              "CUTLASS, and staying on fa2 otherwise",
              "sglang picks `cutlass` explicitly, which FlashInfer never rewrites; ours keeps fa2 where a window "
              "or cap must be planned, as FlashInfer's own `auto` would")

REFS: dict[str, tuple[Ref, ...]] = {
    "paged_only_window": (PR_31501,),
    "ragged_no_prefix_window": (ISSUE_33915, PR_34093, PR_32062, FI_4972, FI_4992),
    "ragged_prefix_window": (ISSUE_33915, PR_34093, PR_26513, PR_32062),
    "eagle_verify_window": (ISSUE_22679, PR_22892, PR_39160, PR_39287, FI_4992),
    "dflash_verify_window": (PR_27469, PR_35208),
    "soft_cap_prefill": (FI_1193, ISSUE_33915, PR_33987, PR_34093, PR_38525),
    "soft_cap_decode": (FI_1193, ISSUE_33915, PR_33987, PR_34093, PR_38525),
    "soft_cap_cuda_graph": (ISSUE_33915, PR_33987, PR_38525),
    "commandr_window_hook": (PR_4823, ISSUE_4570, ISSUE_34354),
    "ragged_prefix_full_layers": (PR_26513_FULL,),
    "sm100_no_cutlass_window": (FI_5133,),
}
NONE_FOUND: dict[str, str] = {}  # finding -> "queries tried: ..." where REFS[finding] == ()


def upstream_section(name: str) -> str:
    """The README's "**Upstream.**" paragraph for finding ``name``: one bullet per thread."""
    refs = REFS[name]
    if not refs:
        tried = NONE_FOUND.get(name, "unrecorded").removeprefix("queries tried: ")
        return f"**Upstream.** no upstream issue or PR found (searched: {tried})."
    kind = {"issue": "issue", "pr": "PR"}
    return "\n".join(["**Upstream.**", ""] + [f"- [{r.label}]({r.url}) ({kind[r.kind]}, {r.state}): covers "
                                                f"{r.covers}; ours: {r.versus}." for r in refs])
