#!/bin/bash
# gRPC: seqserve's builtin server against grpc.aio, with seqserve's servicer and with the floors'
# bare echo servicer, unary and stream, in alternating rounds (bench/README.md, "gRPC: the builtin
# server"). Run from the checkout root:  bench/results/grpc_servers.sh 3 OUTDIR
set -eu
ROUNDS=$1; OUT=$2; mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
COMMON="--transports grpc-unary,grpc-stream --concurrency 16 --duration 6 --warmup 2 --quiet"
for r in $(seq 1 "$ROUNDS"); do
  servers="builtin grpcio"; floors="grpc-builtin,grpc-stream"
  if [ $(( r % 2 )) -eq 0 ]; then servers="grpcio builtin"; floors="grpc-stream,grpc-builtin"; fi
  echo "=== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"
  for s in $servers; do
    "$PY" -m bench --spawn --server-arg=--grpc-server=$s $COMMON --json "$OUT/seqserve-${s}_$r.json" >> "$OUT/log.txt" 2>&1
  done
  "$PY" -m bench --spawn-floor "$floors" $COMMON --no-verify --json "$OUT/floors_$r.json" >> "$OUT/log.txt" 2>&1
done
"$PY" - "$OUT" "$ROUNDS" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
out, rounds = Path(sys.argv[1]), int(sys.argv[2])
per: dict[tuple[str, str], list[float]] = {}
for r in range(1, rounds + 1):
    for f in sorted(out.glob(f"*_{r}.json")):
        for row in json.loads(f.read_text())["runs"]:
            label = f"seqserve on {f.stem.rsplit('_', 1)[0].split('-', 1)[1]}" if f.stem.startswith("seqserve") else row["target"]
            if label == "seqserve":
                continue  # the floors' file also holds a run of no server (its main target is none)
            assert row["errors"] == 0 and row.get("wrong", 0) == 0, (f, row)
            per.setdefault((label, row["transport"]), []).append(row["server_cpu_us_per_step"])
print(f"gRPC, 16 concurrent sequences, {rounds} alternating rounds; server CPU per step, median (min-max)")
print("| server | gRPC unary, us/step | gRPC stream, us/step |")
print("|---|--:|--:|")
for label in dict.fromkeys(k[0] for k in per):
    cells = []
    for t in ("grpc-unary", "grpc-stream"):
        vals = per.get((label, t), [])
        cells.append(f"{statistics.median(vals):.0f} ({min(vals):.0f}-{max(vals):.0f})" if vals else "-")
    print(f"| {label} | {cells[0]} | {cells[1]} |")
PYEOF
