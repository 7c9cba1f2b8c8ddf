#!/usr/bin/env bash
# Nodes that add capacity: the highest rate with delivery p99 < 50 ms on 1, 2 and 3 Quire
# nodes (one PostgreSQL, one NATS), each node limited to the same CPU quota (a cgroup v1
# cpu.cfs_quota_us, default 0.4 core), clients spread over the nodes two ways: every client
# of a document on one node, as a load balancer hashing the path would (`--by-document`), and
# a document's clients on different nodes (client c of room r on node (r + c) mod n), so the
# owner relays to the others. Appends to target/bench/results.jsonl (labels "nodes<N>-<how>",
# with "-q<QUOTA>" when the quota is not 0.4).
# Needs root, the cgroup v1 cpu controller, PostgreSQL (QUIRE_BENCH_PG, default
# postgres://postgres@127.0.0.1:5432) and NATS (QUIRE_BENCH_NATS, default nats://127.0.0.1:4222).
# Usage: bench/nodes.sh [QUOTA_CORES] [STEPS] [REFINE]; NODES="1 2 3" and HOWS="by-document
# spread" choose the configurations.
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

for n in ${NODES:-1 2 3}; do
  for how in ${HOWS:-by-document spread}; do
    [ "$n" = 1 ] && [ "$how" = spread ] && continue
    psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
    urls=()
    for i in $(seq "$n"); do
      port=$((4800 + i)); dir=$(mktemp -d)
      "$RELEASE/quire" serve --bind "127.0.0.1:$port" --database "$PG/$DB" --bus "$NATS" \
        --cluster-key "bench-nodes-cluster-key" --node-id "bench-$i" --log warn >"$dir/log" 2>&1 &
      pid=$!; pids+=("$pid")
      wait_port "$port" "node $i"
      cg="$CPU/quire-bench-node$i"; mkdir -p "$cg"; cgroups+=("$cg")
      echo 100000 > "$cg/cpu.cfs_period_us"; echo "$quota_us" > "$cg/cpu.cfs_quota_us"
      echo "$pid" > "$cg/cgroup.procs"
      urls+=("ws://127.0.0.1:$port")
    done
    url=$(IFS=,; echo "${urls[*]}")
    flag=; [ "$how" = by-document ] && flag=--by-document
    echo "=== $n node(s), $QUOTA core each, clients $how ===" >&2
    "$BENCH" search --rooms 50 --clients 4 --rate 3 --step 1.6 --steps "$STEPS" \
      --refine "$REFINE" --duration 8s --warmup 2s --prefix "n$n$how" $flag --url "$url" \
      --label "nodes$n-$how$suffix" 2>&1 | tee -a "$OUT/log.txt" | grep '^{' >> "$RESULTS" || true
    stop_nodes
  done
done
