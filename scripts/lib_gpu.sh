# Shell functions shared by scripts/gpu_sglang.sh, gpu_fix.sh, gpu_family.sh and gpu_vllm.sh: sourced, never run.
# Sourcing it also starts each script the same way (below): the clock (START), the repository root as
# the working directory (ROOT), python (PY) and the flashinfer bundle of FI_VERSION (BUNDLE_DIR, FI_BUNDLE).
# The caller sets FI_VERSION before sourcing it, and STEPS, BUDGET_S, SGLANG_VERSION, SG_BUNDLE,
# NB_BUNDLE (empty: no notebooks bundle wanted), SITE and (for step) ART; DRY_RUN=1 prints each command instead of
# running it; CMD_LOG, when set, is a file every command run() runs is also appended to; RUN_FD, when
# set, the file descriptor run() shows each command on (default 2: stderr, redirected with the command).

START=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
PY="${PYTHON:-python3}"
BUNDLE_DIR="${BUNDLE_DIR:-$ROOT/.bundle}"
FI_BUNDLE="$BUNDLE_DIR/fi-${FI_VERSION:-}"

has() { case ",$STEPS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
run() {
  echo "+ $*" >&"${RUN_FD:-2}"
  [ -z "${CMD_LOG:-}" ] || echo "$*" >> "$CMD_LOG"
  [ -n "${DRY_RUN:-}" ] || "$@"
}
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
elapsed() { echo $(( $(date +%s) - START )); }
step() {  # NAME START RC: one row of $ART/steps.tsv (seconds from the script's start); the end read once,
  local now; now=$(elapsed)  # so that its seconds are end - start even when a second turns between two reads
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$now" $(( now - $2 )) "$3" >> "$ART/steps.tsv"
}

steps_done() {  # RC: the console's last lines: $ART/steps.tsv, then the total seconds and RC
  echo "== seconds per step (name, start, end, seconds, exit status):"; cat "$ART/steps.tsv" 2>/dev/null
  echo "== done after $(elapsed)s, exit status $1"
}
steps_lines() {  # gpu.txt's seconds per step ($ART/steps.tsv)
  echo "seconds per step (name, start, end, seconds, exit status; from the script's start):"
  cat "$ART/steps.tsv" 2>/dev/null
}
install_bundles() {  # [SITE]: a fresh site from the flashinfer bundle, the notebooks bundle, then sglang's
  local site="${1:-$SITE}"
  if [ ! -f "$FI_BUNDLE/install.sh" ]; then
    echo "error: $FI_BUNDLE/install.sh not found; make it here: swa-repro bundle --flashinfer $FI_VERSION --out .bundle/fi-$FI_VERSION"
    return 2
  fi
  if [ ! -f "$SG_BUNDLE/install.sh" ]; then
    echo "error: $SG_BUNDLE/install.sh not found; make it here: swa-repro bundle --sglang $SGLANG_VERSION --out .bundle/sglang-$SGLANG_VERSION"
    return 2
  fi
  run rm -rf "$site" || return 2
  run env PYTHON="$PY" bash "$FI_BUNDLE/install.sh" "$site" || { echo "error: the flashinfer bundle did not install"; return 2; }
  if [ -z "${NB_BUNDLE:-}" ]; then
    :  # the caller runs no notebooks
  elif [ -f "$NB_BUNDLE/install.sh" ]; then
    run env PYTHON="$PY" bash "$NB_BUNDLE/install.sh" "$site" || { echo "error: the notebooks bundle did not install"; return 2; }
  else
    echo "note: no $NB_BUNDLE: the notebooks step will fail (swa-repro bundle --notebooks --out .bundle/notebooks)"
  fi
  run env PYTHON="$PY" bash "$SG_BUNDLE/install.sh" "$site" || { echo "error: the sglang bundle did not install"; return 2; }
}

verify_site() {  # [SITE [FI_SITE]]: sglang and the sgl_kernel stub must come from SITE's path, flashinfer from FI_SITE (default SITE)
  local site="${1:-$SITE}" fi_site="${2:-${1:-$SITE}}"
  local path="$site"; [ "$fi_site" = "$site" ] || path="$site:$fi_site"
  PYTHONPATH="$ROOT:$path" FI_VERSION="$FI_VERSION" SGLANG_VERSION="$SGLANG_VERSION" SITE="$site" FI_SITE="$fi_site" run "$PY" - <<'EOF2'
import os, sys, torch, flashinfer, sglang, sgl_kernel
site, fi_site = (os.path.realpath(os.environ[k]) + "/" for k in ("SITE", "FI_SITE"))
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| flashinfer", flashinfer.__version__, "| sglang", sglang.__version__, "|", sgl_kernel.provenance()["replaces"])
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE")
for mod, want, where in ((flashinfer, os.environ["FI_VERSION"], fi_site), (sglang, os.environ["SGLANG_VERSION"], site)):
    if not os.path.realpath(mod.__file__).startswith(where) or mod.__version__ != want:
        sys.exit(f"error: {mod.__name__} {mod.__version__} from {mod.__file__}, not {want} from {where}")
if not getattr(sgl_kernel, "__swa_repro_stub__", False):
    sys.exit(f"error: sgl_kernel from {sgl_kernel.__file__} is not the bundle's stub")
EOF2
}

OUT_MAX_FILES=8  # the device returns at most 8 files (16 MiB each) of a call: write_out never leaves more in $OUT

write_out() {  # LINE FILE...: with $OUT set (and no DRY_RUN), $OUT/gpu.txt (machine_lines, LINE, the seconds
  # per step, the commands in the order started), the log $LOG, and each FILE that exists, xz-compressed; where
  # they would make more than OUT_MAX_FILES, the FILEs' .xz go into one uncompressed $OUT/data.tar instead (gpu.txt
  # names them; swa_repro.sglang.audit.family_evidence reads a member where its file is absent)
  [ -n "${OUT:-}" ] && [ -z "${DRY_RUN:-}" ] || return 0
  local line=$1 f files=() names=() dir; shift
  for f in "$@"; do [ -f "$f" ] && { files+=("$f"); names+=("$(basename "$f").xz"); }; done
  [ $(( ${#files[@]} + 2 )) -le "$OUT_MAX_FILES" ] && names=()
  { machine_lines; echo "$line"
    [ "${#names[@]}" -eq 0 ] || echo "packed into data.tar (over $OUT_MAX_FILES files, the most a call returns): ${names[*]}"
    steps_lines; echo "commands, in the order started:"; cat "$CMD_LOG"; } > "$OUT/gpu.txt" 2>&1
  cp "$LOG" "$OUT/"
  dir="$OUT"; [ "${#names[@]}" -eq 0 ] || dir=$(mktemp -d)
  for f in "${files[@]}"; do xz -9 -c "$f" > "$dir/$(basename "$f").xz"; done
  if [ "$dir" != "$OUT" ]; then tar -cf "$OUT/data.tar" -C "$dir" "${names[@]}"; rm -rf "$dir"; fi
  return 0
}

machine_lines() {  # gpu.txt's head: the date, the GPU, its driver, torch and the commit the copy ran
  echo "date -u: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nvidia-smi -L:"; nvidia-smi -L 2>&1
  echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -n 1)"
  echo "torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
  echo "git rev-parse HEAD: $(git rev-parse HEAD 2>&1)"
  echo "code digest: $(code_digest)"
}

code_digest() {  # the code the copy ran, whatever its git metadata says (the device copy's HEAD lags the
  # tree it runs): sha256 of swa_repro/ and scripts/ sources. To match a commit C:
  #   d=$(mktemp -d); git archive C swa_repro scripts | tar -x -C "$d"; (cd "$d" && . scripts/lib_gpu.sh && code_digest)
  find swa_repro scripts -type f \( -name '*.py' -o -name '*.sh' \) -not -path '*/__pycache__/*' | LC_ALL=C sort \
    | xargs sha256sum | sha256sum | cut -c1-16
}
