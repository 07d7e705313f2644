#!/usr/bin/env bash
# One GPU call for #40: sglang's own attention-kit SWA tests for every backend the kit registers for SWA,
# eager and CUDA graph, on 0.5.23 as shipped and with `swa-repro patch --fix all`, plus the registered
# regression test; then, if time is left, the cost benchmark.
#   bash scripts/gpu_kit.sh [STEPS]   STEPS: all (default) = install,patch,jit,triton,kit,regress,bench; or a subset
# Bundles carried in .bundle/ (as scripts/gpu_fix.sh): fi-0.7.2 and sglang-0.5.23.
# install: a fresh $SITE from the bundles; the sgl_kernel stub refreshed from this checkout
#   (swa_repro/evidence/stubs: it answers Triton's sgl_kernel.utils.is_arch_support_pdl(), which a bundle
#   made before #40 refuses); three copies of its `sglang` package, each put before $SITE on the path, all
#   on $SITE's ONE flashinfer (two flashinfer paths rebuild each other's JIT modules: gpu_fix.sh's notes):
#   $SITE_KIT (shipped backend), $SITE_FIXED (patched), $SITE_TRI (shipped, Triton's kit follow-up).
# patch: `swa-repro patch apply --fix all --in-place` on $SITE_FIXED; the kit edits (kit.diff:
#   kit_edits ORDER) on $SITE_KIT and $SITE_FIXED, and with kit_tree_verify_triton on $SITE_TRI.
# jit: FlashInfer's modules the FlashInfer runs need (swa_repro/kernel/jit_warm.py `kit`: fp16, head dim
#   64, int32 indices; fa2 and fa3 prefill x window x cap, decode x cap, cascade, quantization), all at
#   once, up front, at most JIT_BUDGET_S; a module not done by then is built by whoever asks for it.
# triton: tests/sglang_kit_swa_cases.py with SWA_KIT_BACKEND=triton, niced, in the background from the
#   jit step on (Triton compiles its own kernels, no FlashInfer module): shipped (expected PASS: the kit
#   keeps Triton's index rule, TREE_WINDOW_BY_INDEX), then fixed (PASS: nothing of Triton's is patched)
#   and depth (the Triton follow-up kit: expected FAIL, the tree cases: Triton's own finding) side by side.
# kit: the same file with SWA_KIT_BACKEND=flashinfer on $SITE_KIT (expected FAIL: the cases past the
#   window, DFlash, EAGLE verify past the window eager and CUDA graph) and $SITE_FIXED (expected PASS),
#   side by side, after the jit step.
# regress: $REGRESS_TEST on the same two sites (shipped FAIL, fixed PASS), beside the kit runs.
# fa3: not run, said so: sglang's FA3 backend needs sgl_kernel's compiled flash-attention ops
#   (sgl_kernel.flash_attn, merge_state_v2), which the bundle's stub cannot carry (the sglang-kernel wheel
#   is ~587 MiB; a call carries 64 MiB).
# bench: optional, after everything else: `benchmarks/fix_cost.py --out $ART/fix-cost.json` if the file
#   exists and BENCH_MIN_S are left (its timeout: the time left less RESERVE_S); else skipped, said so.
# Timing plan (H100, 16 cores, cold JIT, BUDGET_S 575): install 10-20 s, patch 5 s; jit up to
#   JIT_BUDGET_S 300 (12 modules at once: the bf16 audit's 11 took ~300 s on the H200, 2026-12-04) with
#   the Triton runs beside it; then the kit and regress runs, each with the time left less RESERVE_S
#   (45: the copy to $OUT); bench only with BENCH_MIN_S (60) left after them.
# Each run's section in its log is headed `== <name> <site> on <path> (expected to PASS|FAIL)` and ends
# `== <name> <site>: PASS|FAIL|ERROR, as expected|NOT as expected` (swa_repro/sglang/fix/kit_live.py
# reads them). steps.tsv: per step its start, end (seconds from the start) and exit status, in gpu.txt.
# A step the time left cannot hold is skipped and said so; the exit status is then 1.
# $OUT (the device runner's return folder) gets at most 8 flat files: gpu.txt, the log, kit-flashinfer.log,
# kit-triton.log, regress.log, jit-warm.json, fix-cost.json. DRY_RUN=1 prints each command instead.
# Env: FI_VERSION (0.7.2), SGLANG_VERSION (0.5.23), PYTHON, BUNDLE_DIR, SITE, SITE_KIT, SITE_FIXED,
# SITE_TRI, ART (artifacts/gpu_kit), BUDGET_S, JIT_BUDGET_S, RESERVE_S, BENCH_MIN_S, MIN_STEP_S (10),
# KILL_AFTER_S (15).
set -uo pipefail
STEPS="${1:-all}"
[ "$STEPS" = all ] && STEPS=install,patch,jit,triton,kit,regress,bench
FI_VERSION="${FI_VERSION:-0.7.2}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
BUDGET_S="${BUDGET_S:-575}"
JIT_BUDGET_S="${JIT_BUDGET_S:-300}"
RESERVE_S="${RESERVE_S:-45}"
BENCH_MIN_S="${BENCH_MIN_S:-60}"
MIN_STEP_S="${MIN_STEP_S:-10}"
KILL_AFTER_S="${KILL_AFTER_S:-15}"
. "$(dirname "${BASH_SOURCE[0]}")/lib_gpu.sh"  # START, ROOT (the working directory), PY, BUNDLE_DIR, FI_BUNDLE; has, run, ...
SG_BUNDLE="$BUNDLE_DIR/sglang-$SGLANG_VERSION"
NB_BUNDLE=""
SITE="${SITE:-/tmp/site-shipped}"
SITE_KIT="${SITE_KIT:-/tmp/site-shipped-kit}"
SITE_FIXED="${SITE_FIXED:-/tmp/site-fixed}"
SITE_TRI="${SITE_TRI:-/tmp/site-triton-depth}"
ART="${ART:-artifacts/gpu_kit}"
REGRESS_TEST="docs/upstream/test/registered/attention/unittests/swa/test_flashinfer_plan_time_params.py"
KIT_CASES="tests/sglang_kit_swa_cases.py"
BENCH="benchmarks/fix_cost.py"
BACKEND_REL="sglang/srt/layers/attention/flashinfer_backend.py"
FA3_WHY="sglang's FA3 backend needs sgl_kernel's compiled flash-attention ops (sgl_kernel.flash_attn, merge_state_v2), which the bundle's sgl_kernel stub cannot carry (the sglang-kernel wheel is ~587 MiB; a call carries 64 MiB)"
mkdir -p "$ART"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOG="$ART/gpu_kit-$STAMP.log"
CMD_LOG="$ART/commands-$STAMP.txt"
: > "$CMD_LOG"
rm -f "$ART"/kit-*.log "$ART"/regress*.log "$ART/jit-warm.json" "$ART/fix-cost.json" "$ART/steps.tsv"

