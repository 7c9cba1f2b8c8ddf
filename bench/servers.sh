# Sourced by the bench scripts (run.sh, cores.sh, nodes.sh, history.sh): where the build and
# the results are, starting and stopping the servers under test, and running quire-bench
# against one. Run from the repository's root.

RELEASE="${RELEASE:-${CARGO_TARGET_DIR:-target}/release}"
BENCH="${BENCH:-$RELEASE/quire-bench}"
# The Quire binary under test (another build, to compare in one run).
QUIRE_BIN="${QUIRE_BIN:-$RELEASE/quire}"
OUT="${OUT:-target/bench}"
RESULTS="${RESULTS:-$OUT/results.jsonl}"
mkdir -p "$OUT"

wait_port() { # port name: until something listens on 127.0.0.1:port, at most 10 s
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$2 did not start" >&2; return 1
}

start_server() { # name port dir -> sets PID
  case "$1" in
    quire) "$QUIRE_BIN" serve --bind "127.0.0.1:$2" --database "sqlite://$3/quire.db" \
             --log warn ${QUIRE_ARGS:-} >"$3/log" 2>&1 & ;;
    quire-normal) "$QUIRE_BIN" serve --bind "127.0.0.1:$2" --database "sqlite://$3/quire.db" \
             --log warn --sqlite-synchronous normal >"$3/log" 2>&1 & ;;
    floor) "$RELEASE/quire-floor" "127.0.0.1:$2" >"$3/log" 2>&1 & ;;
    # The floor with Quire's 128-byte read buffer: the floor for idle memory.
    floor-lean) "$RELEASE/quire-floor" "127.0.0.1:$2" 128 >"$3/log" 2>&1 & ;;
    y-websocket) node bench/peers/y-websocket.mjs "$2" >"$3/log" 2>&1 & ;;
    hocuspocus) node bench/peers/hocuspocus.mjs "$2" "$3/hocuspocus.db" >"$3/log" 2>&1 & ;;
  esac
  PID=$!
  wait_port "$2" "$1"
}

stop_server() { kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }

run() { # label flavor port dir args...
  local label=$1 flavor=$2 port=$3; shift 3
  "$BENCH" "$@" --url "ws://127.0.0.1:$port${URL_PATH:-}" --flavor "$flavor" --server-pid "$PID" \
    --label "$label" 2>&1 | tee -a "$OUT/log.txt" | grep '^{' >> "$RESULTS" || true
}
