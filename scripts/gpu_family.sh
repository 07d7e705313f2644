#!/usr/bin/env bash
# Issue #25's GPU step: model families at their real window, their layers built by sglang's own model
# code, each driven call run on this GPU's FlashInfer and judged against the float64 reference at the
# window and cap the family's config intends, as shipped and with `swa-repro patch --fix all`.
#   bash scripts/gpu_family.sh [STEPS]   STEPS: all (default) = install,patch,family; or a subset, and
#   build (before family): the same children with SWA_REPRO_WARM_ONLY=1, the warm-up alone (every module the
#   judged pass needs JIT-built, at most BUILD_WORKERS at once per site; both sites at once share flashinfer's
#   per-module locks, so no module is built twice; its cache keeps them for the next call on a warm machine)
#   -> family-build-*.json; with family after it in one call it gets BUILD_SHARE_PCT of the time, at most what
#   leaves the judged step LIVE_MARGIN_S + MIN_LIVE_S (+ KILL_AFTER_S + 5) (said where cut), and it says the
#   modules still building at its end (their calls the judged pass skips: audit.live.unwarmed).
# Bundles carried in .bundle/ (as for scripts/gpu_fix.sh):
#   swa-repro bundle --flashinfer 0.7.2 --out .bundle/fi-0.7.2
#   swa-repro bundle --sglang 0.5.23 --out .bundle/sglang-0.5.23
# install: a fresh $SITE from both bundles; $SITE_FIXED holds a copy of its `sglang` package alone (one
#   flashinfer for both: scripts/gpu_fix.sh says why).
# patch: swa-repro patch apply --fix all --in-place on $SITE_FIXED only (the backend), then each family
#   fix on its own model file (FAMILY_FIXES, default audit.family_fix.FAMILY_FIX's: commandr.py's hook;
#   `--fix all` on the backend only names them, and the first H100 run of 2026-12-05 ran without it).
# family: python -m swa_repro.sglang.audit.family_run --overlay SITE --families $FAMILIES --gpus $GPU
#   --live cuda [--paths $PATHS] on both sites at once (they wait on the same JIT locks), each with a
#   timeout of the time left less RESERVE_S -> family-live-shipped.json, family-live-fixed.json.
# ISOLATE_GRAPH=1 (default): the CUDA-graph paths (cuda_graph_*, of PATHS or, PATHS empty, of every audit
#   path) run in their own children after the others' (GRAPH_SHARE_PCT of the step's time when both run),
#   with CUDA_LAUNCH_BLOCKING=1 and SWA_REPRO_ANNOUNCE_CALLS=1 (audit.live.announce: a line on stderr as
#   each call launches and returns): an illegal memory access is reported at the faulting call, its .err (returned) names
#   it, and it cannot poison the other paths' process (the H100 call of 2026-12-06) -> family-live-*-graph.json.
# CHECKPOINTS (issue #41): comma-separated users' checkpoints (a config.json or its folder) audited
#   instead of FAMILIES: before the build or family step (a build alone, STEPS=install,build, warms their modules), python -m swa_repro.sglang.audit.checkpoint_smalls reads
#   each on $SITE as `audit --model PATH` does and writes smalls.json (each cut to a few layers, the
#   user's values); the children get --families <the folders' names> --smalls-file smalls.json.
# If $OUT is set: gpu.txt (date, GPU, driver, torch, commit, steps, seconds, commands), the log and
# the family-*.json, the graph children's .err and smalls.json, xz-compressed; over 8 files in all (the most a
# call returns) those .xz go into one data.tar, which gpu.txt names (lib_gpu.sh write_out). Env: FI_VERSION (0.7.2), SGLANG_VERSION (0.5.23), FAMILIES
# (gemma2,gemma3), GPU (sm80,sm90: both run on an H100 or H200), PATHS (empty: every path), PYTHON
# (python3), BUNDLE_DIR (.bundle), SITE, SITE_FIXED, ART (artifacts/gpu_family), BUDGET_S (575),
# RESERVE_S (30), KILL_AFTER_S (15), MIN_STEP_S (30; at least LIVE_MARGIN_S), LIVE_MARGIN_S (120), MIN_LIVE_S (120: a
# judged child's live budget at least this, else the step is skipped and said), ISOLATE_GRAPH (1),
# GRAPH_SHARE_PCT (50), BUILD_WORKERS (8), BUILD_SHARE_PCT (50), BUILD_MARGIN_S (20), DRY_RUN=1: print each command instead.
set -uo pipefail
STEPS="${1:-all}"
[ "$STEPS" = all ] && STEPS=install,patch,family
FI_VERSION="${FI_VERSION:-0.7.2}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
FAMILIES="${FAMILIES:-gemma2,gemma3}"  # hd256 (fa2 and fa3); then cohere2,mistral (hd128) on the warm machine
GPU="${GPU:-sm80,sm90}"  # sm80's choice (fa2) and sm90's (auto: fa3 at head_dim 256) on one sm90 card
PATHS="${PATHS:-}"
BUDGET_S="${BUDGET_S:-575}"
RESERVE_S="${RESERVE_S:-30}"
KILL_AFTER_S="${KILL_AFTER_S:-15}"
MIN_STEP_S="${MIN_STEP_S:-30}"
LIVE_MARGIN_S="${LIVE_MARGIN_S:-120}"  # no call starts live after timeout - this: the rest builds, drives, writes
MIN_LIVE_S="${MIN_LIVE_S:-120}"  # a judged child's import + drive come out of its live budget: 56 + 11 s on the
# H100 call of 2026-12-06 19:50, whose 31 s budget ran out before any call (the build step had taken 70%)
ISOLATE_GRAPH="${ISOLATE_GRAPH:-1}"
GRAPH_SHARE_PCT="${GRAPH_SHARE_PCT:-50}"
BUILD_WORKERS="${BUILD_WORKERS:-8}"
BUILD_SHARE_PCT="${BUILD_SHARE_PCT:-50}"
BUILD_MARGIN_S="${BUILD_MARGIN_S:-20}"  # a build child's warm-up may run until its timeout less this: it only writes after
FAMILY_FIXES="${FAMILY_FIXES-commandr_window_hook}"  # tests/test_gpu_family_script.py holds it to FAMILY_FIX
. "$(dirname "${BASH_SOURCE[0]}")/lib_gpu.sh"  # START, ROOT (the working directory), PY, BUNDLE_DIR, FI_BUNDLE; has, run, ...
SG_BUNDLE="$BUNDLE_DIR/sglang-$SGLANG_VERSION"
NB_BUNDLE=""
SITE="${SITE:-/tmp/site-shipped}"
SITE_FIXED="${SITE_FIXED:-/tmp/site-fixed}"
ART="${ART:-artifacts/gpu_family}"
mkdir -p "$ART"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOG="$ART/gpu_family-$STAMP.log"
CMD_LOG="$ART/commands-$STAMP.txt"
: > "$CMD_LOG"
SMALLS="$ART/smalls.json"
rm -f "$ART"/family-*.json "$ART"/family-*.err "$ART/steps.tsv" "$SMALLS"

