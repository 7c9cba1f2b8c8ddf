#!/usr/bin/env bash
# Presence at scale (docs/benchmarks.md, "Presence"): N clients in one document, each moving
# its cursor (an awareness change) once a second for DUR; 20 of them time every other
# client's change. Server CPU per change and delivery latency, Quire beside the floor (which
# relays frame by frame) and the y-websocket server, each size on a fresh process.
# Bounded: every run stops by itself.
#
# Usage: bench/presence.sh  (env: SIZES="300 500 1000 1500", DUR=60s,
#   SERVERS="floor quire y-websocket"; results in target/bench/presence.jsonl)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p quire-server -p quire-bench
(cd bench/peers && npm ci --no-audit --no-fund >/dev/null)
source bench/servers.sh
RESULTS="$OUT/presence.jsonl"
: > "$RESULTS"
SIZES="${SIZES:-300 500 1000 1500}"
DUR="${DUR:-60s}"
SERVERS="${SERVERS:-floor quire y-websocket}"
# 1,500 clients in one document: past Quire's default of 1,000 per document.
QUIRE_ARGS="--max-connections-per-doc 2000"
port=4760
for n in $SIZES; do
  for server in $SERVERS; do
    port=$((port + 1)); dir=$(mktemp -d)
    start_server "$server" "$port" "$dir"
    RESULTS_BEFORE=$(wc -l < "$RESULTS")
    "$BENCH" presence --clients "$n" --duration "$DUR" --url "ws://127.0.0.1:$port" \
      --server-pid "$PID" --label "$server" --prefix "p$port" 2>&1 \
      | tee -a "$OUT/log.txt" | grep '^{' >> "$RESULTS" || true
    [ "$(wc -l < "$RESULTS")" -gt "$RESULTS_BEFORE" ] || echo "$server $n: no result" >&2
    stop_server; rm -rf "$dir"
  done
done
grep -h '"presence"' "$RESULTS"
