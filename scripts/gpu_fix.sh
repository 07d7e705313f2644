#!/usr/bin/env bash
# One command on an air-gapped GPU machine (torch 2.11, nvcc, ninja; no network, no sglang): sglang's
# FlashInfer backend measured live as shipped and with `swa-repro patch --fix all` applied.
#   bash scripts/gpu_fix.sh [STEPS]   STEPS: all (default) = install,before,patch,after,kit,regress; or a subset
# Bundles carried in .bundle/ (made here, with network; together with the repo under 64 MiB a call):
#   swa-repro bundle --flashinfer 0.7.2 --out .bundle/fi-0.7.2
#   swa-repro bundle --sglang 0.5.23 --out .bundle/sglang-0.5.23
# Two sites, so that nothing races: the shipped file is never touched.
# install: a fresh $SITE (/tmp/site-shipped) from the flashinfer bundle, then the sglang bundle (last:
#   its apache-tvm-ffi pin replaces the flashinfer bundle's); then $SITE_FIXED (/tmp/site-fixed) as a
#   `cp -a` copy of it. Each site is checked: flashinfer, sglang and the sgl_kernel stub come from it.
# before: swa-repro audit --mode live --json on $SITE (sglang as shipped) -> audit-live-before.json, in
#   the BACKGROUND: its JIT builds overlap the after audit's (flashinfer locks each module: one builds,
#   the other loads it).
# patch: swa-repro patch apply --fix all --in-place, then patch status --fix all, on $SITE_FIXED only;
#   the sha256 of the shipped file, the backup and the patched file, and their `diff -u` (fix.diff).
# after: the same live audit on $SITE_FIXED -> audit-live-after.json (foreground).
# kit: swa-repro sglang-check --mode live --kit-only --json on $SITE_FIXED -> kit-after.json, in the
#   background from the patch on, niced (a failing or absent command is logged and sets the exit status).
# regress: docs/upstream/test_flashinfer_plan_time_params.py (unittest, sglang's own test of the fix) on
#   $SITE (expected to FAIL) and on $SITE_FIXED (expected to PASS) -> regress.log; absent file: skipped.
# Timing plan (H200, 16 cores; measured: install 30-60 s; a live audit of 0.5.15.post1 49 s with warm
# JIT; cold JIT of the fa2 modules 90-200 s, fa2+fa3 at one head dim 237 s), BUDGET_S 575:
#   0-60 s    install (both sites: the second is a cp -a)
#   60-530 s  before (background) and patch + after (foreground), concurrently: each audit's timeout is
#             min(AUDIT_BUDGET_S 470, time left - RESERVE_S 45), its --live-budget that less
#             AUDIT_MARGIN_S 60 (sglang's import and the driving come before the live clock starts and
#             the JSON after it): --live-budget ~410 s, which covers a cold JIT (~240 s) twice over
#   530-565 s regress (shipped, fixed): each gets a share of what is left less COPY_S 10; the kit
#             runs niced in the background from the patch on, until the time left less RESERVE_S
#   565-575 s the files to $OUT
# With a warm JIT (.fi_jit, .sgl_jit kept on a warm machine) the audits end in about a minute each.
# Measured cold on 2026-12-04 (recordings/sglang-live/fix-0.5.23/README.md): all steps at once do not
# fit: the shipped audit's 9 modules built in 239-360 s while the fixed audit's and the kit's built
# beside them, and the fixed audit hit its timeout. The shipped audit is recorded; run
# `install,patch,after,regress` in one call and `kit` in the next, on the warm machine.
# A step the time left cannot hold is skipped and said so; the exit status is then 1.
# If $OUT is set (the device runner's return folder), at most 8 flat files land there: the log, gpu.txt,
# audit-live-before.json.xz, audit-live-after.json.xz, kit-after.json, regress.log, fix.diff,
# site-listing.txt. Env: FI_VERSION (0.7.2), SGLANG_VERSION (0.5.23), PYTHON (python3), BUNDLE_DIR
# (.bundle), SITE, SITE_FIXED, ART (artifacts/gpu_fix), BUDGET_S, AUDIT_BUDGET_S, AUDIT_MARGIN_S,
# RESERVE_S, COPY_S, KILL_AFTER_S (15), MIN_LIVE_S (30), MIN_STEP_S (10), DRY_RUN=1: print each command instead of running it.
set -uo pipefail
STEPS="${1:-all}"
[ "$STEPS" = all ] && STEPS=install,before,patch,after,kit,regress
FI_VERSION="${FI_VERSION:-0.7.2}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
BUDGET_S="${BUDGET_S:-575}"
AUDIT_BUDGET_S="${AUDIT_BUDGET_S:-470}"
AUDIT_MARGIN_S="${AUDIT_MARGIN_S:-60}"
RESERVE_S="${RESERVE_S:-45}"
COPY_S="${COPY_S:-10}"
KILL_AFTER_S="${KILL_AFTER_S:-15}"
MIN_LIVE_S="${MIN_LIVE_S:-30}"  # an audit whose --live-budget would be less is not started
MIN_STEP_S="${MIN_STEP_S:-10}"  # nor a kit or regress run given less
START=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
BUNDLE_DIR="${BUNDLE_DIR:-$ROOT/.bundle}"
FI_BUNDLE="$BUNDLE_DIR/fi-$FI_VERSION"
SG_BUNDLE="$BUNDLE_DIR/sglang-$SGLANG_VERSION"
NB_BUNDLE=""  # no notebooks here
SITE="${SITE:-/tmp/site-shipped}"
SITE_FIXED="${SITE_FIXED:-/tmp/site-fixed}"
ART="${ART:-artifacts/gpu_fix}"
REGRESS_TEST="docs/upstream/test_flashinfer_plan_time_params.py"
BACKEND_REL="sglang/srt/layers/attention/flashinfer_backend.py"
mkdir -p "$ART"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOG="$ART/gpu_fix-$STAMP.log"
CMD_LOG="$ART/commands-$STAMP.txt"
: > "$CMD_LOG"
rm -f "$ART/audit-live-before.json" "$ART/audit-live-after.json" "$ART/kit-after.json" "$ART/regress.log" "$ART/fix.diff"

