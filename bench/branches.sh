#!/usr/bin/env bash
# The branches' figures (docs/benchmarks.md, "Branches"), on the editing trace: in each of
# three rounds, a parent and a branch of it; the trace replayed into the branch as 100
# sessions by 5 authors (each session a change); then timed: listing the changes (20 times),
# merging author-0's changes (with the changes they depend on, as the 409s name them), and
# merging the remaining changes while 4 typists type into the parent (their delivery latency
# against the same typists' just before the merge); the parent's text checked each round.
# Bounded: every step stops by itself. Usage: bench/branches.sh (results in target/bench/).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/bench
mkdir -p "$OUT"
RESULTS="$OUT/branches.jsonl"
: > "$RESULTS"
LOG="$OUT/branches-log.txt"
: > "$LOG"
TRACE="${QUIRE_TRACE:-tests/data/editing-trace.json.gz}"
ROUNDS="${ROUNDS:-3}"
cargo build --release -p quire-server -p quire-bench
RELEASE="${CARGO_TARGET_DIR:-target}/release"
BENCH="$RELEASE/quire-bench"
source bench/servers.sh
PORT=4695
ADMIN=bench-admin-key-0123456789

# The machine's load during the run (other processes share its cores): a sample every 10 s.
: > "$OUT/branches-load.txt"
(
  while true; do
    { date +%T; cat /proc/loadavg; ps -eo pcpu,comm --sort=-pcpu | sed -n 2,6p; } >>"$OUT/branches-load.txt"
    sleep 10
  done
) &
SAMPLER=$!
PID=

dir=$(mktemp -d)
trap 'kill "$SAMPLER" 2>/dev/null || true; stop_server; rm -rf "$dir"' EXIT
"$RELEASE/quire" serve --bind "127.0.0.1:$PORT" --database "sqlite://$dir/quire.db" --log warn \
  --auth-key "k1:bench-branches-secret-0123456789" --admin-key "$ADMIN" --version-idle 200ms \
  >"$dir/log" 2>&1 &
PID=$!
wait_port "$PORT" quire
status=0
timeout 1800 "$BENCH" branches --trace "$TRACE" --prefix br --url "ws://127.0.0.1:$PORT" \
  --server-pid "$PID" --label quire --admin-key "$ADMIN" --rounds "$ROUNDS" --sessions 100 \
  --authors 5 --pause 300ms --repeat 20 --typists 4 --type-every 50ms 2>&1 \
  | tee -a "$LOG" | { grep '^{' >> "$RESULTS" || true; } || status=$?
if grep -qv '^$' "$dir/log"; then
  echo "--- server log ---" >&2; tail -n 20 "$dir/log" >&2
fi
grep -h '"label"' "$RESULTS"
exit "$status"
