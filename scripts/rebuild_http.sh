#!/usr/bin/env bash
# scripts/rebuild_http.sh — the incremental rebuild after touching one HTTP handler (issue 56's
# figure): builds the agent once, appends a comment line to the fs handler, times the rebuild
# of `agent` (dev profile, as the tests build it), and restores the file.
#
#   scripts/rebuild_http.sh [ROUNDS]     # default 3; prints each round's seconds
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
handler=io-real/http/src/fs.rs
[ -f "$handler" ] || handler=io-real/src/http/fs.rs # before the HTTP crate was cut out
cargo build --quiet --bin agent
cp "$handler" "$handler.orig"
trap 'mv "$handler.orig" "$handler"' EXIT
for round in $(seq "$rounds"); do
  echo "// touched $round" >>"$handler"
  start=$(date +%s%N)
  cargo build --quiet --bin agent
  ms=$((($(date +%s%N) - start) / 1000000))
  printf 'rebuild after touching %s: %d.%03d s\n' "$handler" $((ms / 1000)) $((ms % 1000))
done
