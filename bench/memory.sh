#!/usr/bin/env bash
# A large document's cost in server RSS (docs/benchmarks.md, "Large document memory"): the
# storm's seeded document (DOC_MB, 20 MiB) uploaded, then RSS once one client has it open,
# after a join storm of 50 clients (once they left) and after 60 typed updates (Quire writes
# a snapshot every 50: after a snapshot). Quire twice: as uploaded, and after a restart (the
# document loaded from storage). Beside the floor and the y-websocket server, in one run.
# Bounded: every run stops by itself. Usage: bench/memory.sh (results in
# target/bench/memory.jsonl; env ROUNDS=3, DOC_MB=20, SERVERS="floor quire y-websocket",
# QUIRE_BIN and QUIRE_LABEL for another build of Quire, e.g. QUIRE_BIN=/tmp/before/quire
# QUIRE_LABEL=before SERVERS=quire).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p quire-server -p quire-bench
(cd bench/peers && npm ci --no-audit --no-fund >/dev/null)
source bench/servers.sh
RESULTS="$OUT/memory.jsonl"
[ -n "${APPEND:-}" ] || : > "$RESULTS"
QL="${QUIRE_LABEL:-quire}"
ROUNDS="${ROUNDS:-3}"
DOC_MB="${DOC_MB:-20}"
SERVERS="${SERVERS:-floor quire y-websocket}"
QUIRE_ARGS="--snapshot-updates 50 --snapshot-log-percent 0"
port=4800
measure() { # label server port args...
  local label=$1 server=$2 p=$3; shift 3
  "$BENCH" memory --doc-mb "$DOC_MB" --url "ws://127.0.0.1:$p" --server-pid "$PID" \
    --label "$label" --prefix "m$p" "$@" 2>&1 | tee -a "$OUT/log.txt" | grep '^{' >> "$RESULTS" || true
}
for round in $(seq "$ROUNDS"); do
  for server in $SERVERS; do
    port=$((port + 1)); dir=$(mktemp -d)
    start_server "$server" "$port" "$dir"
    label=$server; [ "$server" = quire ] && label=$QL
    measure "$label" "$server" "$port"
    if [ "$server" = quire ]; then
      # The same document after a restart: loaded from storage by its first client.
      stop_server; start_server quire "$port" "$dir"
      measure "$QL-restart" quire "$port" --no-upload
    fi
    stop_server; rm -rf "$dir"
  done
done
grep -h '"memory"' "$RESULTS"