family() {  # KIND NAME PATH TIMEOUT PATHS [VAR=VALUE...]: the family child on PATH (sites) for PATHS (empty:
  # every path), the variables in its environment -> family-KIND-NAME.json (.err); KIND live or build
  local kind=$1 name=$2 sp=$3 t=$4 paths=$5 t0 out; shift 5
  out="$ART/family-$kind-$name.json"; t0=$(elapsed)
  [ -n "${DRY_RUN:-}" ] && out=/dev/null
  run env PYTHONPATH="$ROOT:$sp" "$@" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$t" "$PY" -m \
    swa_repro.sglang.audit.family_run --overlay "${sp%%:*}" --out "$out" --families "$FAMILIES" --gpus "$GPU" \
    --live cuda --live-budget-s "$(( t - $([ "$kind" = live ] && echo "$LIVE_MARGIN_S" || echo "$BUILD_MARGIN_S") ))" \
    ${paths:+--paths "$paths"} \
    ${CHECKPOINTS:+--smalls-file "$SMALLS"} 2> "$ART/family-$kind-$name.err"
  local rc=$?; step "$([ "$kind" = live ] && echo family || echo build)_$name" "$t0" "$rc"; return "$rc"
}

sites() {  # KIND SUFFIX TIMEOUT PATHS [VAR=VALUE...]: both sites' children at once; status 1 if either failed
  local kind=$1 sfx=$2 t=$3 paths=$4 pid s f which; shift 4
  family "$kind" "shipped$sfx" "$SITE" "$t" "$paths" "$@" & pid=$!
  family "$kind" "fixed$sfx" "$SITE_FIXED:$SITE" "$t" "$paths" "$@"; f=$?
  wait "$pid"; s=$?
  for which in shipped fixed; do echo "== $kind $which$sfx:"; tail -n 5 "$ART/family-$kind-$which$sfx.err" 2>/dev/null; done
  echo "== $kind$sfx: exit status shipped $s, fixed $f"
  [ "$s" -eq 0 ] && [ "$f" -eq 0 ]
}

