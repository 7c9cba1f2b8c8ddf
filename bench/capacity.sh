#!/usr/bin/env bash
# Issue 50's measurements (docs/benchmarks.md, "Capacity"): a one-character JSON edit on a
# 20 MB document beside the same edit on an empty one, the clients an agent's edits add, and
# never-reading clients of whole-document answers beside others' reads and edits. Bounded:
# every part stops by itself.
#
# Usage: bench/capacity.sh [QUIRE_BINARY LABEL [EXTRA_BENCH_ARGS]]...  (default: this tree's
# release build, "quire"). Pass an earlier build to compare in one run, e.g.
#   bench/capacity.sh /tmp/before/quire before "--edits 20 --agent-edits 50 --probes 4" \
#                     target/release/quire after ""
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p quire-server -p quire-bench
source bench/servers.sh
RESULTS="$OUT/capacity.jsonl"
: > "$RESULTS"
DOC_MB="${DOC_MB:-20}"
if [ $# -eq 0 ]; then set -- "$RELEASE/quire" quire ""; fi
port=4760
while [ $# -ge 3 ]; do
  binary=$1 label=$2 extra=$3; shift 3
  port=$((port + 1)); dir=$(mktemp -d)
  # heavy_per_node 2: the 2-core node of the issue's report, whatever this machine has.
  "$binary" serve --bind "127.0.0.1:$port" --database "sqlite://$dir/quire.db" --log warn \
    --heavy-per-node 2 >"$dir/log" 2>&1 &
  PID=$!
  wait_port "$port" "$label"
  # shellcheck disable=SC2086
  run "$label" y-websocket "$port" capacity --doc-mb "$DOC_MB" --prefix "cap$port" $extra
  stop_server; rm -rf "$dir"
done
grep -h "capacity" "$OUT/log.txt" | grep -v '^{' | tail -n 20
