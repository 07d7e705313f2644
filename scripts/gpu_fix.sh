#!/usr/bin/env bash
# One command on an air-gapped GPU machine (torch 2.11, nvcc, ninja; no network, no sglang): sglang's
# FlashInfer backend measured live as shipped and with `swa-repro patch --fix all` applied.
#   bash scripts/gpu_fix.sh [STEPS]   STEPS: all (default) = install,before,patch,after,kit,regress,alt; or a subset
# Bundles carried in .bundle/ (made here, with network; together with the repo under 64 MiB a call):
#   swa-repro bundle --flashinfer 0.7.2 --out .bundle/fi-0.7.2
#   swa-repro bundle --sglang 0.5.23 --out .bundle/sglang-0.5.23
# Two sites, so that nothing races: the shipped file is never touched.
# install: a fresh $SITE (/tmp/site-shipped) from the flashinfer bundle, then the sglang bundle (last:
#   its apache-tvm-ffi pin replaces the flashinfer bundle's); then $SITE_FIXED (/tmp/site-fixed) holding
#   a `cp -a` copy of its `sglang` package alone, put before $SITE on the path ($FIXED_PATH): both sites
#   run ONE flashinfer install. flashinfer 0.7.2 keeps no JIT module without building (jit/core.py:536-540:
#   ninja decides) and writes each module's build.ninja with the include dirs of the flashinfer it was
#   imported from (:511-530), so two installs at two paths sharing one JIT cache rebuild each other's
#   modules: on 2026-12-04 the shipped site's regression test rebuilt, for 490 s, the fa3 module the
#   fixed audit had just built, and the fixed one waited on its lock until both were stopped.
#   Each site is checked: sglang from it, flashinfer and the sgl_kernel stub from $SITE.
# before: swa-repro audit --mode live --json on $SITE (sglang as shipped) -> audit-live-before.json, in
#   the BACKGROUND: its JIT builds overlap the after audit's (flashinfer locks each module: one builds,
#   the other loads it).
# patch: swa-repro patch apply --fix all --in-place, then patch status --fix all, on $SITE_FIXED only;
#   the sha256 of the shipped file, the backup and the patched file, and their `diff -u` (fix.diff);
#   then the attention kit's side of the change on $SITE_FIXED's kit (python -m
#   swa_repro.sglang.fix.kit_edits: what docs/upstream/kit.diff does; an edit already there is left),
#   so that the kit step runs the kit's changed SWA case lists on the fixed file.
# after: the same live audit on $SITE_FIXED -> audit-live-after.json (foreground).
# alt: benchmarks/alt_cost.py on $SITE after the audits -> alt-cost.json: the ragged prefill our fix
#   keeps against the paged prefill of the simplest alternative (no ragged prefill for sliding-window
#   models), on the modules the fixed audit built.
# kit: swa-repro sglang-check --mode live --kit-only --json on $SITE_FIXED -> kit-after.json, in the
#   background from the patch on, niced (a failing or absent command is logged and sets the exit status).
# regress: $REGRESS_TEST (unittest in sglang's layout, test/registered/attention/unittests/swa/; it
#   needs the kit edits: the kit's logit_cap, SWA cases past the window, per-element DFlash window)
#   on $SITE_KIT (a fresh copy of $SITE's sglang with the kit edits, the shipped backend file;
#   expected to FAIL) and on $SITE_FIXED (its kit edited too, checked again; expected to PASS) ->
#   regress.log, both in the BACKGROUND from the patch on, beside the audits; FlashInfer's helper
#   modules that only the test uses (merge_state's cascade module, packbits' quantization:
#   swa_repro/kernel/jit_warm.py) start building right after the install. Absent test file: skipped.
# Why everything starts at once (measured on the H200, 2026-12-04): JIT dominates. The fixed audit
# needs 11 modules (fa2 and fa3 x window x cap, decode x cap, quantization); its warm-up builds them
# all at once (one thread per module signature: sglang/audit/live.py warm) in about 300 s on 16 cores.
# Run after the audits, the regression test met a serial chain instead: each test waits for its
# module, and the modules only it needs (cascade) were built last, alone: 126 s per site were not
# enough. Started beside the audit, it waits on the same locks and is done when they are.
# Timing plan (H200, 16 cores), BUDGET_S 575: install 30-60 s; then the audits, the regression test
#   and the helper builds together: each audit's timeout is min(AUDIT_BUDGET_S 470, time left -
#   RESERVE_S 45), its --live-budget that less AUDIT_MARGIN_S 60 (sglang's import and the driving come
#   before the live clock starts and the JSON after it); each regress run and the kit get the time
#   left less RESERVE_S; the last 10-45 s copy the files to $OUT.
# With a warm JIT (.fi_jit, .sgl_jit kept on a warm machine) the audits end in about a minute each.
# `install,patch,after,regress` was one cold call (2026-12-04) with the former bf16 regression test; the
# registered test runs on the kit's fp16 modules, as `kit` does (not yet timed on a GPU): if the cold
# call runs out of time, run `install,patch,after`, then `kit,regress` (they share their fp16 modules).
# steps.tsv: per step, when it started and ended (seconds from the script's start) and its exit status;
# gpu.txt carries it. A step the time left cannot hold is skipped and said so; the exit status is then 1.
# If $OUT is set (the device runner's return folder), at most 8 flat files land there: the log, gpu.txt,
# audit-live-before.json.xz, audit-live-after.json.xz, kit-after.json, regress.log, fix.diff,
# alt-cost.json (what the bundles installed: at the end of gpu.txt). Env: FI_VERSION (0.7.2), SGLANG_VERSION (0.5.23), PYTHON (python3), BUNDLE_DIR
# (.bundle), SITE, SITE_FIXED, SITE_KIT, ART (artifacts/gpu_fix), BUDGET_S, AUDIT_BUDGET_S, AUDIT_MARGIN_S,
# RESERVE_S, KILL_AFTER_S (15), MIN_LIVE_S (30), MIN_STEP_S (10), DRY_RUN=1: print each command instead of running it.
set -uo pipefail
STEPS="${1:-all}"
[ "$STEPS" = all ] && STEPS=install,before,patch,after,kit,regress,alt
FI_VERSION="${FI_VERSION:-0.7.2}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
BUDGET_S="${BUDGET_S:-575}"
AUDIT_BUDGET_S="${AUDIT_BUDGET_S:-470}"
AUDIT_MARGIN_S="${AUDIT_MARGIN_S:-60}"
RESERVE_S="${RESERVE_S:-45}"
KILL_AFTER_S="${KILL_AFTER_S:-15}"
MIN_LIVE_S="${MIN_LIVE_S:-30}"  # an audit whose --live-budget would be less is not started
MIN_STEP_S="${MIN_STEP_S:-10}"  # nor a kit or regress run given less
. "$(dirname "${BASH_SOURCE[0]}")/lib_gpu.sh"  # START, ROOT (the working directory), PY, BUNDLE_DIR, FI_BUNDLE; has, run, ...
SG_BUNDLE="$BUNDLE_DIR/sglang-$SGLANG_VERSION"
NB_BUNDLE=""  # no notebooks here
SITE="${SITE:-/tmp/site-shipped}"
SITE_FIXED="${SITE_FIXED:-/tmp/site-fixed}"
SITE_KIT="${SITE_KIT:-/tmp/site-shipped-kit}"  # regress shipped: $SITE's sglang, kit edited
ART="${ART:-artifacts/gpu_fix}"
FIXED_PATH="$SITE_FIXED:$SITE"  # the patched sglang first, everything else (flashinfer) from $SITE
REGRESS_TEST="docs/upstream/test/registered/attention/unittests/swa/test_flashinfer_plan_time_params.py"
KIT_CASES="tests/sglang_kit_flashinfer_cases.py"  # sglang's registered FlashInfer kit tests, re-expressed
BACKEND_REL="sglang/srt/layers/attention/flashinfer_backend.py"
mkdir -p "$ART"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOG="$ART/gpu_fix-$STAMP.log"
CMD_LOG="$ART/commands-$STAMP.txt"
: > "$CMD_LOG"
rm -f "$ART/audit-live-before.json" "$ART/audit-live-after.json" "$ART/kit-after.json" "$ART/regress.log" \
  "$ART/regress-shipped.log" "$ART/regress-fixed.log" "$ART/fix.diff" "$ART/jit-warm.json" "$ART/steps.tsv"

