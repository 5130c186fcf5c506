#!/bin/bash
# A worker's tensor copies through region.write / region.read against views (region.buffer):
# alternating busy_workers runs of two checkouts, each with its core built in place.
# Run from the checkout root:  bench/results/workers_copy_ab.sh ROUNDS BEFORE_TREE AFTER_TREE SEQLOAD
set -eu
rounds=$1 before=$2 after=$3 seqload=$4
out=$(mktemp -d)
for r in $(seq "$rounds"); do
  for side in before after; do
    tree=$before; [ "$side" = after ] && tree=$after
    (cd "$tree" && PYTHONPATH="$tree/src" python -m bench.studies.busy_workers --reps 1 --sequences 64,256 \
      --seqload "$seqload" --json "$out/${side}_$r.json" > /dev/null 2>&1)
    python3 - "$out/${side}_$r.json" "$side r$r" <<'PY'
import json, sys
for m in json.load(open(sys.argv[1]))["medians"]:
    print(f"{sys.argv[2]:<10} sequences {m['sequences']:>3}  steps/s {m['steps_per_s']:>6.0f}  workers us/step "
          f"{m['workers_us_per_step']:>6.1f}  engine us/step {m['engine_us_per_step']:>5.1f}  batch {m['mean_batch']:>5.1f}  "
          f"machine busy {m['machine_busy'] * 100:>3.0f}%")
PY
  done
done
