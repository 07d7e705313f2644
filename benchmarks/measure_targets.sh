#!/usr/bin/env bash
# Issue #24's targets, measured with the real make commands in a fresh clone of this checkout's HEAD:
#
#   bash benchmarks/measure_targets.sh [OUT]            # OUT: benchmarks/results/issue24_targets.json
#   taskset -c 0,1 bash benchmarks/measure_targets.sh   # on a bigger machine: the targets are for 2 cores
#   DRY_RUN=1 bash benchmarks/measure_targets.sh        # print the steps, run nothing
#
# In order, each timed (wall clock, with the 1-minute load average before and after), its output kept:
#   make_test_from_nothing  `make test` in the fresh clone: no venv, empty uv, pip and swa-repro caches
#   suite_warm              `make test` again: the venv and the caches as the first run left them
#   repro_cold              `make repro`: its first run there, empty swa-repro and bytecode caches
#   repro_warm              `make repro` again
# Both `make test` runs add --durations=10 to the Makefile's PYTEST_ARGS (reporting only). Then
# benchmarks/targets_report.py collects the logs into OUT; `python -m benchmarks.report` renders
# REPORT.md's section from it. Expect ~15-25 minutes and ~4 GB in the temp folder (the pinned stack
# downloaded); run it once, on a quiet machine, with network access.
#
# KEEP_UV_CACHE=1 reuses your uv cache (the install then downloads nothing; the file says so);
# WORK=DIR measures in DIR (default: a new temp folder, removed at the end unless KEEP_WORK=1).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/benchmarks/results/issue24_targets.json}
STEPS=(make_test_from_nothing suite_warm repro_cold repro_warm)

if [ -n "${DRY_RUN:-}" ]; then
  WORK=${WORK:-/tmp/swa-repro-targets-XXXXXX}
else
  WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/swa-repro-targets-XXXXXX")}
fi
CLONE=$WORK/clone
COMMIT=$(git -C "$REPO" rev-parse HEAD)

# what "from nothing" means: every cache in $WORK (uv's and swa-repro's are under XDG_CACHE_HOME)
ORIG_UV_CACHE=${UV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/uv}
export XDG_CACHE_HOME=$WORK/cache
if [ -n "${KEEP_UV_CACHE:-}" ]; then export UV_CACHE_DIR=$ORIG_UV_CACHE; else export UV_CACHE_DIR=$WORK/cache/uv; fi
export PIP_NO_CACHE_DIR=1
unset SWA_REPRO_CACHE SWA_REPRO_NO_CACHE VIRTUAL_ENV PYTHONPYCACHEPREFIX

loadavg() { if [ -r /proc/loadavg ]; then cut -d' ' -f1-3 /proc/loadavg; fi; }

step() {  # step NAME ARGS...: run ARGS in the clone, timed; NAME.log, NAME.meta in $WORK
  local name=$1 t0 t1 lb la rc=0 shown="" a
  shift
  for a in "$@"; do [[ $a == *" "* ]] && a="'$a'"; shown+="${shown:+ }$a"; done
  if [ -n "${DRY_RUN:-}" ]; then echo "$name: (cd $CLONE && $shown)"; return 0; fi
  echo "== $name: $shown" >&2
  lb=$(loadavg)
  t0=$(date +%s.%N)
  (cd "$CLONE" && "$@") >"$WORK/$name.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  la=$(loadavg)
  printf 'command=%s\nstart=%s\nend=%s\nreturncode=%s\nloadavg_before=%s\nloadavg_after=%s\n' \
    "$shown" "$t0" "$t1" "$rc" "$lb" "$la" >"$WORK/$name.meta"
  echo "   $name: exit $rc, $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s" >&2
  if [ -f "$CLONE/artifacts/summary.json" ] && [[ $name == repro_* ]]; then
    cp "$CLONE/artifacts/summary.json" "$WORK/$name.summary.json"
  fi
}

if [ -z "${DRY_RUN:-}" ]; then
  git clone -q --no-local "$REPO" "$CLONE"
  git -C "$CLONE" checkout -q "$COMMIT"
  git -C "$REPO" status --porcelain --untracked-files=no | grep -q . && DIRTY=1 || DIRTY=
  printf 'commit=%s\nsource_dirty=%s\nuv_cache=%s\ncores=%s\nsteps=%s\n' "$COMMIT" "$DIRTY" \
    "$([ -n "${KEEP_UV_CACHE:-}" ] && echo shared || echo empty)" "$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" "${STEPS[*]}" >"$WORK/run.meta"
fi
PYTEST_ARGS_MEASURED="$(sed -n 's/^PYTEST_ARGS *?= *//p' "$REPO/Makefile") --durations=10"

step make_test_from_nothing make test "PYTEST_ARGS=$PYTEST_ARGS_MEASURED"
step suite_warm make test "PYTEST_ARGS=$PYTEST_ARGS_MEASURED"
export XDG_CACHE_HOME=$WORK/cache-repro  # an empty swa-repro cache for make repro's first run
step repro_cold make repro "PYTHONPYCACHEPREFIX=$WORK/pycache-repro"
step repro_warm make repro "PYTHONPYCACHEPREFIX=$WORK/pycache-repro"

PY=python3
[ -x "$CLONE/.venv/bin/python" ] && PY=$CLONE/.venv/bin/python
if [ -n "${DRY_RUN:-}" ]; then echo "collect: $PY $REPO/benchmarks/targets_report.py collect $WORK --out $OUT"; exit 0; fi
"$PY" "$REPO/benchmarks/targets_report.py" collect "$WORK" --out "$OUT"
if [ "$OUT" -ef "$REPO/benchmarks/results/issue24_targets.json" ]; then  # REPORT.md renders the committed file
  (cd "$REPO" && "$PY" -m benchmarks.report) || echo "then: python -m benchmarks.report (renders REPORT.md)" >&2
fi
if [ -z "${KEEP_WORK:-}" ]; then rm -rf "$WORK"; else echo "kept $WORK" >&2; fi
