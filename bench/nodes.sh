#!/usr/bin/env bash
# Nodes that add capacity: the highest rate with delivery p99 < 50 ms on 1, 2 and 3 Quire
# nodes (one PostgreSQL, one NATS), each node limited to the same CPU quota (a cgroup v1
# cpu.cfs_quota_us, default 0.4 core; each node starts inside its cgroup, as in a container
# with a CPU limit, so its runtime sizes itself to the quota), clients spread over the nodes
# two ways: every client of a document on one node, as a load balancer hashing the path would
# (`--by-document`), and a document's clients on different nodes (client c of room r on node
# (r + c) mod n), so the owner relays to the others. Then, on fresh nodes, a fixed rate
# (FIXED_RATE updates/s per client, default 10: 2,000 updates/s) for 12 s: the nodes' CPU per
# update, which the p99 bound does not show, and the NATS server's (it shares the cores).
# With DOCS_PER_SOCKET=K (default 1; K must divide the 50 rooms) the clients speak
# Hocuspocus to each node's /hocuspocus endpoint and one socket carries client c of K rooms
# (`--docs-per-socket`; rooms in groups of K, the socket of group g on node g mod n with
# `--by-document`, (g + c) mod n spread); each room is first opened on the node meant to own
# it: its group's node with `--by-document` (nothing relayed), node r mod n spread (a socket's
# documents owned by different nodes). Appends to target/bench/results.jsonl
# (labels "nodes<N>-<how>", with "-q<QUOTA>" when the quota is not 0.4 and "-hp<K>" when K is
# not 1; the fixed-rate rows have scenario "nodes-cpu"). With SERVER=floor the nodes are floor
# processes sharing documents through NATS (bench/src/floor_relay.rs: the least relaying can
# cost; labels "floor-nodes<N>-<how>"; y-websocket clients only).
# Needs root, the cgroup v1 cpu controller, PostgreSQL (QUIRE_BENCH_PG, default
# postgres://postgres@127.0.0.1:5432) and NATS (QUIRE_BENCH_NATS, default nats://127.0.0.1:4222).
# Usage: bench/nodes.sh [QUOTA_CORES] [STEPS] [REFINE]; NODES="1 2 3" and HOWS="by-document
# spread" choose the configurations, DOCS_PER_SOCKET the documents per socket.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/servers.sh
QUOTA="${1:-0.4}"; STEPS="${2:-10}"; REFINE="${3:-3}"
PG="${QUIRE_BENCH_PG:-postgres://postgres@127.0.0.1:5432}"
NATS="${QUIRE_BENCH_NATS:-nats://127.0.0.1:4222}"
DB=quire_bench_nodes
CPU=/sys/fs/cgroup/cpu
if [ ! -w "$CPU" ]; then
  echo "nodes.sh: $CPU is not writable (root and cgroup v1 needed); skipped" >&2
  exit 0
fi
quota_us=$(python3 -c "print(int($QUOTA * 100000))")
# Labels name the quota when it is not the default 0.4 core.
suffix=; [ "$QUOTA" = 0.4 ] || suffix="-q$QUOTA"
# Several documents per socket: Hocuspocus (Quire serves it at /hocuspocus), labels "-hp<K>".
DOCS_PER_SOCKET="${DOCS_PER_SOCKET:-1}"
mux=; url_path=
if [ "$DOCS_PER_SOCKET" -gt 1 ]; then
  if [ $((50 % DOCS_PER_SOCKET)) -ne 0 ]; then
    echo "nodes.sh: DOCS_PER_SOCKET=$DOCS_PER_SOCKET does not divide the 50 rooms" >&2
    exit 1
  fi
  mux="--flavor hocuspocus --docs-per-socket $DOCS_PER_SOCKET"; url_path=/hocuspocus
  suffix="$suffix-hp$DOCS_PER_SOCKET"
fi
SERVER="${SERVER:-quire}"
label=nodes
if [ "$SERVER" = floor ]; then
  label=floor-nodes
  [ "$DOCS_PER_SOCKET" -gt 1 ] && { echo "nodes.sh: the floor speaks y-websocket only" >&2; exit 1; }
fi
# Each search step opens 50 fresh rooms; a room unloads (with a last snapshot) 30 s after its
# clients leave, which lands the unloads of one step's 50 rooms together inside the step three
# steps later. A search with them failed that step more often (docs/benchmarks.md, "Round
# three, fifth step"), though a burst of unloads measured on its own costs nothing beyond
# noise (bench/unloads.sh, "sixth step"). The rooms of earlier steps stay loaded instead (as
# the floor's documents do), so every step measures its own load: UNLOAD=30s measures with
# the unloads.
UNLOAD="${UNLOAD:-10m}"
pids=(); cgroups=()
stop_nodes() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() {
  stop_nodes
  for cg in "${cgroups[@]}"; do rmdir "$cg" 2>/dev/null || true; done
}
trap cleanup EXIT

