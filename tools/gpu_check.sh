#!/usr/bin/env bash
# The device check of GPU instances (docs/gpu.md), in one command, on a machine with an NVIDIA
# GPU and no network:
#
#   tools/gpu_check.sh OUT_DIR [WHEEL_DIR]
#
# 1. installs the wheels of WHEEL_DIR (default .whl; what that machine lacks, fetched beforehand
#    with the `pip download` line in docs/gpu.md) into a private folder, never touching the
#    machine's own packages;
# 2. builds the C++ core from this checkout (in place, in parallel);
# 3. runs tests/gpu with SEQSERVE_REQUIRE_GPU=1 (a skip is a failure there) and the CPU-side
#    device tests;
# 4. runs the GPU bench (bench.studies.gpu: LSTM steps/s and p99 at 1, 64 and 512 sequences,
#    GPU against CPU, and the state copies per batch).
# Everything it prints lands in OUT_DIR (machine.txt, build.log, tests.txt, tests.xml, bench.txt,
# gpu_bench.json, summary.txt). It finishes within 6 minutes or says which step ran out of time.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: tools/gpu_check.sh OUT_DIR [WHEEL_DIR]}
WHEELS=${2:-.whl}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
SITE=$(mktemp -d /tmp/seqserve-gpu-site.XXXXXX)
started=$(date +%s)
status=0
step() { echo "== $* ($(($(date +%s) - started)) s)" | tee -a "$OUT/summary.txt"; }
# The whole check stays within 6 minutes: each step gets its own bound, and never more than
# what is left of 340 s (the rest is for the wheels and the summary).
budget() { local left=$((340 - ($(date +%s) - started))); echo $((left < $1 ? (left > 5 ? left : 5) : $1)); }

step "machine"
{ nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$PY" --version; nproc; } >"$OUT/machine.txt"
cat "$OUT/machine.txt"

step "wheels from $WHEELS"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
    >"$OUT/wheels.log" 2>&1 || { echo "wheel install failed (see wheels.log)" | tee -a "$OUT/summary.txt"; exit 1; }
fi
export PYTHONPATH="$SITE"

step "build"
timeout "$(budget 90)" "$PY" -c "
from pybind11.setup_helpers import ParallelCompile; ParallelCompile(default=0).install()
import runpy, sys; sys.argv=['setup.py','build_ext','--inplace']; runpy.run_path('setup.py', run_name='__main__')" \
  >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; echo "build failed" | tee -a "$OUT/summary.txt"; exit 1; }
export PYTHONPATH="$PWD/src:$PWD:$SITE"
"$PY" -c "import seqserve; from seqserve.engine.device.probe import probe_gpus; print(seqserve.__version__, probe_gpus())" \
  | tee -a "$OUT/summary.txt"

step "tests/gpu"
SEQSERVE_REQUIRE_GPU=1 timeout "$(budget 150)" "$PY" -m pytest -q -p no:cacheprovider -rs --junitxml "$OUT/tests.xml" \
  tests/gpu tests/unit/test_device_rows.py tests/unit/test_device_state_table.py tests/unit/test_device_placement.py \
  tests/unit/test_gpu_metrics.py >"$OUT/tests.txt" 2>&1 || status=1
tail -5 "$OUT/tests.txt" | tee -a "$OUT/summary.txt"

step "bench"
timeout "$(budget 110)" "$PY" -m bench.studies.gpu --seconds 3 --out "$OUT" >"$OUT/bench.txt" 2>&1 || status=1
tee -a "$OUT/summary.txt" <"$OUT/bench.txt"

step "done: status $status"
rm -rf "$SITE"
exit $status
