#!/usr/bin/env bash
# Runs quire-bench against Quire and the peer servers side by side, on loopback, in one run,
# and writes target/bench/results.jsonl, then prints the comparison table and draws the plot
# (bench/report.py). Bounded: every scenario stops by itself.
# Usage: bench/run.sh [full|quick|base|extras]. `full` (the default) is `base` then `extras`:
# `base` is every server side by side on the round-two scenarios (about 30 minutes), `extras`
# the scenarios the full run adds after them (one core per server, nodes, history, branches,
# presence, memory, many items, /hocuspocus, reads; about an hour and a half), appended to the
# results `base` left, so the two can run on different days and still make one report.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE="${1:-full}"
case "$MODE" in full | quick | base | extras) ;; *) echo "usage: $0 [full|quick|base|extras]" >&2; exit 2 ;; esac
OUT=target/bench
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
if [ "$MODE" != extras ]; then
  : > "$RESULTS"
  : > "$OUT/log.txt"
fi
touch "$RESULTS" "$OUT/log.txt"
TRACE="${QUIRE_TRACE:-tests/data/editing-trace.json.gz}"

cargo build --release -p quire-server -p quire-bench
(cd bench/peers && npm ci --no-audit --no-fund >/dev/null)
RELEASE="${CARGO_TARGET_DIR:-target}/release"
BENCH="$RELEASE/quire-bench"

if [ "$MODE" = quick ]; then
  DUR=5s; FAN="10 50"; IDLE="2000"; SEARCH_STEPS=4; REFINE=1
  STORM_CLIENTS=20; SEED_MB=2
else
  DUR=20s; FAN="10 50 200"; IDLE="2000 5000 10000"; SEARCH_STEPS=10; REFINE=3
  STORM_CLIENTS=150; SEED_MB=20
fi
# The three loads of CPU per update (rooms, clients, updates/s per client): light, medium and
# the heavy one every earlier run used.
LOADS="light:200:4:1 medium:100:4:3 heavy:200:4:5"

source bench/servers.sh

QUIRE_ARGS=
port=4600
# The floor (bench/src/floor.rs: the least a y-websocket server can do, in memory) runs beside
# the peers; Quire also with synchronous=normal, for the CPU figures.
BASE_SERVERS="floor quire quire-normal y-websocket hocuspocus"
[ "$MODE" = extras ] && BASE_SERVERS=
for server in $BASE_SERVERS; do
  flavor=y-websocket; [ "$server" = hocuspocus ] && flavor=hocuspocus
  port=$((port + 1)); dir=$(mktemp -d)
  start_server "$server" "$port" "$dir"
  echo "=== $server (pid $PID) ===" >&2
  # The same loads for every server (the CPU and latency figures compare this run), each on a
  # fresh process; then, for Quire only, the heavy load with a durable-ack request (tag 102)
  # after every update.
  for load in $LOADS; do
    IFS=: read -r name rooms clients rate <<<"$load"
    stop_server; start_server "$server" "$port" "$dir"
    run "$server" "$flavor" "$port" typing --rooms "$rooms" --clients "$clients" --rate "$rate" \
      --duration "$DUR" --prefix "$name"
  done
  if [ "$server" = quire-normal ]; then
    stop_server; rm -rf "$dir"; continue
  fi
  # Join storm: the clients open one large document at the same moment (fresh process).
  stop_server; start_server "$server" "$port" "$dir"
  run "$server" "$flavor" "$port" storm --clients "$STORM_CLIENTS" --doc-mb "$SEED_MB" --prefix storm
  if [ "$server" = quire ]; then
    # The same document after a restart: how long its first client waits for it to load.
    stop_server; start_server "$server" "$port" "$dir"
    run quire-restart "$flavor" "$port" storm --clients 1 --doc-mb "$SEED_MB" --no-upload --prefix storm
  fi
  # Large document: 4 clients typing into it.
  stop_server; start_server "$server" "$port" "$dir"
  run "$server" "$flavor" "$port" typing --rooms 1 --clients 4 --rate 5 --duration "$DUR" \
    --seed-mb "$SEED_MB" --prefix large
  if [ "$server" = quire ]; then
    # ... with a snapshot due every 50 updates, so several are written during the run.
    stop_server; QUIRE_ARGS="--snapshot-updates 50 --snapshot-log-percent 0"
    start_server "$server" "$port" "$dir"; QUIRE_ARGS=
    run quire-snapshots "$flavor" "$port" typing --rooms 1 --clients 4 --rate 5 --duration "$DUR" \
      --seed-mb "$SEED_MB" --prefix largesnap
  fi
  stop_server; start_server "$server" "$port" "$dir"
  if [ "$server" = quire ]; then
    run "$server" "$flavor" "$port" typing --rooms 200 --clients 4 --rate 5 --duration "$DUR" --ack \
      --prefix typingack
    # The fan-out on a fresh process: the 200 rooms above unload (final snapshots and
    # versions) for a while, which the fan-out's single room would measure.
    stop_server; start_server "$server" "$port" "$dir"
  fi
  for n in $FAN; do
    run "$server" "$flavor" "$port" typing --rooms 1 --clients $((n + 1)) --writers 1 --rate 20 \
      --duration "$DUR" --prefix "fan$n"
  done
  run "$server" "$flavor" "$port" search --rooms 50 --clients 4 --rate 5 --step 1.6 \
    --steps "$SEARCH_STEPS" --refine "$REFINE" --duration 8s --warmup 2s --prefix search
  # Each size on a fresh process: memory freed by earlier connections is rarely returned to
  # the system, so a reused process would understate the growth.
  for n in $IDLE; do
    stop_server; start_server "$server" "$port" "$dir"
    run "$server" "$flavor" "$port" idle --conns "$n" --rooms 500 --prefix "idle$n"
  done
  stop_server; start_server "$server" "$port" "$dir"
  run "$server" "$flavor" "$port" coldload --trace "$TRACE" --prefix cold
  stop_server; start_server "$server" "$port" "$dir"
  run "$server" "$flavor" "$port" coldload --verify --trace "$TRACE" --prefix cold
  stop_server
  rm -rf "$dir"