# has, run (also appends to $CMD_LOG), left, install_bundles, verify_site
. "$ROOT/scripts/lib_gpu.sh"

note() { [ -z "${CMD_LOG:-}" ] || echo "    $*" >> "$CMD_LOG"; }  # how the last command's output was kept
out_or_null() { if [ -n "${DRY_RUN:-}" ]; then echo /dev/null; else echo "$ART/$1"; fi; }
elapsed() { echo $(( $(date +%s) - START )); }
audit_timeout() {  # -> seconds for an audit's timeout, or nothing when too little is left
  local t=$(( $(left) - RESERVE_S ))
  [ "$t" -gt "$AUDIT_BUDGET_S" ] && t=$AUDIT_BUDGET_S
  [ $(( t - AUDIT_MARGIN_S )) -ge "$MIN_LIVE_S" ] && echo "$t"
}
share() {  # N -> 1/N of the time left less COPY_S
  echo $(( ($(left) - COPY_S) / $1 ))
}
sha() { [ -f "$1" ] && sha256sum "$1" | cut -c1-64 || echo "(no file)"; }
live_audit() {  # SITE NAME TIMEOUT: swa-repro audit --mode live on SITE -> audit-live-NAME.json (.err)
  run env PYTHONPATH="$ROOT:$1" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$3" "$PY" -m swa_repro.cli \
    audit --mode live --json --live-budget $(( $3 - AUDIT_MARGIN_S )) \
    > "$(out_or_null "audit-live-$2.json")" 2> "$ART/audit-live-$2.err"
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
  if has install; then
    install_bundles "$SITE" || exit 2
    run rm -rf "$SITE_FIXED" || exit 2
    run cp -a "$SITE" "$SITE_FIXED" || { echo "error: could not copy $SITE to $SITE_FIXED"; exit 2; }
    echo "== install done after $(elapsed)s"
  fi
  echo "== check: $SITE and $SITE_FIXED"
  # both sites checked at once (each imports torch, flashinfer and sglang), printed in order
  verify_site "$SITE" > "$ART/verify-shipped.txt" 2>&1 & V_PID=$!
  verify_site "$SITE_FIXED" > "$ART/verify-fixed.txt" 2>&1; V2=$?
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
    [ -n "${DRY_RUN:-}" ] || [ "$(sha "$SITE_FIXED/$BACKEND_REL")" = "$SHIPPED_SHA" ] || {
      echo "error: $SITE_FIXED/$BACKEND_REL is not the shipped file before the patch (re-run with install)"; FIXED_OK=0; RC=1; }
    if [ "$FIXED_OK" = 1 ]; then
      run env PYTHONPATH="$ROOT:$SITE_FIXED" "$PY" -m swa_repro.cli patch apply --fix all --in-place
      P=$?; echo "== patch apply exit status $P"
      [ "$P" -ne 0 ] && { FIXED_OK=0; RC=1; }
    fi
    run env PYTHONPATH="$ROOT:$SITE_FIXED" "$PY" -m swa_repro.cli patch status --fix all
    S=$?; echo "== patch status exit status $S"
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
  if has kit; then
    # in the background from here, niced: its fp16 modules (the kit's dtype) build on what the two
    # audits' bf16 builds leave of the 16 cores, and it ends with the time left less the copy
    T=$(( $(left) - RESERVE_S ))
    if [ "$FIXED_OK" != 1 ]; then
      echo "== kit: skipped, $SITE_FIXED is not patched"; RC=1
    elif [ "$T" -lt "$MIN_STEP_S" ]; then
      echo "== kit: skipped, $(left)s left"; RC=1
    else
      echo "== kit: sglang-check --mode live --kit-only on $SITE_FIXED (background, niced; timeout ${T}s) > kit-after.json"
      run env PYTHONPATH="$ROOT:$SITE_FIXED" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$T" nice -n 10 "$PY" \
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
      live_audit "$SITE_FIXED" after "$T"
      A=$?; note "(stdout > audit-live-after.json, stderr > audit-live-after.err)"
      echo "== after: exit status $A after $(elapsed)s $(backend_of "$ART/audit-live-after.json")"
      tail -n 30 "$ART/audit-live-after.err"; [ "$A" -ne 0 ] && RC=$A
    fi
  fi
  if [ -n "${BEFORE_PID:-}" ]; then
    wait "$BEFORE_PID"; B=$?
    echo "== before: exit status $B after $(elapsed)s $(backend_of "$ART/audit-live-before.json")"
    tail -n 30 "$ART/audit-live-before.err"; [ "$B" -ne 0 ] && RC=$B
  fi
  if [ -n "${KIT_PID:-}" ]; then
    wait "$KIT_PID"; K=$?
    echo "== kit: exit status $K after $(elapsed)s"; tail -n 20 "$ART/kit-after.err"; [ "$K" -ne 0 ] && RC=$K
  fi
  if has regress; then
    if [ ! -f "$REGRESS_TEST" ]; then
      echo "== regress: skipped, no $REGRESS_TEST"
    else
      # the upstream test is sglang's own: only the site on its path (no swa_repro)
      for which in shipped fixed; do
        site=$SITE; want=FAIL; n=2
        [ "$which" = fixed ] && { site=$SITE_FIXED; want=PASS; n=1; }
        T=$(share "$n")
        if [ "$which" = fixed ] && [ "$FIXED_OK" != 1 ]; then
          echo "== regress $which: skipped, $SITE_FIXED is not patched"; RC=1; continue
        elif [ "$T" -lt "$MIN_STEP_S" ]; then
          echo "== regress $which: skipped, $(left)s left"; RC=1; continue
        fi
        echo "== regress $which: $REGRESS_TEST on $site (expected to $want; timeout ${T}s)"
        echo "== regress $which on $site (expected to $want)" >> "$ART/regress.log"
        run env PYTHONPATH="$site" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$T" "$PY" "$REGRESS_TEST" \
          >> "$ART/regress.log" 2>&1
        G=$?
        note "(stdout and stderr >> regress.log)"
        [ -n "${DRY_RUN:-}" ] && continue
        tail -n 5 "$ART/regress.log"
        if [ "$G" -eq 0 ]; then got=PASS; elif [ "$G" -eq 1 ]; then got=FAIL; else got="ERROR (exit status $G)"; fi
        if [ "$got" = "$want" ]; then verdict="as expected"; else verdict="NOT as expected"; RC=1; fi
        echo "== regress $which: $got, $verdict, after $(elapsed)s" | tee -a "$ART/regress.log"
      done
    fi
  fi
  echo "== done after $(elapsed)s, exit status $RC"
  exit "$RC"
} 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ] && [ -z "${DRY_RUN:-}" ]; then
  # the device returns at most 8 files (16 MiB each): these, flat
  {
    echo "date -u: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "nvidia-smi -L:"; nvidia-smi -L 2>&1
    echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -n 1)"
    echo "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
    echo "git rev-parse HEAD: $(git rev-parse HEAD 2>&1)"
    echo "steps: $STEPS; flashinfer $FI_VERSION, sglang $SGLANG_VERSION; shipped $SITE, fixed $SITE_FIXED; exit status $RC"
    echo "commands, in the order started (file names: under $ART, returned flat):"
    cat "$CMD_LOG"
  } > "$OUT/gpu.txt" 2>&1
  cp "$LOG" "$OUT/"
  for j in audit-live-before.json audit-live-after.json; do
    [ -f "$ART/$j" ] && xz -9 -c "$ART/$j" > "$OUT/$j.xz"
  done
  for f in kit-after.json regress.log fix.diff; do [ -f "$ART/$f" ] && cp "$ART/$f" "$OUT/"; done
  ls "$SITE" > "$OUT/site-listing.txt" 2>/dev/null
  for f in "$OUT"/*; do  # over the per-file limit it would not come back: keep its head and say so
    if [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt $((16 * 2**20)) ]; then
      echo "$(basename "$f") over 16 MiB ($(stat -c %s "$f") bytes), dropped" >> "$OUT/$(basename "$LOG")"; rm "$f"
    fi
  done
fi
exit "$RC"
