#!/bin/bash
# gRPC unary: Triton 2.51, seqserve and the floor of each way to serve gRPC from Python, in
# alternating rounds (bench/docs/front-ends.md, "gRPC unary: the floors of each way to serve it").
# Triton's accum_py runs with 2 instances (16 slots, as seqserve's accumulator and as
# bench.vs_triton's default). Run from the checkout root:
#   bench/results/unary_floors.sh 3 OUTDIR
set -eu
ROUNDS=$1; OUT=$2; mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
COMMON="--transports grpc-unary --concurrency 16 --duration 6 --warmup 2 --quiet"
FLOORS=grpc-stream,grpc-sync,grpc-sync-handoff,grpc-h2
ANCHOR=${SEQSERVE_TRITON_ANCHOR:-../shared/anchors/triton/start_triton.sh}
rm -rf "$OUT/triton-repo"; cp -r "$(dirname "$ANCHOR")/models" "$OUT/triton-repo"
sed -i 's/count: 1 kind/count: 2 kind/' "$OUT/triton-repo/accum_py/config.pbtxt"
HP=${TRITON_HTTP_PORT:-45831}; GP=$(( HP + 1 ))
TPID=$(ANCHOR_LOG=$OUT/triton.log "$ANCHOR" "$HP" "$GP" "$(realpath "$OUT/triton-repo")" | head -1)
trap 'kill "$TPID" 2>/dev/null || true' EXIT
sleep 3
for r in $(seq 1 "$ROUNDS"); do
  order="triton seqserve floors"; [ $(( r % 2 )) -eq 0 ] && order="floors seqserve triton"
  for side in $order; do
    echo "=== round $r $side $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/$side.txt"
    case $side in
      triton) "$PY" -m bench --http-url 127.0.0.1:$HP --grpc-url 127.0.0.1:$GP --model accum_py \
                --server-pid "$TPID" $COMMON --json "$OUT/${side}_$r.json" >> "$OUT/$side.txt" 2>&1 ;;
      seqserve) "$PY" -m bench --spawn $COMMON --json "$OUT/${side}_$r.json" >> "$OUT/$side.txt" 2>&1 ;;
      floors) "$PY" -m bench --spawn-floor $FLOORS $COMMON --no-verify --json "$OUT/${side}_$r.json" >> "$OUT/$side.txt" 2>&1 ;;
    esac
  done
done
"$PY" - "$OUT" "$ROUNDS" <<'PYEOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
per = {}  # label -> [srv us/step per round]
for r in range(1, rounds + 1):
    for side in ("triton", "seqserve", "floors"):
        doc = json.load(open(f"{out}/{side}_{r}.json"))
        for row in doc["runs"]:
            label = {"triton": "Triton 2.51 (accum_py, 16 slots)", "seqserve": "seqserve (accumulator)"}.get(side, row["target"])
            per.setdefault(label, {})[r] = row["server_cpu_us_per_step"]
tri = per["Triton 2.51 (accum_py, 16 slots)"]
print(f"gRPC unary, 16 concurrent sequences, {rounds} alternating rounds; server CPU per step, median (min-max)")
print("| server | us/step | / Triton (per round, median) |")
print("|---|---|---|")
for label, by_round in per.items():
    vals = [by_round[r] for r in sorted(by_round)]
    ratios = [by_round[r] / tri[r] for r in sorted(by_round)]
    print(f"| {label} | {statistics.median(vals):.0f} ({min(vals):.0f}-{max(vals):.0f}) | "
          f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")
PYEOF
