#!/usr/bin/env bash
# Every test: unit and integration tests of the whole workspace (including real-process
# cluster tests), then the simulation lane (which rebuilds itself under --cfg madsim in
# target/madsim). Lints first so a formatting slip fails fast.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
