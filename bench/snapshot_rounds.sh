#!/usr/bin/env bash
# Target 2's snapshot in rounds (docs/benchmarks.md, "A document of 10 million items"): one
# store holding the many-items document (REPLAYS replays of the editing trace, as in
# bench/items.sh: uploaded, then the server restarted and typed into, then killed with SIGKILL
# so the typed updates stay in the log), then ROUNDS rounds alternating, each on a fresh
# process:
#   - the floor: `quire-bench roundtrip`, yrs alone decoding the document's state (Yjs v1,
#     read from a file first, untimed) into a fresh document and encoding it again;
#   - `quire compact` on a fresh copy of the store: read, decoded, the log rows applied,
#     encoded and written (the whole command, timed from outside).
# Writes target/bench/snapshot-rounds.jsonl and prints the medians and their ratio.
# Bounded: every step stops by itself; about 4 minutes with 5 rounds.
# Usage: [REPLAYS=1250] bench/snapshot_rounds.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p quire-server -p quire-bench
source bench/servers.sh
ROUNDS="${1:-4}"
REPLAYS="${REPLAYS:-1250}"
ROWS="$OUT/snapshot-rounds.jsonl"
: > "$ROWS"
store=$(mktemp -d); copy=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null; rm -rf "$store" "$copy"' EXIT
STORE_ROWS="$OUT/snapshot-rounds-store.jsonl"
: > "$STORE_ROWS"
QUIRE_ARGS="--snapshot-updates 50 --snapshot-log-percent 0"
memory() { # port label args...
  local p=$1 label=$2; shift 2
  "$BENCH" memory --trace-replays "$REPLAYS" --clients 50 --url "ws://127.0.0.1:$p" \
    --server-pid "$PID" --label "$label" --prefix items "$@" 2>&1 | tee -a "$OUT/log.txt" \
    | grep '^{' >> "$STORE_ROWS" || true
  # A failed upload or typing step would leave another workload to compact: stop instead.
  grep -q "\"label\":\"$label\"" "$STORE_ROWS" \
    || { echo "snapshot_rounds.sh: quire-bench memory ($label) reported nothing" >&2; exit 1; }
}
start_server quire 4981 "$store"
memory 4981 quire --save-state "$store/state.v1"
stop_server
start_server quire 4982 "$store"
memory 4982 quire-restart --no-upload
kill -KILL "$PID"; wait "$PID" 2>/dev/null || true
PID=
for round in $(seq "$ROUNDS"); do
  "$BENCH" roundtrip --state "$store/state.v1" --label "floor-r$round" | tee -a "$ROWS"
  rm -rf "${copy:?}"/*; cp "$store"/quire.db* "$copy"/
  started=$(date +%s.%N)
  "$QUIRE_BIN" compact --database "sqlite://$copy/quire.db" --log warn items-large >/dev/null
  ended=$(date +%s.%N)
  python3 -c "import json; print(json.dumps({'scenario': 'compact', 'label': 'quire-r$round', \
    'replays': $REPLAYS, 'snapshot_ms': ($ended - $started) * 1000}))" | tee -a "$ROWS"
done
python3 - "$ROWS" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
floor = [r["snapshot_ms"] for r in rows if r["scenario"] == "roundtrip"]
quire = [r["snapshot_ms"] for r in rows if r["scenario"] == "compact"]
print("floor (yrs decode + encode) ms:", ", ".join(f"{v:.0f}" for v in floor))
print("quire compact ms:", ", ".join(f"{v:.0f}" for v in quire))
print("round by round:", ", ".join(f"{q / f:.2f}x" for f, q in zip(floor, quire)))
print(f"medians: floor {statistics.median(floor):.0f}, quire {statistics.median(quire):.0f}: "
      f"{statistics.median(quire) / statistics.median(floor):.2f}x (target at most 1.2x)")
PY