start_nodes() { # n: fresh database, n nodes each inside its cgroup; sets url
  psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
  local urls=() i port dir cg
  for i in $(seq "$1"); do
    port=$((4800 + i)); dir=$(mktemp -d)
    cg="$CPU/quire-bench-node$i"; mkdir -p "$cg"; cgroups+=("$cg")
    echo 100000 > "$cg/cpu.cfs_period_us"; echo "$quota_us" > "$cg/cpu.cfs_quota_us"
    # The node's process joins its cgroup before it starts (exec keeps the pid).
    if [ "$SERVER" = floor ]; then
      # Node 1 keeps the directory of owners; one node alone needs no NATS.
      local env=(-u QUIRE_FLOOR_NATS -u QUIRE_FLOOR_NODE -u QUIRE_FLOOR_DIRECTORY)
      [ "$1" -gt 1 ] && env+=(QUIRE_FLOOR_NATS="$NATS" QUIRE_FLOOR_NODE="floor-$i")
      [ "$1" -gt 1 ] && [ "$i" = 1 ] && env+=(QUIRE_FLOOR_DIRECTORY=1)
      bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
        env "${env[@]}" "$RELEASE/quire-floor" "127.0.0.1:$port" >"$dir/log" 2>&1 &
    else
      bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
        "$RELEASE/quire" serve --bind "127.0.0.1:$port" --database "$PG/$DB" --bus "$NATS" \
        --cluster-key "bench-nodes-cluster-key" --node-id "bench-$i" --log warn \
        --room-unload-delay "$UNLOAD" >"$dir/log" 2>&1 &
    fi
    pids+=("$!")
    wait_port "$port" "node $i"
    urls+=("ws://127.0.0.1:$port$url_path")
  done
  url=$(IFS=,; echo "${urls[*]}")
}

nodes_cpu_ticks() { # the CPU ticks (1/100 s) the running nodes have used
  local t=0 p s
  for p in "${pids[@]}"; do
    s=($(cut -d' ' -f14,15 "/proc/$p/stat")); t=$((t + s[0] + s[1]))
  done
  echo "$t"
}

# The NATS server's CPU ticks, when it runs on this machine (none: 0): it shares the cores.
nats_pid=$(pgrep -o nats-server || true)
nats_ticks() {
  if [ -n "$nats_pid" ] && [ -r "/proc/$nats_pid/stat" ]; then
    local s; s=($(cut -d' ' -f14,15 "/proc/$nats_pid/stat")); echo $((s[0] + s[1]))
  else echo 0; fi
}

fixed_rate() { # n how flag: FIXED_RATE per client for 12 s; the nodes' and NATS's CPU per update
  local rate="${FIXED_RATE:-10}" before after nats_before nats_after out
  out=$(mktemp)
  "$BENCH" typing --rooms 50 --clients 4 --rate "$rate" --duration 12s --warmup 3s \
    --prefix "f$1$2" $3 $mux --url "$url" --label "$label$1-$2$suffix" >"$out" 2>>"$OUT/log.txt" &
  local bench=$!
  sleep 5; before=$(nodes_cpu_ticks); nats_before=$(nats_ticks)
  sleep 10; after=$(nodes_cpu_ticks); nats_after=$(nats_ticks)
  wait "$bench" || true
  python3 - "$out" "$((after - before))" "$rate" "$label$1-$2$suffix" "$((nats_after - nats_before))" <<'PY' | tee -a "$OUT/log.txt" >> "$RESULTS"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
typing = rows[-1] if rows else {}
ticks, rate, label, nats = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
offered = 50 * 4 * rate
print(json.dumps({"scenario": "nodes-cpu", "label": label, "offered_per_s": offered,
                  "nodes_cpu_s_per_10s": ticks / 100, "cpu_us_per_update": ticks / 100 / (10 * offered) * 1e6,
                  "nats_cpu_us_per_update": nats / 100 / (10 * offered) * 1e6,
                  "p99_ms": typing.get("p99_ms"), "complete": typing.get("complete")}))
PY
  rm -f "$out"
}

for n in ${NODES:-1 2 3}; do
  for how in ${HOWS:-by-document spread}; do
    [ "$n" = 1 ] && [ "$how" = spread ] && continue
    flag=; [ "$how" = by-document ] && flag=--by-document
    echo "=== $n node(s), $QUOTA core each, clients $how ===" >&2
    start_nodes "$n"
    "$BENCH" search --rooms 50 --clients 4 --rate 3 --step 1.6 --steps "$STEPS" \
      --refine "$REFINE" --duration 8s --warmup 2s --prefix "n$n$how" $flag $mux --url "$url" \
      --label "$label$n-$how$suffix" 2>&1 | tee -a "$OUT/log.txt" | grep '^{' >> "$RESULTS" || true
    stop_nodes
    start_nodes "$n"
    fixed_rate "$n" "$how" "$flag"
    stop_nodes
  done
done