path_of() { echo "$1:$SITE"; }  # a copy's sglang first, flashinfer and the stub from $SITE
sha() { [ -f "$1" ] && sha256sum "$1" | cut -c1-64 || echo "(no file)"; }
tleft() { echo $(( $(left) - RESERVE_S )); }
# NAME SITE PATH WANT BACKEND TIMEOUT FILE...: one unittest run -> $ART/<NAME>-<SITE>.log, headed and judged
kit_run() {
  local name=$1 which=$2 path=$3 want=$4 backend=$5 t=$6; shift 6
  local f="$ART/$name-$which.log" t0; t0=$(elapsed)
  echo "== $name $which on $path (expected to $want)" > "$f"
  run env PYTHONPATH="$path" SWA_KIT_BACKEND="$backend" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$t" \
    nice -n "${RUN_NICE:-0}" bash -c 'rc=0; for t in "$@"; do "$0" "$t" -v || { r=$?; [ "$rc" -eq 0 ] && rc=$r; }; done; exit "$rc"' \
    "$PY" "$@" >> "$f" 2>&1
  local rc=$? got
  if [ -n "${DRY_RUN:-}" ]; then echo "== $name $which: (dry run, not judged)" >> "$f"; step "${name}_$which" "$t0" 0; return 0; fi
  if [ "$rc" -eq 0 ]; then got=PASS; elif [ "$rc" -eq 1 ]; then got=FAIL; else got="ERROR (exit status $rc)"; fi
  local verdict="as expected"; [ "$got" = "$want" ] || verdict="NOT as expected"
  echo "== $name $which: $got, $verdict, after $(elapsed)s" >> "$f"
  step "${name}_$which" "$t0" "$rc"
  [ "$got" = "$want" ]
}
# NAME SITE PATH WANT BACKEND FILE...: kit_run in the background if the time left holds it; its pid in PIDS
declare -A PIDS=()
start_run() {
  local t; t=$(tleft)
  if [ "$t" -lt "$MIN_STEP_S" ]; then echo "== $1 $2: skipped, $(left)s left"; SKIPPED=1; return 1; fi
  echo "== $1 $2: $5 on $3 (expected to $4; background, timeout ${t}s) > $1-$2.log"
  local name=$1 which=$2 path=$3 want=$4 backend=$5; shift 5
  kit_run "$name" "$which" "$path" "$want" "$backend" "$t" "$@" &
  PIDS["$name-$which"]=$!
  note "(in the background; stdout and stderr > $name-$which.log)"
}
note() { echo "    $*" >> "$CMD_LOG"; }
join_runs() {  # NAME SITE...: wait for each run, append its log to $ART/NAME.log; RC=1 on one not as expected
  local name=$1 which; shift
  for which in "$@"; do
    [ -n "${PIDS[$name-$which]:-}" ] || continue
    wait "${PIDS[$name-$which]}" || RC=1
    cat "$ART/$name-$which.log" >> "$ART/$name.log" 2>/dev/null
    tail -n 1 "$ART/$name-$which.log" 2>/dev/null
  done
}

