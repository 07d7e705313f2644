#!/usr/bin/env bash
# One command on an air-gapped GPU machine (torch, nvcc, ninja; no network): `swa-repro fuzz --mode live`
# for one or more flashinfer versions, one after another.
#   bash scripts/gpu_fuzz.sh SPEC [SPEC ...]
# SPEC = VERSION[:CASES[:BACKENDS[:HEAD_DIMS[:SEED[:PLANS]]]]], e.g. 0.6.12:200:fa2,fa3,auto:64,128,256:0
#   or 0.6.14:60:fa2,fa3:128:0:fa3=bug (PLANS is fuzz's --plans with '=' for ':'); fields left out come
#   from the env: CASES=100 BACKENDS=fa2,fa3 HEAD_DIMS=64,128,256 SEED=0 PLANS=bug,fix.
# Each VERSION's bundle (made here: `swa-repro bundle --flashinfer VERSION --out .bundle/fi-VERSION`) is
# carried in .bundle/fi-VERSION/ (or .bundle/VERSION/), or already staged in /tmp/stage/VERSION/ by an
# earlier call on the same warm machine. Within BUDGET_S (default 570 s), per version in the order given:
#   1. install the bundle into /tmp/site-VERSION (skipped when already there);
#   2. JIT-build all its modules at once (`fuzz --prebuild-only`), JIT_JOBS (default 40) nvcc processes
#      in all, for the GPU's own arch only, into .fi_jit/VERSION. A build the budget cuts off is left
#      running in its own session: on a warm machine the next call finds it done or waits on its
#      locks. The next version's build starts, niced, as soon as this one's ends, so it overlaps this
#      version's fuzz (GPU-bound);
#   3. `fuzz --mode live` into recordings/fuzz/VERSION/ with the time left (the wait in 2 keeps FUZZ_S,
#      default 60 s, for it; cases not started in time are listed, the rest kept). Order versions by
#      priority: a version whose build is not done in time is skipped, its build left running.
# Prints a table last: per version, JIT wall and CPU seconds, modules, library MiB, cases, verdict.
# If $OUT is set (the device runner's return folder): one fuzz-VERSION.tar.gz per version (its
# recordings/fuzz/VERSION/ and logs; extract at the repo root) and this log: at most 7 versions a call.
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,20p "$0"; exit 2; }
BUDGET_S="${BUDGET_S:-570}"; JIT_JOBS="${JIT_JOBS:-40}"; FUZZ_S="${FUZZ_S:-60}"
START=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOGDIR="recordings/fuzz/logs"
mkdir -p "$LOGDIR" artifacts/gpu_fuzz
LOG="artifacts/gpu_fuzz/gpu_fuzz-$STAMP.log"
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
[ -n "${FLASHINFER_CUDA_ARCH_LIST:-}" ] || export FLASHINFER_CUDA_ARCH_LIST="$("$PY" -c \
  'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))' 2>/dev/null || echo 9.0)"

declare -a VERSIONS=()
declare -A ARGS=() PRE_PID=() PRE_T0=()
for spec in "$@"; do
  IFS=: read -r v n b h s p <<<"$spec"
  VERSIONS+=("$v")
  p="${p:-${PLANS:-bug,fix}}"
  ARGS[$v]="--cases ${n:-${CASES:-100}} --backends ${b:-${BACKENDS:-fa2,fa3}} --head-dims ${h:-${HEAD_DIMS:-64,128,256}} --seed ${s:-${SEED:-0}} --plans ${p//=/:}"
done

