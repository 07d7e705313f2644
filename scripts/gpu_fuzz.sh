#!/usr/bin/env bash
# One command on an air-gapped GPU machine (torch, nvcc, ninja; no network): `swa-repro fuzz --mode live`
# for one or more flashinfer versions.
#   bash scripts/gpu_fuzz.sh SPEC [SPEC ...]
# SPEC = VERSION[:CASES[:BACKENDS[:HEAD_DIMS[:SEED]]]], e.g. 0.6.12:200:fa2,fa3:64,128,256:0 or 0.6.14:50:fa2:128
#   (fields left out come from the env: CASES=100 BACKENDS=fa2,fa3 HEAD_DIMS=64,128,256 SEED=0).
# Each VERSION's bundle (made here by `swa-repro bundle --flashinfer VERSION --out .bundle/VERSION`) is
# carried in .bundle/VERSION/ or already staged in /tmp/stage/VERSION/ (a carried bundle is staged there
# too, so later calls on a warm machine need not carry it). Phases, within BUDGET_S (default 560 s):
#   1. install each bundle into /tmp/site-VERSION (skipped when already there);
#   2. JIT-build every version's modules at once, in parallel (`fuzz --prebuild-only`), into
#      .fi_jit/VERSION (kept between calls on a warm machine: fa2 ~30 s, fa3 ~100 s per module);
#      JIT_JOBS (default 24) bounds the nvcc jobs of all versions together;
#   3. per version whose modules all built, `fuzz --mode live` into recordings/fuzz/VERSION/, with an
#      equal share of the time left (`--budget-s`: cases not started in time are listed, the rest kept).
# If $OUT is set (the device runner's return folder): one fuzz-VERSION.tar.gz per version (its
# recordings/fuzz/VERSION/ and recordings/fuzz/logs/ files; extract at the repo root) and this log.
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,8p "$0"; exit 2; }
BUDGET_S="${BUDGET_S:-560}"
START=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOGDIR="recordings/fuzz/logs"
mkdir -p "$LOGDIR" artifacts/gpu_fuzz
LOG="artifacts/gpu_fuzz/gpu_fuzz-$STAMP.log"
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

declare -a VERSIONS=() READY=()
declare -A ARGS=()
for spec in "$@"; do
  IFS=: read -r v n b h s <<<"$spec"
  VERSIONS+=("$v")
  ARGS[$v]="--cases ${n:-${CASES:-100}} --backends ${b:-${BACKENDS:-fa2,fa3}} --head-dims ${h:-${HEAD_DIMS:-64,128,256}} --seed ${s:-${SEED:-0}}"
done

install_one() {  # VERSION -> /tmp/site-VERSION, from .bundle/VERSION or /tmp/stage/VERSION
  local v=$1 site=/tmp/site-$1 src=""
  if [ -f ".bundle/$v/install.sh" ]; then
    src=".bundle/$v"
    [ -d "/tmp/stage/$v" ] || { mkdir -p /tmp/stage && cp -r ".bundle/$v" "/tmp/stage/$v"; }
  elif [ -f "/tmp/stage/$v/install.sh" ]; then
    src="/tmp/stage/$v"
  else
    echo "error: no bundle for $v in .bundle/$v or /tmp/stage/$v (make it: swa-repro bundle --flashinfer $v --out .bundle/$v)"
    return 2
  fi
  if [ ! -f "$site/.swa_repro_installed" ]; then
    rm -rf "$site"
    PYTHON="$PY" bash "$src/install.sh" "$site" >/dev/null || { echo "error: installing $src into $site failed"; return 2; }
    touch "$site/.swa_repro_installed"
  fi
  PYTHONPATH="$ROOT:$site" VERSION="$v" SITE="$site" "$PY" - <<'EOF'
import os, sys, flashinfer, torch
ok = flashinfer.__file__.startswith(os.environ["SITE"] + "/") and flashinfer.__version__.split("+")[0] == os.environ["VERSION"]
print(f"  flashinfer {flashinfer.__version__} from {flashinfer.__file__}; torch {torch.__version__} cuda {torch.version.cuda}")
sys.exit(0 if ok else "error: flashinfer did not come from the bundle")
EOF
}

