#!/usr/bin/env bash
# The highest rate with delivery p99 < 50 ms, each server limited to one core by a cgroup v1
# CPU quota (cpu.cfs_quota_us), so the load generator has the other core and does not decide
# the result. Appends to target/bench/results.jsonl (labels "<server>-1core"); bench/run.sh
# runs it in the full run. Needs root and the cgroup v1 cpu controller; every cgroup it makes
# is removed on exit. Usage: bench/cores.sh [STEPS] [REFINE]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/servers.sh
STEPS="${1:-10}"; REFINE="${2:-3}"
CPU=/sys/fs/cgroup/cpu

if [ ! -w "$CPU" ]; then
  echo "cores.sh: $CPU is not writable (root and cgroup v1 needed); skipped" >&2
  exit 0
fi
cgroups=()
cleanup() {
  for cg in "${cgroups[@]}"; do
    # Processes left in it go back to the root group, then the group goes.
    if [ -f "$cg/cgroup.procs" ]; then
      while read -r p; do echo "$p" > "$CPU/cgroup.procs" 2>/dev/null || true; done < "$cg/cgroup.procs"
    fi
    rmdir "$cg" 2>/dev/null || true
  done
}
trap cleanup EXIT

port=4700
for server in floor quire y-websocket hocuspocus; do
  flavor=y-websocket; [ "$server" = hocuspocus ] && flavor=hocuspocus
  port=$((port + 1)); dir=$(mktemp -d)
  cg="$CPU/quire-bench-$server"
  mkdir -p "$cg"; cgroups+=("$cg")
  echo 100000 > "$cg/cpu.cfs_period_us"
  echo 100000 > "$cg/cpu.cfs_quota_us"   # one core
  start_server "$server" "$port" "$dir"
  echo "$PID" > "$cg/cgroup.procs"       # every thread of the process
  echo "=== $server, one core (pid $PID) ===" >&2
  run "$server-1core" "$flavor" "$port" search --rooms 50 --clients 4 --rate 5 --step 1.6 \
    --steps "$STEPS" --refine "$REFINE" --duration 8s --warmup 2s --prefix core
  stop_server
  rm -rf "$dir"
done