done

# Quire's Hocuspocus endpoint (/hocuspocus) with the Hocuspocus flavour, the load the
# Hocuspocus server got above: typing and fan-out.
if [ "$MODE" != extras ]; then
port=$((port + 1)); dir=$(mktemp -d)
start_server quire "$port" "$dir"
echo "=== quire, Hocuspocus protocol (pid $PID) ===" >&2
URL_PATH=/hocuspocus
run quire-hocuspocus hocuspocus "$port" typing --rooms 200 --clients 4 --rate 5 --duration "$DUR" --prefix typing
for n in $FAN; do
  run quire-hocuspocus hocuspocus "$port" typing --rooms 1 --clients $((n + 1)) --writers 1 --rate 20 \
    --duration "$DUR" --prefix "fan$n"
done
URL_PATH=
stop_server
rm -rf "$dir"

python3 bench/report.py "$RESULTS" docs/bench-latency.svg
fi

# The full run (and extras) only: each server limited to one core (bench/cores.sh), nodes under
# the same quota (bench/nodes.sh; PostgreSQL and NATS), the version history's figures and the
# branches' (Quire only, bench/history.sh, bench/branches.sh), presence at scale
# (bench/presence.sh), a large document's memory (bench/memory.sh) and its content reads. The
# two cgroup runs need root; they say so and skip otherwise.
if [ "$MODE" = full ] || [ "$MODE" = extras ]; then
  bench/cores.sh
  # CPU per update at the light and medium loads in three rounds (medians; one run varies).
  LOADS="light medium" bench/cpu_rounds.sh 3 "$DUR"
  # Memory per idle connection in three rounds, beside the lean floor (its 128-byte buffer).
  bench/idle.sh 3 10000
  bench/nodes.sh
  # A quota that leaves the two cores room for the generator, PostgreSQL and NATS.
  bench/nodes.sh 0.25
  python3 bench/report.py "$RESULTS" docs/bench-latency.svg
  bench/history.sh
  bench/branches.sh
  # Round three: presence at scale, a large document's memory, its content reads; their
  # results join the report's (its round-three table and docs/bench-presence.svg).
  bench/presence.sh
  cat "$OUT/presence.jsonl" >> "$RESULTS"
  bench/memory.sh
  cat "$OUT/memory.jsonl" >> "$RESULTS"
  # A document of 10 million items beside the floor (y-websocket is left out at this size: at a
  # tenth of it, REPLAYS=90, it held 2.4x the floor's memory).
  SERVERS="floor quire" bench/items.sh
  cat "$OUT/items.jsonl" >> "$RESULTS"
  # Its snapshot in alternating rounds against the floor, each a fresh process (target 2's
  # figure; rows in $OUT/snapshot-rounds.jsonl, apart from the report's).
  bench/snapshot_rounds.sh 5
  # /hocuspocus against the y-websocket endpoint, with and without an ack per update.
  ROUND_RESULTS="$OUT/cpu-rounds-hocuspocus.jsonl" SERVERS="quire quire-ack quire-hocuspocus" \
    LOADS="light medium" bench/cpu_rounds.sh 3 "$DUR"
  port=$((port + 1)); dir=$(mktemp -d)
  start_server quire "$port" "$dir"
  run quire y-websocket "$port" reads --doc-mb "$SEED_MB" --prefix reads
  stop_server; rm -rf "$dir"
  python3 bench/report.py "$RESULTS" docs/bench-latency.svg
fi
