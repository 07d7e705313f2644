#!/usr/bin/env bash
# One command on an air-gapped GPU machine (torch, nvcc, ninja; no network, no sglang):
#   bash scripts/gpu_evidence.sh VERSION [CASES]
# VERSION: a flashinfer bundle carried in .bundle/VERSION/ (made here by
#   `swa-repro bundle --flashinfer VERSION --out .bundle/VERSION`), e.g. 0.6.12 or 0.7.2.post1.
# CASES: `all` (default) or comma-separated names from swa_repro/recording_cases.py.
# It unpacks the bundle into /tmp/site, JIT-builds into .fi_jit/ (ignored; keep it between calls
# to skip rebuilds: fa2 modules take ~30 s, fa3 ~100 s, built in parallel), runs
# `swa-repro record` into recordings/VERSION/, and writes a log. Finishes within BUDGET_S
# (default 530 s). If $OUT is set (the device runner's return folder), the recordings and the log
# are copied there too.
set -uo pipefail
VERSION="${1:?usage: bash scripts/gpu_evidence.sh VERSION [CASES]}"
CASES="${2:-all}"
BUDGET_S="${BUDGET_S:-530}"
START=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
LOGDIR="artifacts/gpu_evidence"
mkdir -p "$LOGDIR"
LOG="$LOGDIR/record-$VERSION-$(date -u +%Y%m%dT%H%M%SZ).log"

{
  echo "== gpu_evidence $VERSION cases=$CASES (budget ${BUDGET_S}s)"
  if [ ! -x ".bundle/$VERSION/install.sh" ] && [ ! -f ".bundle/$VERSION/install.sh" ]; then
    echo "error: .bundle/$VERSION/install.sh not found; make it with: swa-repro bundle --flashinfer $VERSION --out .bundle/$VERSION"
    exit 2
  fi
  rm -rf /tmp/site
  if ! PYTHON="$PY" bash ".bundle/$VERSION/install.sh" /tmp/site; then
    echo "error: installing .bundle/$VERSION into /tmp/site failed (bundle made for another python? see above)"
    exit 2
  fi
  export PYTHONPATH="$ROOT:/tmp/site"
  export FLASHINFER_WORKSPACE_BASE="$ROOT/.fi_jit"
  mkdir -p "$FLASHINFER_WORKSPACE_BASE"
  echo "PYTHONPATH=$PYTHONPATH FLASHINFER_WORKSPACE_BASE=$FLASHINFER_WORKSPACE_BASE"
  VERSION="$VERSION" "$PY" - <<'EOF' || exit 2
import os, sys, torch, flashinfer
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| flashinfer", flashinfer.__version__, "from", flashinfer.__file__)
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE")
if not flashinfer.__file__.startswith("/tmp/site/") or flashinfer.__version__ != os.environ["VERSION"]:
    sys.exit("error: flashinfer did not come from the bundle in /tmp/site")
EOF
  nvcc --version | tail -n 1
  LEFT=$(( BUDGET_S - ($(date +%s) - START) ))
  echo "== record (timeout ${LEFT}s)"
  timeout --signal=INT --kill-after=15 "$LEFT" "$PY" -c 'import sys; from swa_repro.cli import main; sys.exit(main())' record --cases "$CASES" --out recordings --force
  RC=$?
  echo "== record exit status $RC after $(( $(date +%s) - START ))s"
  ls -la "recordings/$VERSION" 2>/dev/null
  exit $RC
} 2>&1 | tee "$LOG"
RC=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  # the device returns at most 8 files: one archive of the recordings, plus the log
  tar -czf "$OUT/recordings-$VERSION.tar.gz" "recordings/$VERSION" 2>/dev/null
  cp "$LOG" "$OUT/"
fi
exit "$RC"
