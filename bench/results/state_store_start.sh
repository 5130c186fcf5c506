#!/bin/bash
# What a START costs now that it waits for its ownership record in the state store (issue 24):
# the load generator on the demo accumulator, short sequences (every other step a START) and
# 20-step ones, without a store, with a store as before (registration in the background:
# $SEQSERVE_BEFORE_SRC, a checkout's src/ of the earlier code) and with it now; alternating rounds.
# Run from the checkout root:  bench/results/state_store_start.sh 2 > bench/results/state_store_start.txt
set -euo pipefail
rounds=${1:-2}
dir=$(mktemp -d)
port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >/dev/null &
redis_pid=$!
trap 'kill $redis_pid; rm -rf "$dir"' EXIT
sleep 0.5
now_src=${PYTHONPATH:-$PWD/src}
echo "# $(python -c 'import platform; print(platform.platform())'), $(nproc) CPUs; load average $(cut -d' ' -f1 /proc/loadavg) at the start"
echo "# http-binary and grpc-unary, concurrency 1 and 16, 6 s per run after 2 s of warmup; every reply verified"
for r in $(seq "$rounds"); do
  for len in 2 20; do
    for what in "no store" "store, before" "store, now"; do
      args=(--spawn --transports http-binary,grpc-unary --concurrency 1,16 --duration 6 --warmup 2 --seq-len "$len" --quiet)
      src=$now_src
      case $what in
        "store, before") args+=(--server-arg=--state-store=redis://127.0.0.1:$port/0); src=${SEQSERVE_BEFORE_SRC:?} ;;
        "store, now") args+=(--server-arg=--state-store=redis://127.0.0.1:$port/0) ;;
      esac
      echo "## round $r, --seq-len $len, $what"
      PYTHONPATH=$src python -m bench "${args[@]}" 2>&1 | grep -v '^$'
    done
  done
done
