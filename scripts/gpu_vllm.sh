#!/usr/bin/env bash
# Issue #27's GPU step: vLLM's own FlashInfer backend (its builder, cache write and forward) run on
# this GPU's real FlashInfer, each path's keys read by the key probe and its outputs held against the
# float64 reference at what the layer asks, transformers' mask and what the kernel is told
# (swa_repro/vllm/audit/live.py), as shipped and with `swa-repro patch --vllm --fix cap-route`.
#   bash scripts/gpu_vllm.sh [STEPS]   STEPS: all (default) = install,patch,live; or a subset
# Bundles carried in .bundle/ (vLLM 0.33.0 pins flashinfer 0.7.2.post1; 0.34.0's pin, 0.7.3, is not
# on the package index):
#   swa-repro bundle --flashinfer 0.7.2.post1 --kernels prefill,decode,xqa --out .bundle/fi-0.7.2.post1
#   swa-repro bundle --vllm 0.33.0 --out .bundle/vllm-0.33.0
# install: a fresh $SITE from both bundles (flashinfer's first), checked: both import from it.
# patch: $SITE_FIXED holds a copy of $SITE's `vllm` package alone, its FlashInfer backend patched in
#   place (a backup beside it, as `patch apply --in-place` keeps one).
# live: python -m swa_repro.vllm.audit.live on $SITE for each of $FAMILIES, and on $SITE_FIXED for those of
#   $FIXED_FAMILIES (the fix changes capped layers only), one child per family and group of paths
#   ($PATH_GROUPS, ';'-separated: each group builds its own kernels, so the JIT builds of all run at once,
#   under FlashInfer's locks), each with a timeout of the time left less RESERVE_S and a live budget
#   LIVE_MARGIN_S shorter -> live-SITE-FAMILY-N.json; then one document per site (live_report --merge)
#   -> live-shipped.json, live-fixed.json.
# If $OUT is set: gpu.txt (date, GPU, driver, torch, code digest, steps, seconds, commands), the log
# and the two site documents, xz-compressed. Env: FI_VERSION (0.7.2.post1), VLLM_VERSION (0.33.0),
# FAMILIES (gemma2,cohere2), FIXED_FAMILIES (gemma2), PATH_GROUPS (decode,cuda_graph_decode;mixed,prefill;
# spec_decode), PYTHON (python3), BUNDLE_DIR (.bundle), SITE, SITE_FIXED, ART (artifacts/gpu_vllm),
# BUDGET_S (575), RESERVE_S (30), KILL_AFTER_S (15), LIVE_MARGIN_S (60), DRY_RUN=1: print each
# command instead.
set -uo pipefail
STEPS="${1:-all}"
[ "$STEPS" = all ] && STEPS=install,patch,live
FI_VERSION="${FI_VERSION:-0.7.2.post1}"
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
FAMILIES="${FAMILIES:-gemma2,cohere2}"
FIXED_FAMILIES="${FIXED_FAMILIES-gemma2}"
PATH_GROUPS="${PATH_GROUPS:-decode,cuda_graph_decode;mixed,prefill;spec_decode}"
BUDGET_S="${BUDGET_S:-575}"
RESERVE_S="${RESERVE_S:-30}"
KILL_AFTER_S="${KILL_AFTER_S:-15}"
LIVE_MARGIN_S="${LIVE_MARGIN_S:-60}"  # no path starts live after timeout - this: the rest judges and writes
. "$(dirname "${BASH_SOURCE[0]}")/lib_gpu.sh"  # START, ROOT (the working directory), PY, BUNDLE_DIR, FI_BUNDLE; has, run, ...
VL_BUNDLE="$BUNDLE_DIR/vllm-$VLLM_VERSION"
SITE="${SITE:-/tmp/site-vllm}"
SITE_FIXED="${SITE_FIXED:-/tmp/site-vllm-fixed}"
ART="${ART:-artifacts/gpu_vllm}"
BACKEND=vllm/v1/attention/backends/flashinfer.py
mkdir -p "$ART"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
LOG="$ART/gpu_vllm-$STAMP.log"
CMD_LOG="$ART/commands-$STAMP.txt"
: > "$CMD_LOG"
rm -f "$ART"/live-*.json "$ART"/live-*.err "$ART/steps.tsv"

