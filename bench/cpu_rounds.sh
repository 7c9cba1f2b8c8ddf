#!/usr/bin/env bash
# CPU per update at the light and medium loads, in rounds: at these loads one run's figure
# moves by about 30 % from one run to the next on a small VM, for every server, so a bound
# such as "at most 1.3x the floor" is judged on the medians of several rounds. Each round runs
# the floor, Quire with synchronous=normal, Quire with its defaults and the y-websocket server,
# one after the other, each on a fresh process. Writes target/bench/cpu-rounds.jsonl (labels
# "<server>-r<round>") and prints the medians and their ratios.
# SERVERS picks the servers (default: floor quire-normal quire y-websocket); quire-hocuspocus is
# Quire's /hocuspocus endpoint driven by the Hocuspocus flavour, a name ending in -ack
# (quire-ack, floor-ack) the server's y-websocket endpoint with a durable acknowledgement
# asked for after every update (the answer /hocuspocus gives every update as SyncStatus; the
# floor echoes it at once), and a name ending in -before
# runs the build at QUIRE_BEFORE instead (two builds compared round by round).
# LOADS picks the loads (default "light medium"; "heavy" is 200 x 4 x 5/s).
# Usage: [SERVERS="..."] [LOADS="..."] bench/cpu_rounds.sh [ROUNDS] [DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/servers.sh
ROUNDS="${1:-3}"; DUR="${2:-20s}"
ROUND_RESULTS="${ROUND_RESULTS:-$OUT/cpu-rounds.jsonl}"
: > "$ROUND_RESULTS"
port=4700
for round in $(seq "$ROUNDS"); do
  for name in ${LOADS:-light medium}; do
    case "$name" in
      light) rooms=200; clients=4; rate=1 ;;
      medium) rooms=100; clients=4; rate=3 ;;
      heavy) rooms=200; clients=4; rate=5 ;;
      *) echo "cpu_rounds.sh: unknown load $name" >&2; exit 2 ;;
    esac
    for server in ${SERVERS:-floor quire-normal quire y-websocket}; do
      port=$((port + 1)); dir=$(mktemp -d)
      base=${server%-before}; flavor=y-websocket; path=; extra=
      if [ "$base" = quire-hocuspocus ]; then base=quire; flavor=hocuspocus; path=/hocuspocus; fi
      if [ "$base" != "${base%-ack}" ]; then base=${base%-ack}; extra=--ack; fi
      if [ "$server" != "${server%-before}" ]; then
        QUIRE_BIN="${QUIRE_BEFORE:?QUIRE_BEFORE names the build before}" start_server "$base" "$port" "$dir"
      else
        start_server "$base" "$port" "$dir"
      fi
      URL_PATH=$path RESULTS="$ROUND_RESULTS" run "$server-r$round" "$flavor" "$port" typing \
        --rooms "$rooms" --clients "$clients" --rate "$rate" --duration "$DUR" --prefix "$name" $extra
      stop_server; rm -rf "$dir"
    done
  done
done
python3 - "$ROUND_RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
LOADS = {"light": (200, 1.0), "medium": (100, 3.0), "heavy": (200, 5.0)}
def cpu(load, server):
    rooms, rate = LOADS[load]
    return [r["server_cpu_per_1k"] * 1000 for r in rows
            if (r["rooms"], r["rate"]) == (rooms, rate) and r["label"].rsplit("-r", 1)[0] == server]
servers = sorted({r["label"].rsplit("-r", 1)[0] for r in rows})
def ratio(load, med, a, b, bound):
    if a in med and b in med:
        print(f"{load}: {a} / {b} {med[a] / med[b]:.2f}x (bound {bound})")
for load in LOADS:
    med = {s: statistics.median(cpu(load, s)) for s in servers if cpu(load, s)}
    if not med:
        continue
    print(f"{load}: median CPU us/update " + ", ".join(f"{s} {v:.0f}" for s, v in med.items()))
    ratio(load, med, "quire-normal", "floor", "1.3x")
    ratio(load, med, "quire", "y-websocket", "1.0x")
    ratio(load, med, "quire-hocuspocus", "quire", "1.1x")
    ratio(load, med, "quire-hocuspocus", "quire-ack", "1.1x")
    ratio(load, med, "floor-ack", "floor", "none: the least an acknowledgement costs")
    ratio(load, med, "quire-hocuspocus-before", "quire-before", "1.1x")
PY
