#!/usr/bin/env bash
# Every test: unit and integration tests of the whole workspace (including real-process
# cluster tests), then the simulation lane (which rebuilds itself under --cfg madsim in
# target/madsim). Lints first so a formatting slip fails fast.
set -euo pipefail
cd "$(dirname "$0")/.."
# rustfmt and clippy come with the toolchain; add them if this machine's toolchain lacks them.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The simulation-only crates compile to nothing in a normal build; lint them as simulated.
# The flags must match sim-tests/tests/sim.rs's, or target/madsim is rebuilt each time;
# tokio_unstable lets each simulated run seed tokio's select! generator.
SIM_RUSTFLAGS="--cfg madsim --cfg tokio_unstable"
RUSTFLAGS="$SIM_RUSTFLAGS" CARGO_TARGET_DIR=target/madsim \
  cargo clippy --profile sim --locked -p drover-io-sim -p sim-tests --all-targets -- -D warnings
# The simulated world's own unit tests (invariant checkers) exist only under --cfg madsim.
RUSTFLAGS="$SIM_RUSTFLAGS" CARGO_TARGET_DIR=target/madsim cargo test --profile sim --locked -p drover-io-sim --lib
cargo test --workspace --locked
# Every fuzz target for 60 s (their corpora were already replayed above), from a fixed seed so
# CI is reproducible; exploratory runs take a fresh seed (README, Fuzzing).
cargo test -p drover-io-real --locked --test fuzz -- --secs 60 --seed 1
