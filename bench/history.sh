#!/usr/bin/env bash
# The version history's figures (docs/benchmarks.md, "Version history"), on the editing trace:
#   1. trace ingest with history on (default retention) against off (--history-retention 0),
#      alternating, three rounds each, and the database's size after each (per retained
#      update: the difference over the trace's updates);
#   2. the trace replayed as 100 sessions of one author each, then the history routes timed:
#      listing sessions, the content at random positions, the diff of two versions.
# Bounded: every step stops by itself. Usage: bench/history.sh (results in target/bench/).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/bench
mkdir -p "$OUT"
RESULTS="$OUT/history.jsonl"
: > "$RESULTS"
TRACE="${QUIRE_TRACE:-tests/data/editing-trace.json.gz}"
cargo build --release -p quire-server -p quire-bench
RELEASE="${CARGO_TARGET_DIR:-target}/release"
BENCH="$RELEASE/quire-bench"
source bench/servers.sh
PORT=4690
ADMIN=bench-admin-key-0123456789

start() { # dir flags...
  local dir=$1; shift
  "$RELEASE/quire" serve --bind "127.0.0.1:$PORT" --database "sqlite://$dir/quire.db" \
    --log warn "$@" >"$dir/log" 2>&1 &
  PID=$!
  wait_port "$PORT" quire
}
# The database's bytes once its write-ahead log is folded in, and what its log rows hold.
size() {
  python3 - "$1/quire.db" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
rows, data, author = c.execute(
    "SELECT COUNT(*), COALESCE(SUM(LENGTH(data)), 0), COALESCE(SUM(LENGTH(author)), 0) FROM doc_updates").fetchone()
pages, = c.execute("PRAGMA page_count").fetchone()
size, = c.execute("PRAGMA page_size").fetchone()
print(pages * size, rows, data, author)
PY
}

for round in 1 2 3; do
  for retention in 30days 0; do
    dir=$(mktemp -d)
    # A deep outbound queue: the watcher shares the generator's process and cores, and a
    # watcher that falls behind by a full default queue (1,024 frames) is closed with 1013.
    start "$dir" --history-retention "$retention" --peer-queue 65536
    label="history-$retention"
    "$BENCH" coldload --trace "$TRACE" --prefix cold --url "ws://127.0.0.1:$PORT" \
      --server-pid "$PID" --label "$label" 2>&1 | tee -a "$OUT/history-log.txt" \
      | grep '^{' >> "$RESULTS" || true
    stop_server
    read -r bytes rows data author < <(size "$dir")
    echo "{\"scenario\": \"history-size\", \"label\": \"$label\", \"round\": $round, \"db_bytes\": $bytes, \"log_rows\": $rows, \"log_data_bytes\": $data, \"log_author_bytes\": $author}" \
      | tee -a "$RESULTS"
    rm -rf "$dir"
  done
done

dir=$(mktemp -d)
start "$dir" --auth-key "k1:bench-history-secret-0123456789" --admin-key "$ADMIN" --version-idle 200ms
"$BENCH" history --trace "$TRACE" --prefix hist --url "ws://127.0.0.1:$PORT" --server-pid "$PID" \
  --label quire --admin-key "$ADMIN" --sessions 100 --pause 300ms 2>&1 \
  | tee -a "$OUT/history-log.txt" | grep '^{' >> "$RESULTS" || true
stop_server
rm -rf "$dir"
grep -h '"label"' "$RESULTS"
