"""Where each modelled fact lives in every modelled flashinfer wheel, and what differs between them.

The kernel model (:mod:`swa_repro.kernel.model`) mirrors named source lines. This module holds
those lines per version as data, with a verdict per fact ("same in all", or what differs and
where the model follows it), and the prose of each difference. ``docs/flashinfer_versions.md``
is generated from it and a test holds the two equal::

    python -m swa_repro.kernel.sources > docs/flashinfer_versions.md
    python -m swa_repro.kernel.sources --check DIR   # DIR/<version>/ = unpacked wheels

``--check`` reads every cited line range in the unpacked wheels and reports any that lacks the
fact's token: run it when a version is added (``pip download --no-deps flashinfer-python==V``,
unzip into ``DIR/V``). Paths: ``inc/`` = ``flashinfer/data/include/flashinfer/``,
``attn/`` = ``inc/attention/``, ``py/`` = ``flashinfer/``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from swa_repro.core.versions import FLASHINFER_VERSIONS

PREFIXES = {"inc/": "flashinfer/data/include/flashinfer/", "attn/": "flashinfer/data/include/flashinfer/attention/",
            "py/": "flashinfer/"}
SAME = "same in all"


@dataclass(frozen=True)
class Fact:
    what: str
    file: str  # with a PREFIXES prefix
    lines: dict  # version -> "1658" | "2110-2117" | "—" (absent)
    token: str  # text the cited lines hold (``--check``)
    verdict: str  # SAME + how compared, or what differs (with its section below)


def _per(*vals) -> dict:
    """One value per version, in FLASHINFER_VERSIONS order."""
    assert len(vals) == len(FLASHINFER_VERSIONS), vals
    return dict(zip(FLASHINFER_VERSIONS, (str(v) for v in vals)))


def _sched(a, b, c) -> dict:
    """scheduler.cuh is byte-identical in 0.6.7.post2 .. 0.6.14 and in 0.7.2 / 0.7.2.post1."""
    return _per(a, a, a, a, b, c, c)


def _kern(a, b, c, d, e) -> dict:
    """prefill.cuh is byte-identical in 0.6.11.post1 / 0.6.12 and in 0.7.2 / 0.7.2.post1."""
    return _per(a, b, b, c, d, e, e)


FACTS: list[Fact] = [
    # ---- python: BatchPrefillWithPagedKVCacheWrapper
    Fact("`plan()` def", "py/prefill.py", _per(1658, 1698, 1711, 1765, 2120, 2527, 3215), "def plan(",
         "differs off the modelled path only: trtllm-gen checks (0.6.7.post2), CUDA-graph hints (b.3), "
         "backend choice args (b.4); 0.6.11.post1 = 0.6.12 = 0.6.14 word for word"),
    Fact("module choice `window_left >= 0`", "py/prefill.py", _per(1982, 2022, 2035, 2089, 2525, 2989, 3689),
         "window_left >= 0", SAME + " (JIT variant still `DefaultAttention<false, use_swa, ...>`)"),
    Fact("plan stores `_window_left`", "py/prefill.py", _per(2051, 2094, 2107, 2161, 2615, 3065, 3801),
         "self._window_left = window_left", SAME),
    Fact("`forward()` overwrites `_window_left`", "py/prefill.py", _per(2080, 2123, 2136, 2190, 2644, 3233, 3969),
         "self._window_left = window_left", SAME + " (`forward()` bodies identical under `diff -w`)"),
    Fact("`run()` window consistency assert", "py/prefill.py", _per(2238, 2304, 2317, 2387, 2904, 3577, 4313),
         "window_left", SAME + " (fires only on an explicit run() window; forward() overwrote it first)"),
    Fact("`fixed_split_size` None -> -1, `disable_split_kv` default", "py/prefill.py",
         _per(1829, 1869, 1882, 1936, 2297, 2706, 3406), "fixed_split_size", SAME),
    Fact("`auto`: `determine_attention_backend(` in plan", "py/prefill.py",
         _per(1965, 2005, 2018, 2072, 2506, 2970, 3670), "determine_attention_backend(",
         "0.6.18+ also pass head dims; same result for head_dim 64/128/256 (b.4)"),
    Fact("`determine_attention_backend`", "py/utils.py", _per(461, 476, 476, 476, 545, 574, 574),
         "def determine_attention_backend", "as above (b.4)"),
    # ---- scheduler
    Fact("`PrefillBinarySearchKVChunkSize`", "attn/scheduler.cuh", _sched(101, 101, 101),
         "PrefillBinarySearchKVChunkSize", SAME + " (body untouched by the 0.6.12 -> 0.6.18 -> 0.7.2 diffs)"),
    Fact("`PrefillSplitQOKVIndptr`", "attn/scheduler.cuh", _sched(495, 545, 545), "PrefillSplitQOKVIndptr",
         "0.6.18 adds CUDA-graph-only args, passed as 0 (b.3)"),
    Fact("min chunk `max(128 / page_size, 1)`", "attn/scheduler.cuh", _sched(527, 579, 579), "128 / page_size", SAME),
    Fact("CTA_TILE_Q call (average packed qo, non-graph)", "attn/scheduler.cuh", _sched(549, 619, 619),
         "FA2DetermineCtaTileQ", SAME + " (same inputs; 0.6.18+ extra args change nothing for head_dim <= 256, b.2)"),
    Fact("effective kv length `min(ceil_div(window_left + cta_tile_q, page), pages)`", "attn/scheduler.cuh",
         _sched(561, 631, 631), "effective_kv_len_arr", SAME + " (flashinfer PR #4992 is in no wheel)"),
    Fact("`num_chunks_kv`", "attn/scheduler.cuh", _sched(582, 652, 652), "num_chunks_kv", SAME),
    Fact("merge_indptr / o_indptr (planned stride)", "attn/scheduler.cuh", _sched("597-599", "667-669", "667-669"),
         "merge_indptr", SAME),
    Fact("`padded_batch_size` = CTA count (non-graph)", "attn/scheduler.cuh", _sched("602-603", "672-673", "672-673"),
         "padded_batch_size", SAME),
    Fact("`max_batch_size_if_split` = 2 SMs / kv heads", "attn/scheduler.cuh",
         _sched("717-720", "788-791", "788-791"), "max_batch_size_if_split", SAME),
    Fact("tmp_v / tmp_s sizing (partial-output buffers)", "attn/scheduler.cuh",
         _sched("772-776", "860-864", "876-888"), "batch_prefill_tmp_v",
         "**0.7.2+ divide the rows by the GQA group (b.5)**; the model follows (`VERSION_FACTS`); matters only "
         "when the run writes more chunks than planned"),
    # ---- kernel
    Fact("`FA2DetermineCtaTileQ`", "inc/utils.cuh", _per(384, 384, 384, 389, 408, 411, 411), "FA2DetermineCtaTileQ",
         "new branches for head_dim >= 512 (0.6.14+) and an smem probe (0.6.18+); "
         "same result for head_dim <= 256 (b.2)"),
    Fact("per-CTA `kv_start_idx`, chunk start/end", "attn/prefill.cuh",
         _kern("2110-2117", "2441-2448", "2939-2946", "3609-3616", "3826-3833"), "kv_start_idx",
         SAME + " (whitespace-stripped block hash)"),
    Fact("`num_iterations` (causal)", "attn/prefill.cuh",
         _kern("2215-2224", "2558-2567", "3113-3122", "3807-3816", "4035-4044"), "num_iterations",
         SAME + " (block hash)"),
    Fact("`window_iteration` / `mask_iteration`", "attn/prefill.cuh",
         _kern("2251-2263", "2594-2606", "3149-3161", "3843-3855", "4071-4083"), "window_iteration",
         SAME + " (block hash)"),
    Fact("element mask applied `iter >= mask_iteration || iter < window_iteration`", "attn/prefill.cuh",
         _kern(2313, 2662, 3237, 3952, 4182), "iter < window_iteration", SAME),
    Fact("`logits_mask` (causal, `kv_idx >= chunk_end`, variant)", "attn/prefill.cuh",
         _kern(751, 984, 1077, 1484, 1642), "logits_mask", SAME + " (function hash)"),
    Fact("multi-item `out_of_boundary`", "attn/prefill.cuh", _kern(843, 1076, 1169, 1576, 1734), "out_of_boundary",
         SAME + " (function hash)"),
    Fact("run-time chunk count `ceil_div(min(kv_len_safe, window_left + CTA_TILE_Q), kv_chunk_size)`",
         "attn/prefill.cuh", _kern("2364-2365", "2727-2728", "3343-3344", "4057-4058", "4293-4294"),
         "num_kv_chunks", SAME + " (block hash); `window_left` is the run's"),
    Fact("partial slot `o_indptr + kv_tile_idx`", "attn/prefill.cuh", _kern(2139, 2470, 2973, 3655, 3872),
         "o_ptr_base", SAME),
    Fact("partial write stride `num_kv_chunks * o_stride_n`", "attn/prefill.cuh",
         _kern("2373-2375", "2736-2738", "3361-3364", "4075-4078", "4311-4314"),
         "num_kv_chunks * o_stride_n",
         SAME + " (0.6.14+ add a VO-split writer with the same stride, head_dim >= 512 only)"),
    Fact("lse slot `o_indptr + qo_idx * num_kv_chunks + kv_tile_idx`", "attn/prefill.cuh",
         _kern(2392, 2755, 3383, 4097, 4333), "lse[", SAME),
    Fact("tmp_v typed `DTypeO*` (paged Dispatched)", "attn/prefill.cuh", _kern(2551, 2914, 3605, 4335, 4574),
         "DTypeO* tmp_v", SAME + "; a float-sized buffer written at 2 bytes holds 2 R rows (b.5)"),
    Fact("NUM_MMA_KV smem budget (paged Dispatched)", "attn/prefill.cuh", _kern(2583, 2946, 3641, 4372, 4611),
         "cudaDevAttrMaxSharedMemoryPerMultiprocessor", SAME + " for 16-bit KV, head_dim <= 256 (b.1)"),
    Fact("opt-in smem cap on it", "attn/prefill.cuh", _kern("—", "—", 3680, 4417, 4659), "max_smem_per_block_optin",
         "**from 0.6.14 on** (b.1); never binds on sm80/sm90 for modelled configs"),
    Fact("window element mask (`variant.window_left`, `use_sliding_window` clause)", "attn/variants.cuh",
         _per(*["64, 88-89"] * 7), "window_left", SAME + " (file byte-identical)"),
    Fact("paged kv length `get_length`", "inc/page.cuh", _per(147, 147, 147, 147, 185, 185, 185), "get_length",
         SAME + ": `(pages - 1) * page_size + last_page_len`"),
]

# fa3 is not a line per version: its window files are identical in all seven (b.6).
FA3_NOTE = ("fa3 (sm90) compiles the window mask only with `LEFT_SLIDING_WINDOW` (csrc/batch_prefill_sm90.cu:28, 33; "
            "attn/hopper/mainloop_mma.cuh:96; attn/hopper/prefill_sm90.cuh:253-256); these files and every "
            "`batch_prefill_sm90*` source are identical in all modelled versions.")

DIFFERENCES: list[tuple[str, str]] = [
    ("b.1 KV tile smem budget (`cta_tile_kv`)",
     "Up to 0.6.12 the per-CTA budget is `smem_per_sm / ctas_per_sm`; from 0.6.14 it is also capped by the "
     "opt-in per-block limit (prefill.cuh 0.6.14:3680, 0.6.18:4417, 0.7.2:4659). The 0.6.14 rewrite adds "
     "VO-split, shared-K/V and FP8 terms, all zero for 16-bit KV at head_dim <= 256, so the formula reduces to "
     "the old one plus the cap. The model applies the cap from 0.6.14 on (`VERSION_FACTS`). On sm80/sm90 the cap "
     "never binds for modelled tiles, so no tile map changes."),
    ("b.2 CTA_TILE_Q (`fa2_cta_tile_q`)",
     "utils.cuh:384 (0.6.7.post2-0.6.12) picks 128 for long packed queries at head_dim < 256, else 64 or 16. "
     "0.6.14 (:389) adds a head_dim >= 512 branch; 0.6.18 (:408) and 0.7.2 (:411) add another and an smem probe "
     "on the 16 branch, which needs at most 73,728 B at head_dim 256 and fits every sm80+ part. Same result for "
     "the modelled head dims: no model change."),
    ("b.3 CUDA-graph plan inputs (not modelled)",
     "0.6.18 adds `uniform_q_len` to the C++ plan (scheduler.cuh:583-612) but passes 0. 0.7.2.post1 exposes "
     "`plan(uniform_q_len=)`, honoured only for fa2 with a CUDA-graph wrapper. 0.7.2 allocates "
     "`block_valid_mask` for every CUDA-graph plan (scheduler.cuh:906-916). The model plans with "
     "`enable_cuda_graph=False`, so none of this applies."),
    ("b.4 `auto` backend",
     "From 0.6.18 `determine_attention_backend` also takes head dims and picks fa3 only for {64, 128, 256} "
     "(or 192/128) (utils.py 0.6.18:475, 0.7.2:504). For the modelled head dims `auto` is still fa3 on sm90; "
     "`cute-dsl` backends are used only when named."),
    ("b.5 Partial-output buffers (`partial_buffer_rows`, `overflowed_into`)",
     "0.6.x size tmp_v/tmp_s for R = padded_batch_size * cta_tile_q rows (scheduler.cuh 0.6.12:772-776, "
     "0.6.18:860-864); 0.7.2 uses R = ceil_div(padded_batch_size * cta_tile_q, gqa_group) (:876-888). "
     "padded_batch_size is the CTA count (0.6.12:602, 0.7.2:672). tmp_v is sized in floats but written as "
     "2-byte DTypeO (prefill.cuh 0.7.2:4574), so it holds 2R rows and tmp_s follows it. Only a run that writes "
     "more slots than planned (planned with a window, run without or with a larger one) can pass 2R; its rows "
     "then land on tmp_s: one 2-byte row of heads x head_dim covers the 4-byte LSEs of head_dim / 2 slots, "
     "counted from the batch's first slot, so requests whose LSEs it covers are undefined, single-row ones "
     "included. The model sizes R per version and marks those requests (`kernel/partials.py`). "
     "sglang's bug direction (plan without the window) never writes more than planned. Example: 2 requests, "
     "prefix 2000, extend 200, GQA 4, plan window 64, run -1, page 1: 3984 slots written; 0.6.x R = 3584 "
     "(7168 rows, no spill), 0.7.2 R = 896 (1792 rows, spill). With a fresh 100-token request in front, that "
     "request is exact up to 0.6.18 and undefined from 0.7.2 (`tests/test_kernel_model.py`)."),
    ("b.6 fa3 softmax of fully masked rows (0.7.2+)",
     "hopper/attention_updater.cuh:117, 135, 204, 235 return 0 instead of NaN for a row with no visible key. A "
     "causal row always sees its own key, so the modelled cases never reach it."),
    ("b.7 Other differences, none model-relevant",
     "NVFP4 scale loads (0.6.12); split-D, VO-split, shared-K/V and FP8 repack paths for head_dim >= 512 or "
     "1-byte KV (0.6.14); separate K/V strides, `logits_transform` skipping `kv_idx >= chunk_end` (variant hooks "
     "only), NVFP4 forcing `disable_split_kv`, cute-dsl backends rejecting a run-time window (0.6.18); "
     "`SAME_KV_STRIDES` dispatch (0.7.2); an fp8-KV eagle-verify route that rejects `window_left >= 0` "
     "(0.7.2.post1). The non-causal sliding-window split-KV bug (flashinfer #4972, fix #4992 open) comes from "
     "the effective-kv formula above, unchanged in all seven; the model is causal-only."),
]


def cited(fact: Fact, version: str) -> str:
    """``file:line`` of ``fact`` in ``version``, or ``—`` where the version lacks it."""
    line = fact.lines[version]
    return "—" if line == "—" else f"{fact.file}:{line}"


def markdown() -> str:
    """docs/flashinfer_versions.md: the fact x version table, then the differences."""
    vs = FLASHINFER_VERSIONS
    out = ["# FlashInfer versions the kernel model covers", "",
           "Generated by `python -m swa_repro.kernel.sources > docs/flashinfer_versions.md` from "
           "`swa_repro/kernel/sources.py`; do not edit by hand.", "",
           "Modelled configurations: bf16/fp16 Q and KV, head_dim 64/128/256, no RoPE, causal, "
           "`enable_cuda_graph=False`. Paths: `inc/` = `flashinfer/data/include/flashinfer/`, "
           "`attn/` = `inc/attention/`, `py/` = `flashinfer/`. A number is the fact's line in "
           "that version's wheel (a range: the block compared).", "",
           "| fact | file | " + " | ".join(vs) + " | verdict |", "|---|---|" + "---|" * len(vs) + "---|"]
    for f in FACTS:
        out.append(f"| {f.what.replace('|', chr(92) + '|')} | `{f.file}` | "
                   + " | ".join(f.lines[v] for v in vs) + f" | {f.verdict} |")
    out += ["", FA3_NOTE, "", "## Differences", ""]
    for title, text in DIFFERENCES:
        out += [f"**{title}.** {text}", ""]
    return "\n".join(out)


def check(src_root) -> list[str]:
    """Cited line ranges in ``src_root/<version>/`` (unpacked wheels) that lack their fact's token."""
    bad = []
    for f in FACTS:
        rel = next(PREFIXES[p] + f.file[len(p):] for p in PREFIXES if f.file.startswith(p))
        for v, line in f.lines.items():
            path = Path(src_root) / v / rel
            if line == "—" or not f.token or not path.exists():
                continue
            first, _, last = line.split(",")[0].partition("-")  # "2110-2117" | "561" | "64, 88-89"
            first, last = int(first), int(last or first)
            text = "\n".join(path.read_text(errors="replace").splitlines()[first - 1:last])
            if f.token not in text:
                bad.append(f"{v} {f.file}:{line} lacks {f.token!r}: {text.strip()[:80]}")
    return bad


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        problems = check(sys.argv[2])
        print("\n".join(problems) or "every cited line holds its token")
        sys.exit(1 if problems else 0)
    sys.stdout.write(markdown() + "\n")
