#!/bin/bash
# Alternating rounds of the wire work's comparison (bench/docs/front-ends.md, "Where a unary call's time
# goes"): seqserve before (BEFORE_PY: a venv with the baseline installed), after (AFTER_PY),
# Triton 2.51 from ../shared/anchors/triton (accum_py), and the bench's floors, one after the
# other in each round. Run from the checkout root:
#   BEFORE_PY=/path/to/main/.venv/bin/python AFTER_PY=.venv/bin/python bench/results/wire_ab.sh 3 OUTDIR
set -u
ROUNDS=$1; OUT=$2; mkdir -p "$OUT"
BENCH_PY=${AFTER_PY}
TR=http-binary,grpc-unary,grpc-stream
COMMON="--transports $TR --concurrency 16 --duration 6 --warmup 2 --grpc-streams 0 --quiet"
HP=${TRITON_HTTP_PORT:-45811}; GP=$(( HP + 1 ))
TPID=$(ANCHOR_LOG=$OUT/triton.log ../shared/anchors/triton/start_triton.sh "$HP" "$GP" | head -1)
for r in $(seq 1 "$ROUNDS"); do
  for side in before after triton floors; do
    echo "=== round $r $side $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/$side.txt"
    case $side in
      before) "$BEFORE_PY" -m bench --spawn $COMMON --json "$OUT/${side}_$r.json" >> "$OUT/$side.txt" 2>&1 ;;
      after)  "$AFTER_PY" -m bench --spawn $COMMON --json "$OUT/${side}_$r.json" >> "$OUT/$side.txt" 2>&1 ;;
      triton) "$BENCH_PY" -m bench --http-url 127.0.0.1:$HP --grpc-url 127.0.0.1:$GP --model accum_py \
                --server-pid "$TPID" $COMMON --json "$OUT/${side}_$r.json" >> "$OUT/$side.txt" 2>&1 ;;
      floors) "$BENCH_PY" -m bench --spawn-floor auto $COMMON --json "$OUT/${side}_$r.json" >> "$OUT/$side.txt" 2>&1 ;;
    esac
  done
done
kill "$TPID"
