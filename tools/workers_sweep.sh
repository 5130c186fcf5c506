#!/usr/bin/env bash
# Issue 27's worker-process sweep in one command, for a 16-core machine with no network
# (bench/docs/workers.md):
#
#   tools/workers_sweep.sh OUT_DIR [WHEEL_DIR]
#
# 1. installs the wheels of WHEEL_DIR (default .whl; what that machine lacks, fetched beforehand
#    with the `pip download` line in bench/docs/workers.md) into a private folder, never touching
#    the machine's own packages;
# 2. builds the C++ core from this checkout (in place, in parallel) unless it already imports;
# 3. runs `python -m bench --workers-sweep 1,2,4,8,12` on bench/models' accumulator_oldest_1024:
#    gRPC stream, gRPC unary and HTTP binary at 16 and 256 sequences, every reply verified, 6
#    generator processes, one server per worker setting.
# Everything lands in OUT_DIR (machine.txt, build.log, sweep.txt: the tables, workers_sweep.json,
# summary.txt). It finishes within 5 minutes (each step bounded by what is left of 290 s) or says
# which step ran out of time. Smaller runs for a check: WORKERS=1 LOADS=2 DURATION=0.5 ... (below).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: tools/workers_sweep.sh OUT_DIR [WHEEL_DIR]}
WHEELS=${2:-.whl}
PY=${PYTHON:-python3}
WORKERS=${WORKERS:-1,2,4,8,12}
TRANSPORTS=${TRANSPORTS:-grpc-stream,grpc-unary,http-binary}
LOADS=${LOADS:-16,256}
PROCESSES=${PROCESSES:-6}
DURATION=${DURATION:-2.5}
WARMUP=${WARMUP:-1}
# connections per generator process for gRPC: a server with worker processes shares out
# connections, so 6 processes x 4 channels leave none of 12 workers idle
CHANNELS=${CHANNELS:-4}
mkdir -p "$OUT"
SITE=$(mktemp -d /tmp/seqserve-sweep-site.XXXXXX)
trap 'rm -rf "$SITE"' EXIT
started=$(date +%s)
status=0
step() { echo "== $* ($(($(date +%s) - started)) s)" | tee -a "$OUT/summary.txt"; }
budget() { local left=$((290 - ($(date +%s) - started))); echo $((left < $1 ? (left > 5 ? left : 5) : $1)); }

step "machine"
{ "$PY" --version; echo "cpus: $(nproc)"; uptime; } >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

if compgen -G "$WHEELS/*.whl" >/dev/null; then
  step "wheels from $WHEELS"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
    >"$OUT/wheels.log" 2>&1 || { echo "wheel install failed (see wheels.log)" | tee -a "$OUT/summary.txt"; exit 1; }
fi
export PYTHONPATH="$PWD/src:$PWD:$SITE"

if ! "$PY" -c "import seqserve.engine._core" 2>/dev/null; then
  step "build"
  timeout "$(budget 120)" "$PY" -c "
from pybind11.setup_helpers import ParallelCompile; ParallelCompile(default=0).install()
import runpy, sys; sys.argv=['setup.py','build_ext','--inplace']; runpy.run_path('setup.py', run_name='__main__')" \
    >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; echo "build failed" | tee -a "$OUT/summary.txt"; exit 1; }
fi
"$PY" -m seqserve --version | tee -a "$OUT/summary.txt"
if ! "$PY" -m seqserve serve --help 2>/dev/null | grep -q -- "--workers"; then
  echo "this seqserve has no --workers: running the one-worker setting only (a baseline)" | tee -a "$OUT/summary.txt"
  WORKERS=1
fi

step "sweep: workers $WORKERS; $TRANSPORTS; $LOADS sequences; $PROCESSES generator processes"
timeout "$(budget 280)" "$PY" -m bench --spawn --server-arg=--model-repository=bench/models \
  --model accumulator_oldest_1024 --workers-sweep "$WORKERS" --transports "$TRANSPORTS" \
  --concurrency "$LOADS" --processes "$PROCESSES" --grpc-streams 0 --grpc-channels "$CHANNELS" \
  --duration "$DURATION" --warmup "$WARMUP" --pause 0.2 --verify on --quiet \
  --json "$OUT/workers_sweep.json" >"$OUT/sweep.txt" 2>&1 || status=$?
sed -n '/the worker sweep/,$p' "$OUT/sweep.txt" | tee -a "$OUT/summary.txt"
[ "$status" -eq 0 ] || tail -20 "$OUT/sweep.txt"

step "done: status $status"
exit "$status"
