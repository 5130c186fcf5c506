#!/bin/bash
# HTTP: seqserve's builtin server against granian and hypercorn, with seqserve's app and with
# the floors' bare app, in alternating rounds (bench/README.md, "HTTP: the builtin server").
# Run from the checkout root:  bench/results/http_servers.sh 3 OUTDIR
set -eu
ROUNDS=$1; OUT=$2; mkdir -p "$OUT"
PY=${PY:-.venv/bin/python}
COMMON="--transports http-binary --concurrency 16 --duration 6 --warmup 2 --quiet"
for r in $(seq 1 "$ROUNDS"); do
  servers="builtin granian hypercorn"; floors="http-builtin,http-granian,http-hypercorn,http-httptools"
  if [ $(( r % 2 )) -eq 0 ]; then servers="hypercorn granian builtin"; floors="http-httptools,http-hypercorn,http-granian,http-builtin"; fi
  echo "=== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"
  for s in $servers; do
    "$PY" -m bench --spawn --server-arg=--http-server=$s $COMMON --json "$OUT/seqserve-${s}_$r.json" >> "$OUT/log.txt" 2>&1
  done
  "$PY" -m bench --spawn-floor "$floors" $COMMON --no-verify --json "$OUT/floors_$r.json" >> "$OUT/log.txt" 2>&1
done
"$PY" - "$OUT" "$ROUNDS" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
out, rounds = Path(sys.argv[1]), int(sys.argv[2])
per: dict[str, list[float]] = {}
for r in range(1, rounds + 1):
    for f in sorted(out.glob(f"*_{r}.json")):
        for row in json.loads(f.read_text())["runs"]:
            label = f"seqserve on {f.stem.rsplit('_', 1)[0].split('-', 1)[1]}" if f.stem.startswith("seqserve") else row["target"]
            assert row["errors"] == 0 and row.get("wrong", 0) == 0, (f, row)
            per.setdefault(label, []).append(row["server_cpu_us_per_step"])
print(f"HTTP binary, 16 concurrent sequences, {rounds} alternating rounds; server CPU per step, median (min-max)")
print("| server | us/step |")
print("|---|--:|")
for label, vals in per.items():
    print(f"| {label} | {statistics.median(vals):.0f} ({min(vals):.0f}-{max(vals):.0f}) |")
PYEOF
