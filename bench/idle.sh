#!/usr/bin/env bash
# Memory per idle connection, side by side in one run: each server on a fresh process for
# each round, the servers alternating, N connections over 500 rooms held idle (every client
# synced, then silent). The lean floor (quire-floor with Quire's 128-byte read buffer) is the
# floor for this figure. Usage: bench/idle.sh [ROUNDS] [N]   (default 3 rounds of 10,000)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-3}"
N="${2:-10000}"
source bench/servers.sh
# 10,000 sockets on each side of loopback need more than the usual 1,024 descriptors.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
[ -x "$BENCH" ] || cargo build --release -p quire-server -p quire-bench
(cd bench/peers && npm ci --no-audit --no-fund >/dev/null)
port=4700
for round in $(seq "$ROUNDS"); do
  for server in floor-lean quire y-websocket hocuspocus floor; do
    flavor=y-websocket; [ "$server" = hocuspocus ] && flavor=hocuspocus
    port=$((port + 1)); dir=$(mktemp -d)
    start_server "$server" "$port" "$dir"
    run "$server" "$flavor" "$port" idle --conns "$N" --rooms 500 --prefix "idle$N-r$round"
    grep "^$server idle" "$OUT/log.txt" | tail -1
    stop_server
    rm -rf "$dir"
  done
done