{
  exec 3>&1; RUN_FD=3
  echo "== gpu_kit steps=$STEPS flashinfer=$FI_VERSION sglang=$SGLANG_VERSION (budget ${BUDGET_S}s, jit ${JIT_BUDGET_S}s)"
  export FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit" SGLANG_JIT_CACHE_DIR="$ROOT/.sgl_jit" TRITON_CACHE_DIR="$ROOT/.triton"
  mkdir -p "$FLASHINFER_WORKSPACE_BASE" "$SGLANG_JIT_CACHE_DIR" "$TRITON_CACHE_DIR"
  echo "== jit cache at start: $(find "$FLASHINFER_WORKSPACE_BASE" -name '*.so' 2>/dev/null | wc -l) FlashInfer libraries (0: cold)"
  RC=0; SKIPPED=0
  echo "== fa3: skipped: $FA3_WHY"
  if has install; then
    T0=$(elapsed)
    install_bundles "$SITE" || exit 2
    run cp "$ROOT/swa_repro/evidence/stubs/sgl_kernel/__init__.py" "$SITE/sgl_kernel/__init__.py" || exit 2
    for s in "$SITE_KIT" "$SITE_FIXED" "$SITE_TRI"; do
      { run rm -rf "$s" && run mkdir -p "$s" && run cp -a "$SITE/sglang" "$s/"; } || { echo "error: could not make $s"; exit 2; }
    done
    step install "$T0" 0
  fi
  verify_site "$SITE_KIT" "$SITE" || { echo "error: $SITE_KIT is not what the bundles install"; exit 2; }
  SHIPPED_SHA=$(sha "$SITE/$BACKEND_REL")
  if has patch; then
    T0=$(elapsed)
    run env PYTHONPATH="$ROOT:$(path_of "$SITE_FIXED")" "$PY" -m swa_repro.cli patch apply --fix all --in-place || RC=1
    for s in "$SITE_KIT" "$SITE_FIXED"; do
      run env PYTHONPATH="$ROOT" "$PY" -m swa_repro.sglang.fix.kit_edits --site "$s" || RC=1
    done
    run env PYTHONPATH="$ROOT" "$PY" -m swa_repro.sglang.fix.kit_edits --site "$SITE_TRI" \
      --names kit_swa_cases,kit_logit_cap,kit_dflash_swa_verify,kit_tree_verify_window,kit_tree_verify_triton || RC=1
    step patch "$T0" "$RC"
  fi
  if [ -z "${DRY_RUN:-}" ] && [ "$(sha "$SITE_FIXED/$BACKEND_REL")" = "$SHIPPED_SHA" ]; then
    echo "error: $SITE_FIXED/$BACKEND_REL is the shipped file: the fixed runs would prove nothing"; exit 2
  fi
  if has jit; then
    T0=$(elapsed); T=$JIT_BUDGET_S; [ "$T" -gt "$(tleft)" ] && T=$(tleft)
    echo "== jit: jit_warm kit (all at once, timeout ${T}s) > jit-warm.json, in the background"
    { run env PYTHONPATH="$ROOT:$SITE" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$T" "$PY" \
        -m swa_repro.kernel.jit_warm kit > "$ART/jit-warm.json" 2> "$ART/jit-warm.err"; J=$?; step jit "$T0" "$J"; exit "$J"; } &
    JIT_PID=$!
    note "(in the background; stdout > jit-warm.json, stderr > jit-warm.err)"
  fi
  if has triton; then
    # shipped first (it compiles Triton's kernels into $TRITON_CACHE_DIR), then fixed and depth side by side
    { RUN_NICE=10  # beside the JIT builds: FlashInfer's modules first (the FlashInfer runs wait on them)
      start_run kit-triton shipped "$(path_of "$SITE_KIT")" PASS triton "$KIT_CASES" \
        && wait "${PIDS[kit-triton-shipped]}"
      start_run kit-triton fixed "$(path_of "$SITE_FIXED")" PASS triton "$KIT_CASES"
      start_run kit-triton depth "$(path_of "$SITE_TRI")" FAIL triton "$KIT_CASES"
      wait; } > "$ART/triton-chain.txt" 2>&1 &
    TRITON_PID=$!
  fi
  if [ -n "${JIT_PID:-}" ]; then
    wait "$JIT_PID" || echo "== jit: not every module built (jit-warm.json): whoever needs one builds it"
    echo "== jit: $(cat "$ART/jit-warm.json" 2>/dev/null) after $(elapsed)s"
  fi
  if has kit; then
    start_run kit-flashinfer shipped "$(path_of "$SITE_KIT")" FAIL flashinfer "$KIT_CASES"
    start_run kit-flashinfer fixed "$(path_of "$SITE_FIXED")" PASS flashinfer "$KIT_CASES"
  fi
  if has regress; then
    start_run regress shipped "$(path_of "$SITE_KIT")" FAIL flashinfer "$REGRESS_TEST"
    start_run regress fixed "$(path_of "$SITE_FIXED")" PASS flashinfer "$REGRESS_TEST"
  fi
  if [ -n "${TRITON_PID:-}" ]; then
    wait "$TRITON_PID"; cat "$ART/triton-chain.txt"
    for which in shipped fixed depth; do
      [ -f "$ART/kit-triton-$which.log" ] || { echo "== kit-triton $which: not run"; RC=1; continue; }
      cat "$ART/kit-triton-$which.log" >> "$ART/kit-triton.log"; tail -n 1 "$ART/kit-triton-$which.log"
      [ -n "${DRY_RUN:-}" ] || tail -n 1 "$ART/kit-triton-$which.log" | grep -q ", as expected," || RC=1
    done
  fi
  join_runs kit-flashinfer shipped fixed
  join_runs regress shipped fixed
  if has bench; then
    T=$(tleft)
    if [ ! -f "$BENCH" ]; then
      echo "== bench: skipped, no $BENCH in this checkout"
    elif [ "$T" -lt "$BENCH_MIN_S" ]; then
      echo "== bench: skipped, $(left)s left (it needs BENCH_MIN_S=$BENCH_MIN_S beside the reserve)"; SKIPPED=1
    else
      echo "== bench: $BENCH (timeout ${T}s) > fix-cost.json"
      T0=$(elapsed)
      run env PYTHONPATH="$ROOT:$SITE" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$T" "$PY" "$BENCH" \
        --out "$ART/fix-cost.json" 2> "$ART/fix-cost.err"
      B=$?; step bench "$T0" "$B"; tail -n 5 "$ART/fix-cost.err" 2>/dev/null; [ "$B" -ne 0 ] && RC=1
    fi
  fi
  [ "$SKIPPED" = 1 ] && RC=1
  steps_done "$RC"
  exit "$RC"
} 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ] && [ -z "${DRY_RUN:-}" ]; then
  {
    machine_lines
    echo "steps: $STEPS; flashinfer $FI_VERSION, sglang $SGLANG_VERSION; sites $SITE_KIT $SITE_FIXED $SITE_TRI on $SITE; exit status $RC"
    echo "fa3: skipped: $FA3_WHY"
    steps_lines
    echo "commands, in the order started (file names: under $ART, returned flat):"; cat "$CMD_LOG"
  } > "$OUT/gpu.txt" 2>&1
  cp "$LOG" "$OUT/"
  for f in kit-flashinfer.log kit-triton.log regress.log jit-warm.json fix-cost.json; do
    [ -f "$ART/$f" ] && cp "$ART/$f" "$OUT/"
  done
fi
exit "$RC"