{
  echo "== gpu_fuzz $STAMP: ${VERSIONS[*]} (budget ${BUDGET_S}s)"
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE")'
  nvcc --version | tail -n 1
  echo "== 1. install"
  for v in "${VERSIONS[@]}"; do
    echo "-- $v"
    install_one "$v" && READY+=("$v")
  done
  [ ${#READY[@]} -gt 0 ] || { echo "error: no version installed"; exit 2; }
  RC=0
  [ ${#READY[@]} -eq ${#VERSIONS[@]} ] || RC=1

  JIT_T=$(( $(left) - 30 > 10 ? $(left) - 30 : 10 ))
  echo "== 2. JIT prebuild of ${READY[*]} in parallel (timeout ${JIT_T}s)"
  NV=${#READY[@]}
  export MAX_JOBS=$(( ${JIT_JOBS:-24} / (NV * 4) > 0 ? ${JIT_JOBS:-24} / (NV * 4) : 1 ))
  declare -A PIDS=()
  for v in "${READY[@]}"; do
    mkdir -p ".fi_jit/$v"
    PYTHONPATH="$ROOT:/tmp/site-$v" FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit/$v" PYTHONUNBUFFERED=1 \
      timeout --kill-after=15 "$JIT_T" "$PY" -m swa_repro.cli fuzz --mode live --prebuild-only \
      --jit-workers 4 ${ARGS[$v]} >"$LOGDIR/prebuild-$v-$STAMP.log" 2>&1 &
    PIDS[$v]=$!
  done
  BUILT=()
  for v in "${READY[@]}"; do
    wait "${PIDS[$v]}"; rc=$?
    echo "-- $v prebuild exit $rc after $(( $(date +%s) - START ))s: $(grep -m1 '^JIT:' "$LOGDIR/prebuild-$v-$STAMP.log" | cut -c1-300)"
    if [ $rc -eq 0 ]; then BUILT+=("$v"); else RC=1; tail -n 5 "$LOGDIR/prebuild-$v-$STAMP.log"; fi
  done

  echo "== 3. fuzz ${BUILT[*]}"
  i=0
  for v in "${BUILT[@]}"; do
    share=$(( ($(left) - 20) / (${#BUILT[@]} - i) )); i=$((i + 1))
    if [ "$share" -lt 30 ]; then echo "-- $v: skipped, ${share}s left"; RC=1; continue; fi
    echo "-- $v: ${ARGS[$v]} (budget ${share}s)"
    PYTHONPATH="$ROOT:/tmp/site-$v" FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit/$v" PYTHONUNBUFFERED=1 \
      timeout --signal=INT --kill-after=20 "$share" "$PY" -m swa_repro.cli fuzz --mode live \
      --budget-s $(( share - 25 )) --out "recordings/fuzz/$v" ${ARGS[$v]} 2>&1 | tee "$LOGDIR/fuzz-$v-$STAMP.log" | grep -v '^fuzz_s'
    r=${PIPESTATUS[0]}; echo "-- $v fuzz exit $r"; [ $r -eq 0 ] || RC=1
  done
  echo "== done after $(( $(date +%s) - START ))s, exit $RC"
  exit $RC
} 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then  # at most 8 files come back: one archive per version and this log
  for v in "${VERSIONS[@]}"; do
    files=$(ls -d "recordings/fuzz/$v" "$LOGDIR"/*-"$v"-"$STAMP".log 2>/dev/null)
    [ -n "$files" ] && tar -czf "$OUT/fuzz-$v.tar.gz" $files
  done
  cp "$LOG" "$OUT/"
fi
exit "$RC"
