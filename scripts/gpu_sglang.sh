#!/usr/bin/env bash
# One command on an air-gapped GPU machine (torch 2.11, nvcc, ninja; no network, no sglang):
#   bash scripts/gpu_sglang.sh [STEPS]      STEPS: all (default) = install,audit,check,notebooks; or a subset
# Bundles carried in .bundle/ (made here, with network):
#   swa-repro bundle --flashinfer 0.6.12 --out .bundle/fi-0.6.12
#   swa-repro bundle --sglang 0.5.15.post1 --out .bundle/sglang-0.5.15.post1
#   swa-repro bundle --notebooks --out .bundle/notebooks          (for the notebooks step)
# install: a fresh $SITE (/tmp/site): the flashinfer bundle, the notebooks bundle, then the sglang
#   bundle LAST (it removes every other copy of what it brings: the flashinfer bundle's apache-tvm-ffi
#   gives way to the ==0.1.11 sglang pins). Then checks that flashinfer, sglang and the sgl_kernel stub
#   come from $SITE.
# audit: swa-repro audit --mode live --json -> audit-live.json: sglang's own code on GPU tensors (its
#   serving path), every call also executed on real FlashInfer against the float64 reference. It runs
#   in the background while check runs (their JIT builds overlap), within AUDIT_BUDGET_S (420 s).
# check: swa-repro sglang-check --mode live --peer --json (the matrix unpatched and patched, and
#   sglang's own attention kit) -> sglang-check.json, wrapper traces -> traces/. The JSON records the
#   sgl_kernel stub's provenance; the command exits 1 if the stub was called.
# notebooks: swa-repro run --mode live --output $NB_OUT 03 04 05.
# Everything ends within BUDGET_S (default 560 s; check gets at most CHECK_BUDGET_S, default 330 s,
# when the notebooks follow). If $OUT is set (the device runner's return folder), at most 6 files
# land there. Env: FI_VERSION (0.6.12), SGLANG_VERSION (0.5.15.post1), PYTHON (python3),
# BUNDLE_DIR (.bundle), SITE, ART (artifacts/gpu_sglang), NB_OUT (artifacts/live),
# DRY_RUN=1: print each command instead of running it.
set -uo pipefail
STEPS="${1:-all}"
[ "$STEPS" = all ] && STEPS=install,audit,check,notebooks
FI_VERSION="${FI_VERSION:-0.6.12}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.15.post1}"
BUDGET_S="${BUDGET_S:-575}"
CHECK_BUDGET_S="${CHECK_BUDGET_S:-330}"
AUDIT_BUDGET_S="${AUDIT_BUDGET_S:-420}"
. "$(dirname "${BASH_SOURCE[0]}")/lib_gpu.sh"  # START, ROOT (the working directory), PY, BUNDLE_DIR, FI_BUNDLE; has, run, ...
SG_BUNDLE="$BUNDLE_DIR/sglang-$SGLANG_VERSION"
NB_BUNDLE="$BUNDLE_DIR/notebooks"
SITE="${SITE:-/tmp/site}"
ART="${ART:-artifacts/gpu_sglang}"
NB_OUT="${NB_OUT:-artifacts/live}"
mkdir -p "$ART"
LOG="$ART/gpu_sglang-$(date -u +%Y%m%dT%H%M%SZ).log"

{
  echo "== gpu_sglang steps=$STEPS flashinfer=$FI_VERSION sglang=$SGLANG_VERSION site=$SITE (budget ${BUDGET_S}s)"
  export PYTHONPATH="$ROOT:$SITE"
  export FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit"  # JIT cache, kept between calls
  mkdir -p "$FLASHINFER_WORKSPACE_BASE"
  if has install; then install_bundles || exit 2; fi
  verify_site || exit 2
  RC=0
  if has audit; then
    A="$ART/audit-live.json"; [ -n "${DRY_RUN:-}" ] && A=/dev/null
    echo "== audit --mode live (background, timeout ${AUDIT_BUDGET_S}s)"
    run timeout --signal=INT --kill-after=15 "$AUDIT_BUDGET_S" "$PY" -m swa_repro.cli audit --mode live --json \
      --live-budget $(( AUDIT_BUDGET_S - 120 )) > "$A" 2> "$ART/audit-live.err" &
    AUDIT_PID=$!
  fi
  if has check; then
    T=$(left); has notebooks && [ "$T" -gt "$CHECK_BUDGET_S" ] && T=$CHECK_BUDGET_S
    echo "== sglang-check --mode live --peer (timeout ${T}s)"
    J="$ART/sglang-check.json"; [ -n "${DRY_RUN:-}" ] && J=/dev/null
    run timeout --signal=INT --kill-after=15 "$T" "$PY" -m swa_repro.cli sglang-check --mode live --peer --json \
      --trace-dir "$ART/traces" > "$J"
    C=$?; echo "== sglang-check exit status $C after $(( $(date +%s) - START ))s"; [ "$C" -ne 0 ] && RC=$C
  fi
  if has audit; then
    wait "$AUDIT_PID"; A_RC=$?
    echo "== audit exit status $A_RC after $(( $(date +%s) - START ))s"; tail -n 30 "$ART/audit-live.err"
    [ "$A_RC" -ne 0 ] && RC=$A_RC
  fi
  if has notebooks; then
    T=$(left)
    echo "== run --mode live 03 04 05 (timeout ${T}s)"
    run timeout --signal=INT --kill-after=15 "$T" "$PY" -m swa_repro.cli run --mode live --output "$NB_OUT" 03 04 05
    N=$?; echo "== run exit status $N after $(( $(date +%s) - START ))s"; [ "$N" -ne 0 ] && RC=$N
  fi
  exit "$RC"
} 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ] && [ -z "${DRY_RUN:-}" ]; then
  # the device returns at most 8 files (16 MiB each, 2 folders deep): these 7, flat
  cp "$LOG" "$OUT/"
  [ -f "$ART/sglang-check.json" ] && cp "$ART/sglang-check.json" "$OUT/"
  [ -f "$ART/audit-live.json" ] && xz -9 -c "$ART/audit-live.json" > "$OUT/audit-live.json.xz"
  if [ -d "$ART/traces" ]; then
    # the failing (unpatched) cases' traces, smallest first, while they fit 15 MiB; the rest is listed
    ( cd "$ART" && : > traces-kept.txt && total=0 && \
      for f in $(ls -Sr traces/*.unpatched.*.pt 2>/dev/null); do
        sz=$(stat -c %s "$f"); if [ $((total + sz)) -le $((15 * 2**20)) ]; then total=$((total + sz)); echo "$f" >> traces-kept.txt
        else echo "dropped (over 16 MiB together): $f $sz bytes"; fi; done > traces-dropped.txt
      tar -cJf "$OUT/sglang-traces.tar.xz" -T traces-kept.txt traces-dropped.txt )
  fi
  [ -d "$NB_OUT" ] && tar -czf "$OUT/notebooks-live.tar.gz" "$NB_OUT"
  ls "$SITE" > "$OUT/site-listing.txt" 2>/dev/null
  for f in "$OUT"/*.tar.*; do  # over the per-file limit it would not come back: say so instead
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt $((16 * 2**20)) ] && echo "$f over 16 MiB, dropped" >> "$OUT/dropped.txt" && rm "$f"
  done
fi
exit "$RC"
