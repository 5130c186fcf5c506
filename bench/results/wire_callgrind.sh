#!/bin/bash
# Instructions per step of a seqserve server under callgrind (load-independent, user space only:
# system calls and the kernel's side of thread wake-ups are not counted). The server starts
# uninstrumented; 300 steps warm it up; instrumentation covers one bench run of STEPS steps
# (and its drain), and the total is divided by the steps the server answered.
#   bench/results/wire_callgrind.sh PYTHON TRANSPORT STEPS OUTPREFIX
# PYTHON: the interpreter of the seqserve under test (its venv); the bench runs on .venv.
set -u
PY=$1; TR=$2; STEPS=$3; OUT=$4
HP=$(( 30000 + RANDOM % 20000 )); GP=$(( HP + 1 ))
ROOT=$(pwd)
valgrind --tool=callgrind --callgrind-out-file="$OUT.cg.%p" --instr-atstart=no --dump-instr=no \
  "$PY" -m seqserve serve --host 127.0.0.1 --http-port $HP --grpc-port $GP --metrics-port $(( HP + 2 )) \
  --log-level warning > "$OUT.server.log" 2>&1 &
VPID=$!
for _ in $(seq 1 240); do curl -sf "localhost:$HP/v2/health/ready" >/dev/null && break; sleep 1; done
ARGS="--http-url 127.0.0.1:$HP --grpc-url 127.0.0.1:$GP --transports $TR --concurrency 16 --warmup 0 --grpc-streams 0 --quiet --request-timeout 120"
"$ROOT/.venv/bin/python" -m bench $ARGS --steps 300 > /dev/null 2>&1
callgrind_control -i on $VPID > /dev/null
"$ROOT/.venv/bin/python" -m bench $ARGS --steps "$STEPS" --json "$OUT.json" > "$OUT.bench.txt" 2>&1
callgrind_control -i off $VPID > /dev/null
callgrind_control -d $VPID > /dev/null
kill -INT $VPID; wait $VPID
python3 - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
total = max(int(l.split()[1]) for f in glob.glob(out + ".cg.*") for l in open(f) if l.startswith("totals:"))
r = json.load(open(out + ".json"))["runs"][0]
print(f"{out}: {total} Ir over {r['steps_total']} steps = {total / r['steps_total']:,.0f} Ir/step "
      f"(errors {r['errors']}, wrong {r['wrong']})")
PY
