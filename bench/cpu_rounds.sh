#!/usr/bin/env bash
# CPU per update at the light and medium loads, in rounds: at these loads one run's figure
# moves by about 30 % from one run to the next on a small VM, for every server, so a bound
# such as "at most 1.3x the floor" is judged on the medians of several rounds. Each round runs
# the floor, Quire with synchronous=normal, Quire with its defaults and the y-websocket server,
# one after the other, each on a fresh process. Writes target/bench/cpu-rounds.jsonl (labels
# "<server>-r<round>") and prints the medians and their ratios.
# Usage: bench/cpu_rounds.sh [ROUNDS] [DURATION]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/servers.sh
ROUNDS="${1:-3}"; DUR="${2:-20s}"
ROUND_RESULTS="$OUT/cpu-rounds.jsonl"
: > "$ROUND_RESULTS"
port=4700
for round in $(seq "$ROUNDS"); do
  for load in light:200:4:1 medium:100:4:3; do
    IFS=: read -r name rooms clients rate <<<"$load"
    for server in floor quire-normal quire y-websocket; do
      port=$((port + 1)); dir=$(mktemp -d)
      start_server "$server" "$port" "$dir"
      RESULTS="$ROUND_RESULTS" run "$server-r$round" y-websocket "$port" typing --rooms "$rooms" \
        --clients "$clients" --rate "$rate" --duration "$DUR" --prefix "$name"
      stop_server; rm -rf "$dir"
    done
  done
done
python3 - "$ROUND_RESULTS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
LOADS = {"light": (200, 1.0), "medium": (100, 3.0)}
def cpu(load, server):
    rooms, rate = LOADS[load]
    return [r["server_cpu_per_1k"] * 1000 for r in rows
            if (r["rooms"], r["rate"]) == (rooms, rate) and r["label"].rsplit("-r", 1)[0] == server]
for load in ("light", "medium"):
    med = {s: statistics.median(cpu(load, s)) for s in ("floor", "quire-normal", "quire", "y-websocket")}
    print(f"{load}: median CPU us/update " + ", ".join(f"{s} {v:.0f}" for s, v in med.items()))
    print(f"{load}: quire-normal / floor {med['quire-normal'] / med['floor']:.2f}x (bound 1.3x); "
          f"quire / y-websocket {med['quire'] / med['y-websocket']:.2f}x (bound 1.0x)")
PY