install_one() {  # VERSION -> /tmp/site-VERSION, from .bundle/fi-VERSION, .bundle/VERSION or /tmp/stage/VERSION
  local v=$1 site=/tmp/site-$1 src="" d
  for d in ".bundle/fi-$v" ".bundle/$v" "/tmp/stage/$v"; do [ -f "$d/install.sh" ] && { src=$d; break; }; done
  [ -n "$src" ] || { echo "error: no bundle for $v (make it: swa-repro bundle --flashinfer $v --out .bundle/fi-$v)"; return 2; }
  [ -d "/tmp/stage/$v" ] || { mkdir -p /tmp/stage && cp -r "$src" "/tmp/stage/$v"; }
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

fuzz_argv() {  # VERSION -> FUZZ: the environment and command line of that version's `fuzz --mode live`
  mkdir -p ".fi_jit/$1"
  FUZZ=(env PYTHONPATH="$ROOT:/tmp/site-$1" FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit/$1" PYTHONUNBUFFERED=1
        "$PY" -m swa_repro.cli fuzz --mode live ${ARGS[$1]})
}

start_prebuild() {  # VERSION: install, then build its modules in a session of its own (niced), which
  local v=$1        # outlives this call on a warm machine: the next call's build waits on its locks
  echo "-- $v: install ($(( $(date +%s) - START ))s)"
  install_one "$v" || return 2
  PRE_T0[$v]=$(date +%s)
  fuzz_argv "$v"
  setsid nice -n 10 "${FUZZ[@]}" --prebuild-only --jit-workers 64 --jit-jobs "$JIT_JOBS" \
    >"$LOGDIR/prebuild-$v-$STAMP.log" 2>&1 </dev/null &
  PRE_PID[$v]=$!
}

wait_prebuild() {  # VERSION TIMEOUT_S -> 0 when every module built
  local v=$1 pid=${PRE_PID[$1]:-} end=$(( $(date +%s) + $2 ))
  [ -n "$pid" ] || return 2
  while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$end" ]; do sleep 2; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "-- $v: JIT not done after $(( $(date +%s) - PRE_T0[$v] ))s: left building (pid $pid) for a next call on this warm machine"
    return 1
  fi
  wait "$pid"; local rc=$?
  echo "-- $v: JIT exit $rc after $(( $(date +%s) - PRE_T0[$v] ))s: $(grep -m1 '^JIT:' "$LOGDIR/prebuild-$v-$STAMP.log" | cut -c1-160)"
  [ $rc -eq 0 ] || tail -n 5 "$LOGDIR/prebuild-$v-$STAMP.log"
  return $rc
}

{
  echo "== gpu_fuzz $STAMP: ${VERSIONS[*]} (budget ${BUDGET_S}s, JIT_JOBS $JIT_JOBS, FLASHINFER_CUDA_ARCH_LIST $FLASHINFER_CUDA_ARCH_LIST)"
  "$PY" -c 'import sys, os, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE", "| cores", os.cpu_count())'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  nvcc --version | tail -n 1
  free -g | sed -n 2p
  RC=0
  declare -A VERDICT=()
  start_prebuild "${VERSIONS[0]}" || { VERDICT[${VERSIONS[0]}]="not installed"; RC=1; }
  for i in "${!VERSIONS[@]}"; do
    v=${VERSIONS[$i]}; next=${VERSIONS[$((i + 1))]:-}
    [ -n "${PRE_PID[$v]:-}" ] || { VERDICT[$v]=${VERDICT[$v]:-"not installed"}; RC=1
                                   [ -n "$next" ] && { start_prebuild "$next" || VERDICT[$next]="not installed"; }; continue; }
    if ! wait_prebuild "$v" $(( $(left) - FUZZ_S > 10 ? $(left) - FUZZ_S : 10 )); then
      VERDICT[$v]="JIT incomplete"; RC=1
      [ -n "$next" ] && { start_prebuild "$next" || VERDICT[$next]="not installed"; }
      continue
    fi
    [ -n "$next" ] && { start_prebuild "$next" || VERDICT[$next]="not installed"; }
    share=$(( $(left) - 15 ))
    if [ "$share" -lt 30 ]; then echo "-- $v: fuzz skipped, ${share}s left"; VERDICT[$v]="not fuzzed"; RC=1; continue; fi
    echo "-- $v: fuzz ${ARGS[$v]} (budget ${share}s)"
    fuzz_argv "$v"
    timeout --signal=INT --kill-after=20 "$share" "${FUZZ[@]}" --budget-s $(( share - 25 )) --out "recordings/fuzz/$v" --force 2>&1 \
      | tee "$LOGDIR/fuzz-$v-$STAMP.log" | grep -v '^fuzz_s'
    r=${PIPESTATUS[0]}; echo "-- $v fuzz exit $r"; [ $r -eq 0 ] || RC=1
    VERDICT[$v]=$([ $r -eq 0 ] && echo "agrees" || echo "exit $r")
  done
  echo "== done after $(( $(date +%s) - START ))s, exit $RC"
  echo "version | JIT (prebuild line) | fuzz | verdict"
  for v in "${VERSIONS[@]}"; do
    j=$(grep -m1 -o '^JIT: [0-9]* modules in [0-9.]* s wall, [0-9.]* s CPU' "$LOGDIR/prebuild-$v-$STAMP.log" 2>/dev/null)
    f=$(grep -m1 '^fuzz (live):' "$LOGDIR/fuzz-$v-$STAMP.log" 2>/dev/null | cut -c14-150)
    echo "$v | ${j:-none} | ${f:-none} | ${VERDICT[$v]:-not reached}"
  done
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
