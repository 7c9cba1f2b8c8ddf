#!/usr/bin/env bash
# Builds the browser side: the WASM client (client-wasm/, for wasm32-unknown-unknown) into
# web/pkg/, the same as an npm package into web/npm/, then the web pages into web/dist/
# (served by `quire serve` at /).
#
# rustup cannot add the wasm32 target on these machines, so this uses Debian's own newer
# toolchain (rustc-web + the exact std source, rust-web-src) to rebuild std with -Zbuild-std,
# and Debian's wasm-ld to link (docs: ../shared/notes/wasm-toolchain.md, README "Browser
# client"). Idempotent: every step is skipped when its output is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

DEB_RUSTC=/usr/bin/rustc
DEB_CARGO=/usr/bin/cargo
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/wasm-debian"
TOOLS="${QUIRE_WASM_TOOLS:-$HOME/.cache/wasm-tools}"

apt_install() {
  echo "--- installing $* (Debian packages)"
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# 1. Debian's toolchain: rustc-web (/usr/bin/rustc), cargo-web, the std source, a wasm linker.
if ! [ -x "$DEB_RUSTC" ] || ! [ -x "$DEB_CARGO" ] || ! [ -d /usr/lib/rustlib/src/rust/library ]; then
  apt_install rustc-web cargo-web rust-web-src
fi
LLVM_MAJOR=$("$DEB_RUSTC" -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
LINKER=/usr/bin/wasm-ld-$LLVM_MAJOR
if ! [ -x "$LINKER" ]; then
  apt_install "lld-$LLVM_MAJOR"
fi

# 2. wasm-bindgen-cli of exactly the version in Cargo.lock (the glue must match the library).
WB_VERSION=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)
[ -n "$WB_VERSION" ] || { echo "wasm-bindgen not found in Cargo.lock" >&2; exit 1; }
WASM_BINDGEN="$TOOLS/wasm-bindgen-$WB_VERSION/bin/wasm-bindgen"
if ! [ -x "$WASM_BINDGEN" ]; then
  echo "--- installing wasm-bindgen-cli $WB_VERSION (once per version, a few minutes)"
  # --locked can fail when the registry lacks a dependency locked in wasm-bindgen-cli's own
  # Cargo.lock; that attempt's output goes to a file, and the retry that resolves afresh says
  # it is deliberate instead of leaving a bare `error:` line in the log.
  first_try=$(mktemp)
  if ! cargo install wasm-bindgen-cli --version "=$WB_VERSION" --root "$TOOLS/wasm-bindgen-$WB_VERSION" \
      --locked >"$first_try" 2>&1; then
    echo "--- note: the --locked install did not resolve ($(grep -m1 -o 'error: .*' "$first_try" \
      | sed 's/^error: //')); retrying without --locked, a deliberate fallback"
    cargo install wasm-bindgen-cli --version "=$WB_VERSION" --root "$TOOLS/wasm-bindgen-$WB_VERSION"
  fi
  rm -f "$first_try"
fi

# 3. The client as a wasm32 cdylib (the crate is an rlib for native users; a cdylib+rlib
#    list would switch LTO off). The linker setting stays constant: changing it rebuilds all.
echo "--- building client-wasm for wasm32-unknown-unknown"
env RUSTC="$DEB_RUSTC" RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER="$LINKER" \
  "$DEB_CARGO" rustc -p quire-client --lib --profile wasm-release --target wasm32-unknown-unknown \
    --crate-type cdylib -Zbuild-std=std,panic_abort --target-dir "$TARGET_DIR" --quiet
WASM="$TARGET_DIR/wasm32-unknown-unknown/wasm-release/quire_client.wasm"

# 4. JavaScript glue; the hand-written TypeScript declarations replace the generated ones.
#    Skipped when neither the .wasm nor the declarations changed.
STAMP=$(cat "$WASM" client-wasm/quire-client.d.ts | sha256sum | cut -d' ' -f1)

# 5. npm packages (CodeMirror, the stock Yjs stack, esbuild, binaryen's wasm-opt, the test
#    tools), reinstalled only when package-lock.json changed.
LOCK_STAMP=$(sha256sum web/package-lock.json | cut -d' ' -f1)
if [ "$(cat web/node_modules/.quire-lock 2>/dev/null)" != "$LOCK_STAMP" ]; then
  npm ci --prefix web --no-audit --no-fund --silent
  echo "$LOCK_STAMP" > web/node_modules/.quire-lock
fi

if [ "$(cat web/pkg/.quire-stamp 2>/dev/null)" != "$STAMP" ]; then
  rm -rf web/pkg.tmp
  "$WASM_BINDGEN" --target web --no-typescript --out-dir web/pkg.tmp "$WASM"
  cp client-wasm/quire-client.d.ts web/pkg.tmp/quire_client.d.ts
  # npm's binaryen: Debian's binaryen 108 breaks wasm-bindgen's output at load.
  web/node_modules/.bin/wasm-opt -Oz --enable-bulk-memory --enable-nontrapping-float-to-int \
    --enable-sign-ext --enable-mutable-globals --enable-reference-types --enable-multivalue \
    web/pkg.tmp/quire_client_bg.wasm -o web/pkg.tmp/quire_client_bg.wasm
  echo "$STAMP" > web/pkg.tmp/.quire-stamp
  rm -rf web/pkg && mv web/pkg.tmp web/pkg
fi

# 6. The client as an npm package an application depends on by path (`npm install
#    /path/to/web/npm`): the glue, the module, the types, with client-wasm/npm's package.json
#    (its version set to the workspace's) and README.
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
rm -rf web/npm.tmp && mkdir -p web/npm.tmp
cp web/pkg/quire_client.js web/pkg/quire_client_bg.wasm web/pkg/quire_client.d.ts \
  client-wasm/npm/README.md web/npm.tmp/
node -e 'const fs = require("fs"); const p = JSON.parse(fs.readFileSync(process.argv[1]));
  p.version = process.argv[2]; fs.writeFileSync(process.argv[3], JSON.stringify(p, null, 2) + "\n")' \
  client-wasm/npm/package.json "$VERSION" web/npm.tmp/package.json
rm -rf web/npm && mv web/npm.tmp web/npm

# 7. The web pages -> web/dist (prints each file's raw and gzipped size).
node web/bundle.mjs