note() { [ -z "${CMD_LOG:-}" ] || echo "    $*" >> "$CMD_LOG"; }  # how the last command's output was kept
out_or_null() { if [ -n "${DRY_RUN:-}" ]; then echo /dev/null; else echo "$ART/$1"; fi; }
audit_timeout() {  # -> seconds for an audit's timeout, or nothing when too little is left
  local t=$(( $(left) - RESERVE_S ))
  [ "$t" -gt "$AUDIT_BUDGET_S" ] && t=$AUDIT_BUDGET_S
  [ $(( t - AUDIT_MARGIN_S )) -ge "$MIN_LIVE_S" ] && echo "$t"
}
jit_libs() { find "$ROOT/.fi_jit" -name '*.so' 2>/dev/null | wc -l; }
JIT_AT_START=$(jit_libs)
sha() { [ -f "$1" ] && sha256sum "$1" | cut -c1-64 || echo "(no file)"; }
live_audit() {  # PATH NAME TIMEOUT: swa-repro audit --mode live on PATH (sites) -> audit-live-NAME.json (.err)
  local t0; t0=$(elapsed)
  run env PYTHONPATH="$ROOT:$1" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$3" "$PY" -m swa_repro.cli \
    audit --mode live --json --live-budget $(( $3 - AUDIT_MARGIN_S )) \
    > "$(out_or_null "audit-live-$2.json")" 2> "$ART/audit-live-$2.err"
  local rc=$?; step "$2" "$t0" "$rc"; return "$rc"
}
regress_one() {  # WHICH PATH TIMEOUT: the upstream unittest on PATH (sites) -> regress-WHICH.log; sglang's own test: only the sites on its path
  local t0; t0=$(elapsed)
  # then sglang's own FlashInfer kit tests on the same sites ($KIT_CASES: its registered dense/swa
  # cases and the DFlash SWA chain, with the site's kit); the exit status is the first failure's
  run env PYTHONPATH="$2" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$3" bash -c \
    '"$0" "$1" -v; a=$?; "$0" "$2" -v; b=$?; [ "$a" -eq 0 ] && exit "$b"; exit "$a"' \
    "$PY" "$REGRESS_TEST" "$KIT_CASES" > "$ART/regress-$1.log" 2>&1
  local rc=$?; step "regress_$1" "$t0" "$rc"; return "$rc"
}
kit_edit() {  # SITE: the kit edits (docs/upstream/kit_*.diff) on SITE's sglang, in place
  run env PYTHONPATH="$ROOT" "$PY" -m swa_repro.sglang.fix.kit_edits --site "$1"
}
backend_of() {  # JSON -> the backend_file the audit read
  grep -o '"backend_file": *"[^"]*"' "$1" 2>/dev/null | head -n 1
}

