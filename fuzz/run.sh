#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS (default 60), starting from the committed
# seeds. Exits non-zero if any target finds a crash, a panic, a hang or an allocation over the
# bounds; the input is then in fuzz/artifacts/<target>/ (see fuzz/README.md).
#
#   fuzz/run.sh [SECONDS] [TARGET...]      e.g.  fuzz/run.sh 30
#                                                fuzz/run.sh 600 room_update http_json
#
# Environment: FUZZ_SANITIZER (address, the default, or none: about twice as fast, finds
# panics, hangs and leaks of memory bounds but not memory errors in C code), FUZZ_ARGS (more
# libFuzzer flags, e.g. "-jobs=2 -workers=2" or "-max_len=65536"), CARGO_TARGET_DIR (default
# fuzz/target). Prefix with `nice -n 19` on a shared machine.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
seconds="${1:-60}"
[ $# -gt 0 ] && shift
all_targets=(frame_decoder awareness_decoder bus_envelope room_update http_json hocuspocus_frame)
if [ $# -gt 0 ]; then targets=("$@"); else targets=("${all_targets[@]}"); fi
case "$seconds" in
  ''|*[!0-9]*) echo "usage: $0 [SECONDS] [TARGET...]  (targets: ${all_targets[*]})" >&2; exit 2 ;;
esac
for t in "${targets[@]}"; do
  [ -d "$here/seeds/$t" ] || { echo "unknown target '$t' (targets: ${all_targets[*]})" >&2; exit 2; }
done

# cargo-fuzz drives libFuzzer, which needs nightly-only rustc flags (-Zsanitizer, sancov
# passes): the stable toolchain accepts them with RUSTC_BOOTSTRAP=1.
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}"
sanitizer="${FUZZ_SANITIZER:-address}"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "--- installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

cd "$root"
start=$(date +%s)
build=(cargo fuzz build -O --sanitizer "$sanitizer")
echo "+ RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=$CARGO_TARGET_DIR ${build[*]}"
"${build[@]}"
built=$(date +%s)
echo "--- built in $((built - start)) s"

mkdir -p "$here/logs"
failed=()
summary=()
for t in "${targets[@]}"; do
  corpus="$here/corpus/$t"
  mkdir -p "$corpus" "$here/artifacts/$t"
  cp -n "$here/seeds/$t/"* "$corpus/" 2>/dev/null || true
  run=(cargo fuzz run -O --sanitizer "$sanitizer" "$t" "$corpus" --
    "-max_total_time=$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10
    -print_final_stats=1 ${FUZZ_ARGS:-})
  echo "--- $t for ${seconds}s"
  echo "+ ${run[*]}"
  t0=$(date +%s)
  status=0
  # The room_update and http_json harnesses keep state across inputs: on a finding they write
  # every input since their last fresh database here, to replay in order.
  QUIRE_FUZZ_HISTORY="$here/artifacts/$t/history.hex" "${run[@]}" >"$here/logs/$t.log" 2>&1 || status=$?
  t1=$(date +%s)
  # The last status line and the final stats: executions, coverage, corpus.
  last=$(grep -E '^#[0-9]+' "$here/logs/$t.log" | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$here/logs/$t.log" | tail -1)
  line="$t: $((t1 - t0)) s, ${execs:-?} execs; ${last:-no status line}"
  summary+=("$line")
  if [ "$status" -ne 0 ]; then
    failed+=("$t")
    echo "!!! $t FAILED (exit $status): the end of its log, $here/logs/$t.log:"
    tail -60 "$here/logs/$t.log"
  else
    echo "$line"
  fi
done

echo "=== summary (build $((built - start)) s, total $(($(date +%s) - start)) s)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "=== findings in: ${failed[*]} (inputs in $here/artifacts/<target>/)"
  exit 1
fi
echo "=== no findings"
