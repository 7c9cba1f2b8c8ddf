#!/usr/bin/env bash
# Where a relayed update's cost goes: three Quire nodes (one PostgreSQL, one NATS), each in
# its own cgroup with QUOTA cores (0: no quota), 50 rooms x 4 clients typing RATE updates/s
# each for 12 s, a document's clients spread over the nodes (HOW=spread) or on its owner
# (HOW=by-document). Measured over 10 s after 5 s: the nodes' CPU per update, the NATS
# server's, PostgreSQL's (all its processes; the nodes' pooled backends live through the
# run) and the transactions it committed in the nodes' database (append batches, lease
# renewals and reads), the nodes' context switches, the bus messages and envelopes the nodes
# published (their mean batch), the periods and time the nodes were throttled, the machine's
# idle cores and the delivery p99. One JSON line on stdout. Extra arguments go to `quire serve`.
# CPU figures are per update offered (50 x 4 x RATE a second); a run that did not deliver
# everything says so ("complete": false, and the generator's errors on stderr).
# Needs root and the cgroup v1 cpu controller when QUOTA is not 0; BENCH_EXTRA adds
# quire-bench arguments and URL_SUFFIX a path (`/hocuspocus`) to the nodes' URLs.
# Usage: bench/relay.sh HOW RATE [QUOTA] [quire serve args...]
# Example: bench/relay.sh spread 17.5 0.25 --bus-tick 0ms
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/servers.sh
HOW=$1; RATE=$2; QUOTA=${3:-0}; shift 2; [ $# -gt 0 ] && shift
EXTRA=("$@")
PG="${QUIRE_BENCH_PG:-postgres://postgres@127.0.0.1:5432}"
NATS="${QUIRE_BENCH_NATS:-nats://127.0.0.1:4222}"
DB=quire_bench_relay
CPU=/sys/fs/cgroup/cpu
psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
quota_us=$(python3 -c "print(int($QUOTA * 100000))")
pids=(); urls=(); cgroups=(); temps=(); bench=
cleanup() {
  [ -n "$bench" ] && kill -TERM "$bench" 2>/dev/null || true
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for cg in "${cgroups[@]}"; do rmdir "$cg" 2>/dev/null || true; done
  rm -rf "${temps[@]}"
}
trap cleanup EXIT
for i in 1 2 3; do
  port=$((4900 + i)); dir=$(mktemp -d); temps+=("$dir"); cg=
  if [ "$QUOTA" != 0 ]; then
    cg="$CPU/quire-bench-relay$i"; mkdir -p "$cg"; cgroups+=("$cg")
    echo 100000 > "$cg/cpu.cfs_period_us"
    echo "$quota_us" > "$cg/cpu.cfs_quota_us"
  fi
  # With a quota the node's process joins its cgroup before it starts (exec keeps the pid).
  bash -c '[ -z "$1" ] || echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
    "$QUIRE_BIN" serve --bind "127.0.0.1:$port" --database "$PG/$DB" --bus "$NATS" \
    --cluster-key bench-nodes-cluster-key --node-id "relay-$i" --log warn "${EXTRA[@]}" \
    >"$dir/log" 2>&1 &
  pids+=("$!"); wait_port "$port" "node $i"; urls+=("ws://127.0.0.1:$port${URL_SUFFIX:-}")
done
url=$(IFS=,; echo "${urls[*]}")
flag=; [ "$HOW" = by-document ] && flag=--by-document
ticks() { local t=0 p s; for p in "$@"; do s=($(cut -d' ' -f14,15 "/proc/$p/stat")); t=$((t + s[0] + s[1])); done; echo "$t"; }
switches() {
  local t=0 p f
  for p in "${pids[@]}"; do
    for f in /proc/"$p"/task/*/status; do
      # (A thread that ended meanwhile counts nothing.)
      v=$(awk '/ctxt_switches/{s+=$2} END{print s+0}' "$f" 2>/dev/null) || v=0
      t=$((t + ${v:-0}))
    done
  done
  echo "$t"
}
throttled() { # periods, milliseconds
  local n=0 t=0 cg
  for cg in "${cgroups[@]}"; do
    n=$((n + $(awk '/^nr_throttled/{print $2}' "$cg/cpu.stat")))
    t=$((t + $(awk '/^throttled_time/{print $2}' "$cg/cpu.stat") / 1000000))
  done
  echo "$n $t"
}
published() { # messages, envelopes
  local m=0 e=0 i o
  for i in 1 2 3; do
    o=$(curl -s "http://127.0.0.1:$((4900 + i))/metrics")
    m=$((m + $(echo "$o" | awk '/^quire_bus_messages_total/{print $2+0}')))
    e=$((e + $(echo "$o" | awk '/^quire_bus_envelopes_total/{print $2+0}')))
  done
  echo "$m $e"
}
idle() { awk '/^cpu /{print $5 + $6}' /proc/stat; }
# The NATS server's CPU, when it runs on this machine (none: 0).
nats=$(pgrep -o nats-server || true)
nats_ticks() { if [ -n "$nats" ]; then ticks "$nats"; else echo 0; fi; }
# PostgreSQL's processes (its backends come and go; those alive at both ends are counted).
pg_ticks() { ticks $(pgrep -u postgres postgres || true); }
# Transactions PostgreSQL committed in the nodes' database (each append batch is one).
pg_commits() { psql "$PG/postgres" -Atc "SELECT xact_commit FROM pg_stat_database WHERE datname = '$DB'"; }
out=$(mktemp); temps+=("$out" "$out.err")
"$BENCH" typing --rooms 50 --clients 4 --rate "$RATE" --duration 12s --warmup 3s \
  --prefix "r$HOW$RANDOM" $flag ${BENCH_EXTRA:-} --url "$url" --label relay >"$out" \
  2>"$out.err" &
bench=$!
sleep 5
t0=$(ticks "${pids[@]}"); n0=$(nats_ticks); g0=$(pg_ticks); x0=$(pg_commits); c0=$(switches); read -r m0 e0 < <(published)
read -r h0 k0 < <(throttled); i0=$(idle)
sleep 10
t1=$(ticks "${pids[@]}"); n1=$(nats_ticks); g1=$(pg_ticks); x1=$(pg_commits); c1=$(switches); read -r m1 e1 < <(published)
read -r h1 k1 < <(throttled); i1=$(idle)
wait "$bench" || cat "$out.err" >&2
bench=
python3 - "$out" "$HOW" "$RATE" "$QUOTA" "${EXTRA[*]:-}" $((t1 - t0)) $((n1 - n0)) $((c1 - c0)) \
  $((m1 - m0)) $((e1 - e0)) $((h1 - h0)) $((k1 - k0)) $((i1 - i0)) $((g1 - g0)) $((x1 - x0)) <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
typing = rows[-1] if rows else {}
how, rate, quota, extra = sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
t, n, c, m, e, h, k, i, g, x = map(int, sys.argv[6:16])
updates = 50 * 4 * rate * 10
print(json.dumps({"scenario": "relay-probe", "how": how, "quota": quota, "extra": extra,
                  "offered": updates / 10, "nodes_us": round(t * 1e4 / updates, 1),
                  "nats_us": round(n * 1e4 / updates, 1),
                  "pg_us": round(g * 1e4 / updates, 1),
                  "pg_commits_per_update": round(x / updates, 3), "csw_per_update": round(c / updates, 2),
                  "msgs_per_s": m / 10, "env_per_s": e / 10, "batch": round(e / max(m, 1), 2),
                  "throttled_periods": h, "throttled_ms": k, "machine_idle_cores": round(i / 1000, 2),
                  "p99": typing.get("p99_ms"), "sent": typing.get("sent"),
                  "errors": typing.get("errors"), "complete": typing.get("complete")}))
PY