split_paths() {  # PATHS_MAIN, PATHS_GRAPH: $PATHS (empty: every audit path) with cuda_graph_* apart (ISOLATE_GRAPH=1)
  PATHS_MAIN="$PATHS" PATHS_GRAPH=""
  [ "$ISOLATE_GRAPH" = 1 ] || return 0
  local all="$PATHS" p ps
  [ -n "$all" ] || all=$(PYTHONPATH="$ROOT:$SITE" "$PY" -c \
    'from swa_repro.sglang.audit.paths import PATHS; print(",".join(PATHS))') || return 1
  PATHS_MAIN=""; IFS=, read -r -a ps <<< "$all"
  for p in "${ps[@]}"; do
    case "$p" in cuda_graph_*) PATHS_GRAPH+="${PATHS_GRAPH:+,}$p" ;; *) PATHS_MAIN+="${PATHS_MAIN:+,}$p" ;; esac
  done
}

passes() {  # KIND TIMEOUT [VAR=VALUE...]: the other paths' children, then the CUDA-graph paths' in their own
  # (CUDA_LAUNCH_BLOCKING=1, each call said before its launch), all within TIMEOUT; status 1 if any failed
  local kind=$1 t=$2 end rc=0 tg least; shift 2
  end=$(( $(elapsed) + t )); least=$(least_s "$kind")
  if [ "$ISOLATE_GRAPH" != 1 ] || [ -n "$PATHS_MAIN" ]; then
    if [ -n "$PATHS_GRAPH" ]; then  # GRAPH_SHARE_PCT for the graph children, never the others' least_s
      t=$(( t * (100 - GRAPH_SHARE_PCT) / 100 > least ? t * (100 - GRAPH_SHARE_PCT) / 100 : (least < t ? least : t) ))
    fi
    echo "== $kind: shipped and fixed at once (timeout ${t}s each; paths ${PATHS_MAIN:-all}) > family-$kind-{shipped,fixed}.json"
    sites "$kind" "" "$t" "$PATHS_MAIN" "$@" || rc=1
  fi
  if [ -n "$PATHS_GRAPH" ]; then
    tg=$(( end - $(elapsed) ))
    if too_short "$kind" "$tg"; then
      echo "== $kind graph: skipped, ${tg}s left"; return 1
    fi
    echo "== $kind graph: shipped and fixed at once, CUDA_LAUNCH_BLOCKING=1 (timeout ${tg}s each; paths $PATHS_GRAPH) > family-$kind-{shipped,fixed}-graph.json"
    sites "$kind" "-graph" "$tg" "$PATHS_GRAPH" "$@" CUDA_LAUNCH_BLOCKING=1 SWA_REPRO_ANNOUNCE_CALLS=1 || rc=1
  fi
  return "$rc"
}

least_s() {  # KIND: the least timeout a KIND child can use: its live budget (timeout - LIVE_MARGIN_S) at least
  # MIN_LIVE_S for a judged child (it imports and drives before its first call), 1 s for a build's
  echo $(( LIVE_MARGIN_S + $([ "$1" = live ] && echo "$MIN_LIVE_S" || echo 1) ))
}

too_short() {  # KIND TIMEOUT: status 0 when TIMEOUT leaves a KIND child no time (under MIN_STEP_S or least_s)
  [ "$2" -lt "$MIN_STEP_S" ] || [ "$2" -lt "$(least_s "$1")" ]
}

build_share() {  # TIME: the build step's timeout when the judged step follows: BUILD_SHARE_PCT of TIME, cut (and
  # said) where the judged step would be left under LIVE_MARGIN_S + MIN_LIVE_S (the build may overrun by KILL_AFTER_S)
  local t=$(( $1 * BUILD_SHARE_PCT / 100 )) keep=$(( LIVE_MARGIN_S + MIN_LIVE_S + KILL_AFTER_S + 5 ))
  if [ $(( $1 - t )) -lt "$keep" ]; then
    t=$(( $1 - keep ))
    echo "== build: share cut to ${t}s of ${1}s, so that the judged step keeps ${keep}s (LIVE_MARGIN_S + MIN_LIVE_S + KILL_AFTER_S + 5)" >&2
  fi
  echo "$t"
}

still_building() {  # the build children's modules still building at their timeout: said, with what it means
  local f n
  for f in "$ART"/family-build-*.json; do
    [ -f "$f" ] || continue
    n=$(grep -o "still building" "$f" | wc -l)
    [ "$n" -gt 0 ] && echo "== build: $n modules still building at the end of its share ($(basename "$f")): the judged pass skips their calls (audit.live.unwarmed)"
  done
  return 0
}

