#!/bin/bash
# seqserve on each of its HTTP or gRPC servers, then the floors of the same servers (seqserve's app
# or servicer replaced by a bare echo), in alternating rounds; server CPU per step, median (min-max)
# over the rounds (bench/docs/front-ends.md, "HTTP: the builtin server" and "gRPC: the builtin
# server"). http_servers.sh and grpc_servers.sh call this with their protocol. Run from the
# checkout root:  bench/results/servers_ab.sh grpc|http ROUNDS OUTDIR
set -eu
PROTO=$1; ROUNDS=$2; OUT=$3; mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
case $PROTO in
  grpc) FLAG=--grpc-server; TRANSPORTS=grpc-unary,grpc-stream; TITLE=gRPC
        SERVERS="builtin grpcio"; FLOORS="grpc-builtin grpc-stream" ;;
  http) FLAG=--http-server; TRANSPORTS=http-binary; TITLE="HTTP binary"
        SERVERS="builtin granian hypercorn"; FLOORS="http-builtin http-granian http-hypercorn http-httptools" ;;
  *) echo "usage: $0 grpc|http ROUNDS OUTDIR" >&2; exit 2 ;;
esac
reverse() { local out=""; for x in $1; do out="$x $out"; done; echo $out; }
COMMON="--transports $TRANSPORTS --concurrency 16 --duration 6 --warmup 2 --quiet"
for r in $(seq 1 "$ROUNDS"); do
  servers=$SERVERS; floors=$FLOORS
  if [ $(( r % 2 )) -eq 0 ]; then servers=$(reverse "$SERVERS"); floors=$(reverse "$FLOORS"); fi
  echo "=== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"
  for s in $servers; do
    "$PY" -m bench --spawn --server-arg=$FLAG=$s $COMMON --json "$OUT/seqserve-${s}_$r.json" >> "$OUT/log.txt" 2>&1
  done
  "$PY" -m bench --spawn-floor "${floors// /,}" $COMMON --no-verify --json "$OUT/floors_$r.json" >> "$OUT/log.txt" 2>&1
done
"$PY" - "$OUT" "$ROUNDS" "$TRANSPORTS" "$TITLE" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
out, rounds, transports, title = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
names = {"grpc-unary": "gRPC unary", "grpc-stream": "gRPC stream", "http-binary": "HTTP binary"}
per: dict[tuple[str, str], list[float]] = {}
for r in range(1, rounds + 1):
    for f in sorted(out.glob(f"*_{r}.json")):
        for row in json.loads(f.read_text())["runs"]:
            label = f"seqserve on {f.stem.rsplit('_', 1)[0].split('-', 1)[1]}" if f.stem.startswith("seqserve") else row["target"]
            if label == "seqserve":
                continue  # a floors' file may also hold a run of no server (its main target is none)
            assert row["errors"] == 0 and row.get("wrong", 0) == 0, (f, row)
            per.setdefault((label, row["transport"]), []).append(row["server_cpu_us_per_step"])
print(f"{title}, 16 concurrent sequences, {rounds} alternating rounds; server CPU per step, median (min-max)")
heads = ["us/step"] if len(transports) == 1 else [f"{names[t]}, us/step" for t in transports]
print("| server | " + " | ".join(heads) + " |")
print("|---|" + "--:|" * len(heads))
for label in dict.fromkeys(k[0] for k in per):
    cells = []
    for t in transports:
        vals = per.get((label, t), [])
        cells.append(f"{statistics.median(vals):.0f} ({min(vals):.0f}-{max(vals):.0f})" if vals else "-")
    print(f"| {label} | " + " | ".join(cells) + " |")
PYEOF
