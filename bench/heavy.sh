#!/usr/bin/env bash
# Heavy readers beside typists (docs/benchmarks.md, "Heavy reads"): 16 loops read a 20 MB
# document's whole-document answers (a version's JSON, the content at the latest position,
# a diff of the whole document) while 2 clients type 10 updates/s into a small document;
# their delivery latency and the server's peak RSS, for each read, with a baseline of the
# typists alone. Bounded: each run stops by itself.
#
# Usage: bench/heavy.sh [QUIRE_BINARY LABEL]...  (default: this tree's release build, "quire").
# Pass an earlier build too to compare, in one run, e.g.
#   bench/heavy.sh /tmp/before/quire before target/release/quire after
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p quire-server -p quire-bench
source bench/servers.sh
RESULTS="$OUT/heavy.jsonl"
: > "$RESULTS"
READERS="${READERS:-16}"
DOC_MB="${DOC_MB:-20}"
DUR="${DUR:-20s}"
if [ $# -eq 0 ]; then set -- "$RELEASE/quire" quire; fi
port=4720
while [ $# -ge 2 ]; do
  binary=$1 label=$2; shift 2
  for read in none version-json latest diff; do
    port=$((port + 1)); dir=$(mktemp -d)
    "$binary" serve --bind "127.0.0.1:$port" --database "sqlite://$dir/quire.db" --log warn \
      >"$dir/log" 2>&1 &
    PID=$!
    wait_port "$port" "$label"
    readers=$READERS; kind=$read
    if [ "$read" = none ]; then readers=0; kind=version-json; fi
    run "$label-$read" y-websocket "$port" heavy --readers "$readers" --read "$kind" \
      --doc-mb "$DOC_MB" --duration "$DUR" --prefix "heavy$port"
    stop_server; rm -rf "$dir"
  done
done
grep -h "heavy" "$OUT/log.txt" | grep -v '^{' | tail -n 20
