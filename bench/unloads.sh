#!/usr/bin/env bash
# Rooms left together, beside rooms being typed into: one Quire node on PostgreSQL inside a
# cgroup with QUOTA cores (default 0.25), 50 rooms x 4 clients typing RATE updates/s each
# (default 5: 1,000 updates/s) for 30 s; 3 s in, another generator fills 100 other rooms for
# 4 s and leaves, so they unload (each with its last version and snapshot) together,
# UNLOAD (`--room-unload-delay`, default 8s) later, in the middle of the typing run;
# UNLOAD=10m keeps them loaded, the same run without the burst. One JSON line on stdout: the
# typing run's delivery p99 and max, the node's throttled periods during the run (its
# warm-up included), the rooms still loaded at the end, and the settings. Extra arguments go
# to `quire serve`. Needs root and the cgroup v1 cpu controller, and PostgreSQL
# (QUIRE_BENCH_PG, default postgres://postgres@127.0.0.1:5432).
# Usage: bench/unloads.sh [QUOTA] [RATE] [quire serve args...]
# Example: UNLOAD=10m bench/unloads.sh 0.25 5
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/servers.sh
QUOTA=${1:-0.25}; RATE=${2:-5}; [ $# -gt 0 ] && shift; [ $# -gt 0 ] && shift
EXTRA=("$@")
PG="${QUIRE_BENCH_PG:-postgres://postgres@127.0.0.1:5432}"
UNLOAD="${UNLOAD:-8s}"
DB=quire_bench_unloads
CPU=/sys/fs/cgroup/cpu
cg="$CPU/quire-bench-unloads"
port=4951
dir=$(mktemp -d)
node=; burst=; typing=
cleanup() {
  for p in $typing $burst; do kill -TERM "$p" 2>/dev/null || true; done
  [ -n "$node" ] && { kill -TERM "$node" 2>/dev/null || true; wait "$node" 2>/dev/null || true; }
  rmdir "$cg" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
if [ ! -w "$CPU" ]; then
  echo "unloads.sh: $CPU is not writable (root and cgroup v1 needed)" >&2
  exit 1
fi
psql "$PG/postgres" -qc "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
mkdir -p "$cg"
echo 100000 > "$cg/cpu.cfs_period_us"
quota_us=$(python3 -c "print(int($QUOTA * 100000))")
echo "$quota_us" > "$cg/cpu.cfs_quota_us"
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" \
  "$QUIRE_BIN" serve --bind "127.0.0.1:$port" --database "$PG/$DB" --log warn \
  --room-unload-delay "$UNLOAD" "${EXTRA[@]}" >"$dir/log" 2>&1 &
node=$!
wait_port "$port" quire
url="ws://127.0.0.1:$port"
throttled() { awk '/nr_throttled/ {print $2}' "$cg/cpu.stat"; }
before=$(throttled)
"$BENCH" typing --rooms 50 --clients 4 --rate "$RATE" --duration 30s --warmup 2s \
  --prefix steady --url "$url" --label unloads >"$dir/typing" 2>>"$dir/bench.log" &
typing=$!
sleep 3
"$BENCH" typing --rooms 100 --clients 2 --rate 5 --duration 4s --warmup 0s \
  --prefix burst --url "$url" --label burst >/dev/null 2>>"$dir/bench.log" &
burst=$!
wait "$typing" || true
after=$(throttled)
# Rooms still loaded at the end: 50 when the burst's rooms unloaded, 150 when they stayed.
loaded=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^quire_rooms_loaded/ {print $2}')
python3 - "$dir/typing" "$((after - before))" "$QUOTA" "$RATE" "--room-unload-delay $UNLOAD ${EXTRA[*]}" "${loaded:-}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
t = rows[-1] if rows else {}
print(json.dumps({"scenario": "unloads", "quota": sys.argv[3], "rate_per_client": float(sys.argv[4]),
                  "extra": sys.argv[5], "p50_ms": t.get("p50_ms"), "p99_ms": t.get("p99_ms"),
                  "max_ms": t.get("max_ms"), "complete": t.get("complete"),
                  "throttled_periods": int(sys.argv[2]),
                  "rooms_loaded_at_end": int(sys.argv[6]) if sys.argv[6].isdigit() else None}))
PY