live() {  # SITE_NAME OVERLAY FAMILY N PATHS TIMEOUT: one live child -> live-SITE_NAME-FAMILY-N.json (.err)
  local out="$ART/live-$1-$3-$4.json"
  [ -n "${DRY_RUN:-}" ] && out=/dev/null
  run env PYTHONPATH="$ROOT:$SITE" timeout --signal=INT --kill-after="$KILL_AFTER_S" "$6" "$PY" -m \
    swa_repro.vllm.audit.live --overlay "$2" --out "$out" --families "$3" --paths "$5" --device cuda \
    --budget-s "$(( $6 - LIVE_MARGIN_S ))" 2> "$ART/live-$1-$3-$4.err"
}
children() {  # SITE_NAME OVERLAY FAMILIES TIMEOUT: one child per family and group, in the background
  local f g n
  for f in ${3//,/ }; do
    n=0
    while IFS= read -r g; do
      [ -n "$g" ] || continue
      n=$((n + 1)); live "$1" "$2" "$f" "$n" "$g" "$4" & PIDS+=("$!")
    done < <(tr ';' '\n' <<<"$PATH_GROUPS")
  done
}

{
  exec 3>&1; RUN_FD=3
  echo "== gpu_vllm steps=$STEPS families=$FAMILIES fixed=$FIXED_FAMILIES flashinfer=$FI_VERSION vllm=$VLLM_VERSION (budget ${BUDGET_S}s)"
  export FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit"
  mkdir -p "$FLASHINFER_WORKSPACE_BASE"
  RC=0
  if has install; then
    T0=$(elapsed)
    for b in "$FI_BUNDLE:--flashinfer $FI_VERSION --kernels prefill,decode,xqa" "$VL_BUNDLE:--vllm $VLLM_VERSION"; do
      [ -f "${b%%:*}/install.sh" ] || { echo "error: ${b%%:*}/install.sh not found; make it here: swa-repro bundle ${b#*:} --out ${b%%:*}"; exit 2; }
    done
    run rm -rf "$SITE" || exit 2
    run env PYTHON="$PY" bash "$FI_BUNDLE/install.sh" "$SITE" || { echo "error: the flashinfer bundle did not install"; exit 2; }
    run env PYTHON="$PY" bash "$VL_BUNDLE/install.sh" "$SITE" || { echo "error: the vllm bundle did not install"; exit 2; }
    PYTHONPATH="$SITE" run "$PY" -c "import os, sys, torch, flashinfer, vllm
site = os.path.realpath('$SITE') + '/'
print('python', sys.version.split()[0], '| torch', torch.__version__, '| flashinfer', flashinfer.__version__, '| vllm', vllm.__version__)
for m, want in ((flashinfer, '$FI_VERSION'), (vllm, '$VLLM_VERSION')):
    if not os.path.realpath(m.__file__).startswith(site) or m.__version__ != want:
        sys.exit(f'error: {m.__name__} {m.__version__} from {m.__file__}, not {want} from {site}')" \
      || { step install "$T0" 2; echo "error: $SITE is not what its bundles install (above)"; exit 2; }
    step install "$T0" 0
  fi
  if has patch; then
    T0=$(elapsed)
    run rm -rf "$SITE_FIXED" && run mkdir -p "$SITE_FIXED" && run cp -a "$SITE/vllm" "$SITE_FIXED/" \
      && run env PYTHONPATH="$ROOT:$SITE" "$PY" -m swa_repro.cli patch apply --vllm --fix cap-route \
        --source "$SITE_FIXED/$BACKEND" --in-place
    P=$?
    step patch "$T0" "$P"; echo "== patch apply --vllm: exit status $P"
    [ "$P" -ne 0 ] && { RC=1; FIXED_FAMILIES=""; echo "== live: the fixed site is skipped (the patch failed)"; }
  fi
  if has live; then
    T=$(( $(left) - RESERVE_S ))
    if [ "$T" -le "$LIVE_MARGIN_S" ]; then
      echo "== live: skipped, $(left)s left"; RC=1
    else
      T0=$(elapsed); PIDS=()
      children shipped "$SITE" "$FAMILIES" "$T"
      children fixed "$SITE_FIXED" "$FIXED_FAMILIES" "$T"
      L=0; for p in "${PIDS[@]}"; do wait "$p" || L=1; done
      for e in "$ART"/live-*.err; do [ -s "$e" ] && { echo "== $(basename "$e"):"; tail -n 5 "$e"; }; done
      for site in shipped fixed; do  # one document per site, from what its children wrote
        set -- "$ART"/live-"$site"-*.json
        [ -f "$1" ] && run env PYTHONPATH="$ROOT" "$PY" -m swa_repro.vllm.audit.live_report --merge "$ART/live-$site.json" "$@"
      done
      step live "$T0" "$L"; echo "== live: exit status $L"
      [ "$L" -ne 0 ] && RC=1
    fi
  fi
  steps_done "$RC"
  exit "$RC"
} 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
write_out "steps: $STEPS; families $FAMILIES; fixed $FIXED_FAMILIES; groups $PATH_GROUPS; flashinfer $FI_VERSION, vllm $VLLM_VERSION; exit status $RC" \
  "$ART/live-shipped.json" "$ART/live-fixed.json"
exit "$RC"
