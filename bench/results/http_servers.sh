#!/bin/bash
# seqserve's HTTP servers against their floors, alternating rounds (bench/results/servers_ab.sh).
# Run from the checkout root:  bench/results/http_servers.sh 3 OUTDIR
exec "$(dirname "$0")/servers_ab.sh" http "$@"
