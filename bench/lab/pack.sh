#!/usr/bin/env bash
# Pack a chain's results (bench/lab/chain.sh) into one archive under $OUT: the device
# call returns at most 8 files.  chain.log and the step logs' tails are printed first.
RESULTS=${RESULTS:-/tmp/chain}
cat "$RESULTS/chain.log" 2>/dev/null
for f in "$RESULTS"/*.log; do [ "$(basename "$f")" = chain.log ] || { echo "== $f"; tail -5 "$f"; }; done
tar -czf "$OUT/results.tgz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")" 2>/dev/null
