#!/usr/bin/env bash
# A document of many items, most of them deleted (docs/benchmarks.md, "Many items"): the
# editing trace replayed REPLAYS times (1,250: about 10 million items), each replay by a client
# of its own, every 10th replay's text kept (bench/src/items.rs; the replays are generated once
# into target/bench/items-*.bin). Per server, on a fresh process:
#   - uploaded one replay per update, then the first client's sync, RSS loaded, a join storm of
#     STORM clients and typing (`quire-bench memory --trace-replays`);
#   - the floor restarted with the document's state in a file (QUIRE_FLOOR_LOAD): its load of
#     the document from storage when its first client opens it (decode and integrate);
#   - the y-websocket server again, given the whole state as one update (its load; over
#     100 MiB its WebSocket refuses so long a message);
#   - Quire after a restart (loaded from storage by its first client), then killed (SIGKILL: no
#     final snapshot, the typed updates stay in the log) and `quire compact` run on its store,
#     timed: the document loaded, encoded and its snapshot written.
# Bounded: every run stops by itself. Usage: bench/items.sh (results in
# target/bench/items.jsonl; env REPLAYS=1250, STORM=50, SERVERS="floor quire y-websocket").
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p quire-server -p quire-bench
(cd bench/peers && npm ci --no-audit --no-fund >/dev/null)
source bench/servers.sh
RESULTS="$OUT/items.jsonl"
[ -n "${APPEND:-}" ] || : > "$RESULTS"
REPLAYS="${REPLAYS:-1250}"
STORM="${STORM:-50}"
SERVERS="${SERVERS:-floor quire y-websocket}"
QUIRE_ARGS="--snapshot-updates 50 --snapshot-log-percent 0"
port=4900
measure() { # label port args...
  local label=$1 p=$2; shift 2
  "$BENCH" memory --trace-replays "$REPLAYS" --clients "$STORM" --url "ws://127.0.0.1:$p" \
    --server-pid "$PID" --label "$label" --prefix "i$p" "$@" 2>&1 | tee -a "$OUT/log.txt" \
    | grep '^{' >> "$RESULTS" || true
}
for server in $SERVERS; do
  port=$((port + 1)); dir=$(mktemp -d)
  start_server "$server" "$port" "$dir"
  measure "$server" "$port" --save-state "$dir/i$port-large.v1"
  stop_server
  if [ "$server" = quire ]; then
    start_server quire "$port" "$dir"
    measure quire-restart "$port" --no-upload
    kill -KILL "$PID"; wait "$PID" 2>/dev/null || true
    started=$(date +%s.%N)
    "$QUIRE_BIN" compact --database "sqlite://$dir/quire.db" --log warn "i$port-large"
    ended=$(date +%s.%N)
    python3 -c "import json,sys; print(json.dumps({'scenario': 'compact', 'label': 'quire', \
      'replays': $REPLAYS, 'compact_ms': ($ended - $started) * 1000}))" | tee -a "$RESULTS"
  elif [ "$server" = floor ]; then
    QUIRE_FLOOR_LOAD="$dir" start_server floor "$port" "$dir"
    measure floor-restart "$port" --no-upload
    stop_server
  else
    port=$((port + 1))
    start_server "$server" "$port" "$dir"
    measure "$server-as-one" "$port" --as-one
    stop_server
  fi
  cp "$dir/log" "$OUT/items-$server.log" 2>/dev/null || true
  rm -rf "$dir"
done
grep -h '"memory"\|"compact"' "$RESULTS"