{
  exec 3>&1; RUN_FD=3  # each command shown in the log, also those whose stderr goes to a file
  echo "== gpu_fix steps=$STEPS flashinfer=$FI_VERSION sglang=$SGLANG_VERSION shipped=$SITE fixed=$SITE_FIXED (budget ${BUDGET_S}s)"
  export FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit"   # flashinfer's JIT cache, kept between calls
  export SGLANG_JIT_CACHE_DIR="$ROOT/.sgl_jit"       # sglang's own (its store_cache kernel, tvm-ffi)
  mkdir -p "$FLASHINFER_WORKSPACE_BASE" "$SGLANG_JIT_CACHE_DIR"
  echo "== jit cache at start: $JIT_AT_START built libraries under $FLASHINFER_WORKSPACE_BASE (0: a cold call)"
  if has install; then
    T0=$(elapsed)
    install_bundles "$SITE" || exit 2
    run rm -rf "$SITE_FIXED" || exit 2
    run mkdir -p "$SITE_FIXED" || exit 2
    run cp -a "$SITE/sglang" "$SITE_FIXED/" || { echo "error: could not copy $SITE/sglang to $SITE_FIXED"; exit 2; }
    step install "$T0" 0
    echo "== install done after $(elapsed)s"
  fi
  if has regress && [ -f "$REGRESS_TEST" ]; then
    # the helper modules only the regression test uses, built from now on beside everything else
    echo "== jit: FlashInfer's helper modules (cascade, quantization), in the background > jit-warm.json"
    T_JIT=$(elapsed)
    { run env PYTHONPATH="$ROOT:$SITE" "$PY" -m swa_repro.kernel.jit_warm cascade quantization \
        > "$(out_or_null jit-warm.json)" 2> "$ART/jit-warm.err"; J=$?; step jit_helpers "$T_JIT" "$J"; exit "$J"; } &
    JIT_PID=$!
    note "(in the background; stdout > jit-warm.json, stderr > jit-warm.err)"
  fi
  echo "== check: $SITE and $SITE_FIXED"
  # both sites checked at once (each imports torch, flashinfer and sglang), printed in order
  verify_site "$SITE" > "$ART/verify-shipped.txt" 2>&1 & V_PID=$!
  verify_site "$SITE_FIXED" "$SITE" > "$ART/verify-fixed.txt" 2>&1; V2=$?
  wait "$V_PID"; V1=$?
  cat "$ART/verify-shipped.txt" "$ART/verify-fixed.txt"
  [ "$V1" -eq 0 ] && [ "$V2" -eq 0 ] || { echo "error: a site is not what its bundles install (above)"; exit 2; }
  RC=0
  SHIPPED_SHA=$(sha "$SITE/$BACKEND_REL")
  echo "== shipped $SITE/$BACKEND_REL sha256 $SHIPPED_SHA"
  if has before; then
    T=$(audit_timeout)
    if [ -z "$T" ]; then
      echo "== before: skipped, $(left)s left"; RC=1
    else
      echo "== before: audit --mode live on $SITE (shipped; background, timeout ${T}s) > audit-live-before.json"
      live_audit "$SITE" before "$T" &
      BEFORE_PID=$!
      note "(in the background; stdout > audit-live-before.json, stderr > audit-live-before.err)"
    fi
  fi
  FIXED_OK=1
  if has patch; then
    echo "== patch: on $SITE_FIXED only"
    T0=$(elapsed)
    [ -n "${DRY_RUN:-}" ] || [ "$(sha "$SITE_FIXED/$BACKEND_REL")" = "$SHIPPED_SHA" ] || {
      echo "error: $SITE_FIXED/$BACKEND_REL is not the shipped file before the patch (re-run with install)"; FIXED_OK=0; RC=1; }
    if [ "$FIXED_OK" = 1 ]; then
      run env PYTHONPATH="$ROOT:$FIXED_PATH" "$PY" -m swa_repro.cli patch apply --fix all --in-place
      P=$?; echo "== patch apply exit status $P"
      [ "$P" -ne 0 ] && { FIXED_OK=0; RC=1; }
    fi
    run env PYTHONPATH="$ROOT:$FIXED_PATH" "$PY" -m swa_repro.cli patch status --fix all
    S=$?; echo "== patch status exit status $S"
    if [ "$FIXED_OK" = 1 ]; then
      kit_edit "$SITE_FIXED"; KE=$?; echo "== kit edits on $SITE_FIXED: exit status $KE"
      [ "$KE" -ne 0 ] && RC=1
    fi
    step patch "$T0" "${P:-$S}"
    if [ -z "${DRY_RUN:-}" ]; then
      for f in "$SITE/$BACKEND_REL" "$SITE_FIXED/$BACKEND_REL"*; do echo "   sha256 $(sha "$f")  $f"; done
      [ "$(sha "$SITE/$BACKEND_REL")" = "$SHIPPED_SHA" ] || { echo "error: the shipped file changed"; RC=1; }
      [ "$(sha "$SITE_FIXED/$BACKEND_REL")" != "$SHIPPED_SHA" ] || { echo "error: $SITE_FIXED/$BACKEND_REL is unchanged"; FIXED_OK=0; RC=1; }
      diff -u "$SITE/$BACKEND_REL" "$SITE_FIXED/$BACKEND_REL" > "$ART/fix.diff"
      note "diff -u $SITE/$BACKEND_REL $SITE_FIXED/$BACKEND_REL > fix.diff"
      echo "== fix.diff: $(grep -c '^[-+][^-+]' "$ART/fix.diff") changed lines"; cat "$ART/fix.diff"
    fi
  fi
  # whatever ran, the fixed site must differ from the shipped one for what follows to mean anything
  if [ -z "${DRY_RUN:-}" ] && [ "$FIXED_OK" = 1 ] && [ "$(sha "$SITE_FIXED/$BACKEND_REL")" = "$SHIPPED_SHA" ]; then
    echo "== $SITE_FIXED/$BACKEND_REL is the shipped file: not patched (the patch step patches it)"; FIXED_OK=0
  fi
  declare -A REGRESS_PID=()
  if has regress; then
    if [ ! -f "$REGRESS_TEST" ]; then
      echo "== regress: skipped, no $REGRESS_TEST"
    else
      # the test runs on the kit it comes with: the shipped file beside an edited kit in $SITE_KIT
      # (never $SITE itself: the before audit reads it meanwhile), and $SITE_FIXED's kit edited
      echo "== regress: $SITE_KIT = $SITE's sglang with the kit edits; the kit edits on $SITE_FIXED"
      KIT_OK=1
      { run rm -rf "$SITE_KIT" && run mkdir -p "$SITE_KIT" && run cp -a "$SITE/sglang" "$SITE_KIT/" \
          && kit_edit "$SITE_KIT"; } || { echo "error: could not make $SITE_KIT"; KIT_OK=0; RC=1; }
      [ -n "${DRY_RUN:-}" ] || [ "$KIT_OK" != 1 ] || [ "$(sha "$SITE_KIT/$BACKEND_REL")" = "$SHIPPED_SHA" ] || {
        echo "error: $SITE_KIT/$BACKEND_REL is not the shipped file"; KIT_OK=0; RC=1; }
      FIXED_KIT_OK=1
      if [ "$FIXED_OK" = 1 ]; then kit_edit "$SITE_FIXED" || { FIXED_KIT_OK=0; RC=1; }; fi
      for which in shipped fixed; do
        site="$SITE_KIT:$SITE"; want=FAIL
        [ "$which" = fixed ] && { site=$FIXED_PATH; want=PASS; }
        T=$(( $(left) - RESERVE_S ))
        if [ "$which" = fixed ] && [ "$FIXED_OK" != 1 ]; then
          echo "== regress $which: skipped, $SITE_FIXED is not patched"; RC=1; continue
        elif [ "$which" = fixed ] && [ "$FIXED_KIT_OK" != 1 ]; then
          echo "== regress $which: skipped, $SITE_FIXED's kit is not edited"; continue
        elif [ "$which" = shipped ] && [ "$KIT_OK" != 1 ]; then
          echo "== regress $which: skipped, no $SITE_KIT"; continue
        elif [ "$T" -lt "$MIN_STEP_S" ]; then
          echo "== regress $which: skipped, $(left)s left"; RC=1; continue
        fi
        echo "== regress $which: $REGRESS_TEST on $site (expected to $want; background, timeout ${T}s) > regress-$which.log"
        regress_one "$which" "$site" "$T" &
        REGRESS_PID[$which]=$!
        note "(in the background; stdout and stderr > regress-$which.log, joined into regress.log)"
      done
    fi
  fi
  if has kit; then
    # in the background from here, niced: its fp16 modules (the kit's dtype) build on what the
    # audits' bf16 builds leave of the 16 cores, and it ends with the time left less the copy
    T=$(( $(left) - RESERVE_S ))
    if [ "$FIXED_OK" != 1 ]; then
      echo "== kit: skipped, $SITE_FIXED is not patched"; RC=1
    elif [ "$T" -lt "$MIN_STEP_S" ]; then
      echo "== kit: skipped, $(left)s left"; RC=1
    else
      echo "== kit: sglang-check --mode live --kit-only on $SITE_FIXED (background, niced; timeout ${T}s) > kit-after.json"
      T_KIT=$(elapsed)
      run env PYTHONPATH="$ROOT:$FIXED_PATH" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$T" nice -n 10 "$PY" \
        -m swa_repro.cli sglang-check --mode live --kit-only --json > "$(out_or_null kit-after.json)" \
        2> "$ART/kit-after.err" &
      KIT_PID=$!
      note "(in the background, niced; stdout > kit-after.json, stderr > kit-after.err)"
    fi
  fi
  if has after; then
    T=$(audit_timeout)
    if [ "$FIXED_OK" != 1 ]; then
      echo "== after: skipped, $SITE_FIXED is not patched"; RC=1
    elif [ -z "$T" ]; then
      echo "== after: skipped, $(left)s left"; RC=1
    else
      echo "== after: audit --mode live on $SITE_FIXED (patched; timeout ${T}s) > audit-live-after.json"
      live_audit "$FIXED_PATH" after "$T"
      A=$?; note "(stdout > audit-live-after.json, stderr > audit-live-after.err)"
      echo "== after: exit status $A after $(elapsed)s $(backend_of "$ART/audit-live-after.json")"
      tail -n 30 "$ART/audit-live-after.err"; [ "$A" -ne 0 ] && RC=$A
    fi
  fi
  if has alt; then
    # after the fixed audit: its bf16 hd64 fa3-ragged / fa2-paged modules are the ones this times
    T=$(( $(left) - RESERVE_S ))
    if [ "$T" -lt "$MIN_STEP_S" ]; then
      echo "== alt: skipped, $(left)s left"; RC=1
    else
      echo "== alt: benchmarks/alt_cost.py (ours against alt_paged_for_swa; timeout ${T}s) > alt-cost.json"
      T0=$(elapsed)
      run env PYTHONPATH="$ROOT:$SITE" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$T" "$PY" \
        benchmarks/alt_cost.py --out "$(out_or_null alt-cost.json)" 2> "$ART/alt-cost.err"
      AL=$?; step alt "$T0" "$AL"; note "(stdout shown; stderr > alt-cost.err)"
      echo "== alt: exit status $AL"; tail -n 5 "$ART/alt-cost.err"; [ "$AL" -ne 0 ] && RC=$AL
    fi
  fi
  if [ -n "${BEFORE_PID:-}" ]; then
    wait "$BEFORE_PID"; B=$?
    echo "== before: exit status $B after $(elapsed)s $(backend_of "$ART/audit-live-before.json")"
    tail -n 30 "$ART/audit-live-before.err"; [ "$B" -ne 0 ] && RC=$B
  fi
  if [ -n "${KIT_PID:-}" ]; then
    wait "$KIT_PID"; K=$?; step kit "$T_KIT" "$K"
    echo "== kit: exit status $K after $(elapsed)s"; tail -n 20 "$ART/kit-after.err"; [ "$K" -ne 0 ] && RC=$K
  fi
  for which in shipped fixed; do
    [ -n "${REGRESS_PID[$which]:-}" ] || continue
    wait "${REGRESS_PID[$which]}"; G=$?
    want=FAIL; [ "$which" = fixed ] && want=PASS
    { echo "== regress $which on $([ "$which" = fixed ] && echo "$FIXED_PATH" || echo "$SITE_KIT:$SITE") (expected to $want)"
      cat "$ART/regress-$which.log" 2>/dev/null; } >> "$ART/regress.log"
    [ -n "${DRY_RUN:-}" ] && continue
    tail -n 5 "$ART/regress-$which.log"
    if [ "$G" -eq 0 ]; then got=PASS; elif [ "$G" -eq 1 ]; then got=FAIL; else got="ERROR (exit status $G)"; fi
    if [ "$got" = "$want" ]; then verdict="as expected"; else verdict="NOT as expected"; RC=1; fi
    echo "== regress $which: $got, $verdict, after $(elapsed)s" | tee -a "$ART/regress.log"
  done
  if [ -n "${JIT_PID:-}" ]; then
    wait "$JIT_PID"; J=$?
    echo "== jit: exit status $J: $(cat "$ART/jit-warm.json" 2>/dev/null)"  # not fatal: whoever needs one builds it
  fi
  steps_done "$RC"
  exit "$RC"
} 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ] && [ -z "${DRY_RUN:-}" ]; then
  # the device returns at most 8 files (16 MiB each): these, flat
  {
    machine_lines
    echo "steps: $STEPS; flashinfer $FI_VERSION, sglang $SGLANG_VERSION; shipped $SITE, fixed $SITE_FIXED; exit status $RC"
    echo "jit cache at start: $JIT_AT_START built libraries (0: a cold call); at the end: $(jit_libs)"
    steps_lines
    echo "commands, in the order started (file names: under $ART, returned flat):"
    cat "$CMD_LOG"
    echo "ls $SITE (what the bundles installed):"; ls "$SITE" 2>&1
  } > "$OUT/gpu.txt" 2>&1
  cp "$LOG" "$OUT/"
  for j in audit-live-before.json audit-live-after.json; do
    [ -f "$ART/$j" ] && xz -9 -c "$ART/$j" > "$OUT/$j.xz"
  done
  for f in kit-after.json regress.log fix.diff alt-cost.json; do [ -f "$ART/$f" ] && cp "$ART/$f" "$OUT/"; done
  for f in "$OUT"/*; do  # over the per-file limit it would not come back: keep its head and say so
    if [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt $((16 * 2**20)) ]; then
      echo "$(basename "$f") over 16 MiB ($(stat -c %s "$f") bytes), dropped" >> "$OUT/$(basename "$LOG")"; rm "$f"
    fi
  done
fi
exit "$RC"