timed() {  # KIND TIMEOUT [VAR=VALUE...]: passes, or skipped and said when TIMEOUT leaves no time to run a call live
  if too_short "$1" "$2"; then
    echo "== $([ "$1" = live ] && echo family || echo "$1"): skipped, $(left)s left"; return 1
  fi
  passes "$@"
}

checkpoints() {  # CHECKPOINTS read on the shipped site as `audit --model PATH` reads each -> $SMALLS; prints
  # the labels (the folders' names: the children's --families)
  local cks; IFS=, read -r -a cks <<< "$CHECKPOINTS"
  local cmd=(env PYTHONPATH="$ROOT:$SITE" "$PY" -m swa_repro.sglang.audit.checkpoint_smalls --overlay "$SITE"
             --sglang "$SGLANG_VERSION" --out "$SMALLS" "${cks[@]}")
  echo "+ ${cmd[*]}" >&"${RUN_FD:-2}"; echo "${cmd[*]}" >> "$CMD_LOG"
  if [ -n "${DRY_RUN:-}" ]; then labels; else "${cmd[@]}"; fi
}

labels() {  # CHECKPOINTS' folder names, as checkpoint_smalls.label_of names them
  local c cks; IFS=, read -r -a cks <<< "$CHECKPOINTS"
  for c in "${cks[@]}"; do basename "${c%/config.json}"; done | paste -sd,
}

{
  exec 3>&1; RUN_FD=3
  echo "== gpu_family steps=$STEPS families=$FAMILIES gpu=$GPU flashinfer=$FI_VERSION sglang=$SGLANG_VERSION (budget ${BUDGET_S}s)"
  export FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit" SGLANG_JIT_CACHE_DIR="$ROOT/.sgl_jit"
  mkdir -p "$FLASHINFER_WORKSPACE_BASE" "$SGLANG_JIT_CACHE_DIR"
  RC=0
  if has install; then
    T0=$(elapsed)
    install_bundles "$SITE" || exit 2
    run rm -rf "$SITE_FIXED" && run mkdir -p "$SITE_FIXED" && run cp -a "$SITE/sglang" "$SITE_FIXED/" || exit 2
    step install "$T0" 0
    verify_site "$SITE" || { echo "error: $SITE is not what its bundles install (above)"; exit 2; }
  fi
  if has patch; then
    T0=$(elapsed)
    run env PYTHONPATH="$ROOT:$SITE_FIXED:$SITE" "$PY" -m swa_repro.cli patch apply --fix all --in-place
    P=$?
    for fx in $FAMILY_FIXES; do  # each edits its own model file (patch names them; audit.family_fix.FAMILY_FIX)
      run env PYTHONPATH="$ROOT:$SITE_FIXED:$SITE" "$PY" -m swa_repro.cli patch apply --fix "$fx" --in-place || P=1
    done
    step patch "$T0" "$P"; echo "== patch apply: exit status $P"
    [ "$P" -ne 0 ] && { RC=1; STEPS="${STEPS/family/}"; echo "== family: skipped on both sites (the patch failed)"; }
  fi
  if { has build || has family; } && [ -n "${CHECKPOINTS:-}" ]; then  # a build step alone builds what they need
    if FAMILIES="$(checkpoints)"; then echo "== checkpoints read: $FAMILIES"
    else echo "== checkpoints: not read (above); build and family skipped"; RC=1; STEPS="${STEPS/build/}"; STEPS="${STEPS/family/}"; fi
  fi
  if has build || has family; then
    split_paths || { echo "== paths: the audit's paths not listed (above)"; RC=1; STEPS="${STEPS/build/}"; STEPS="${STEPS/family/}"; }
  fi
  if has build; then
    T=$(( $(left) - RESERVE_S )); has family && T=$(build_share "$T")
    timed build "$T" SWA_REPRO_WARM_ONLY=1 SWA_REPRO_BUILD_WORKERS="$BUILD_WORKERS" || RC=1
    still_building
  fi
  if has family; then
    timed live "$(( $(left) - RESERVE_S ))" || RC=1
  fi
  steps_done "$RC"
  exit "$RC"
} 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
[ -n "${CHECKPOINTS:-}" ] && FAMILIES="$(labels)"  # set in the pipeline's subshell above: again here
write_out "steps: $STEPS; families $FAMILIES${CHECKPOINTS:+ (checkpoints $CHECKPOINTS)}; gpu $GPU; paths ${PATHS:-all}; isolate graph $ISOLATE_GRAPH; flashinfer $FI_VERSION, sglang $SGLANG_VERSION; exit status $RC" \
  "$ART"/family-*.json "$ART"/family-*-graph.err "$SMALLS"
exit "$RC"
