#!/usr/bin/env bash
# scripts/test.sh — the fast lane: the README's test command and what .ci/run runs. Everything
# that catches a defect, in at most 25 minutes on a clean clone of a 2-core machine: fmt, clippy
# in both worlds, every unit, datadriven and real-process test (each with its own deadline,
# the slowest ten printed), every simulation scenario on a few seeds with a replay of each, the
# seeds that once exposed bugs, every regression switch (the negative control's among them) at
# the run that its table records catches it, one shrink replayed from its file, the turmoil
# lane, and the corpus replay of every fuzz target.
#
# scripts/test.sh --long — the long lane: what moved out of the fast one. Hundreds of seeds
# per scenario with every run replayed, the coverage floors, each regression switch searched
# from seed 0 (timed) and shrunk, the turmoil lane on many seeds, the docker driver's tests
# against podman, each fuzz target for minutes
# from a fresh seed (crashes kept under target/fuzz-crashes). Run it before saying resolved on
# any change to core/, io-sim/, the drivers or the simulation, and quote its summary lines.
#
# Each world is built once: the normal build (which is also the turmoil lane's, `tokio_unstable`
# coming from .cargo/config.toml), and the madsim build under target/madsim, whose test binaries
# are then run directly. The madsim build starts first, at nice 19, and runs under the normal
# build and then the normal world's tests, taking only the CPU they leave idle (the normal
# build's serial stretches, the tests' waits on processes and timers). On a clean clone of the
# idle 2-core machine: 499 s in all with it (and protox no longer built), against 574 s when it
# started once the normal build was done (normal build 296 s against 285, the madsim build's
# wait after the tests 24 s against 105). Two
# builds at the same priority had cost more than one after the other (1,634 s against ~1,090: four
# compilers and their codegen threads on two cores). Each step's wall time is printed at the end
# (`build-madsim` is then what was left of it once those tests were done).
set -euo pipefail
cd "$(dirname "$0")/.."

LANE=fast
case "${1:-}" in
  "") ;;
  --long) LANE=long ;;
  *)
    echo "usage: scripts/test.sh [--long]" >&2
    exit 2
    ;;
esac

# The madsim world: the flags must match sim-tests/tests/sim.rs's, or target/madsim rebuilds;
# tokio_unstable lets each simulated run seed tokio's select! generator.
SIM_RUSTFLAGS="--cfg madsim --cfg tokio_unstable"
SIM_TARGET=target/madsim

# Lints ride along with the builds: clippy-driver (what `cargo clippy` runs) lints each
# workspace crate and then compiles it, so each world's dependency graph is compiled once rather
# than once to check and once to build. Every cargo call below, the simulation trampoline's and
# nextest's included, must share these, or the workspace crates' fingerprints differ and rebuild.
CLIPPY_DRIVER=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
export RUSTC_WORKSPACE_WRAPPER=$CLIPPY_DRIVER
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

STARTED=$SECONDS
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do
    kill_tree "$child"
  done
  kill "$1" 2>/dev/null || true
}
STEP_NAMES=()
STEP_SECS=()
summary() {
  local status=$?
  # A step failed while the madsim build ran on: stop it with the script.
  if [ -n "${MADSIM_BUILD_PID:-}" ]; then
    kill_tree "$MADSIM_BUILD_PID"
  fi
  # Stopped while the docker tests' Engine ran: stop it too.
  if [ -d target/docker-engine ]; then
    scripts/docker-engine.sh stop target/docker-engine >/dev/null 2>&1 || true
  fi
  if [ -d target/podman-engine ]; then
    scripts/podman-engine.sh stop target/podman-engine >/dev/null 2>&1 || true
  fi
  echo
  echo "=== scripts/test.sh ($LANE lane): wall time per step"
  for i in "${!STEP_NAMES[@]}"; do
    printf '  %-18s %6d s\n' "${STEP_NAMES[$i]}" "${STEP_SECS[$i]}"
  done
  printf '  %-18s %6d s  (%s)\n' total $((SECONDS - STARTED)) "$([ "$status" = 0 ] && echo passed || echo "FAILED, exit $status")"
}
trap summary EXIT
# Stopped by a signal: the summary says so rather than "passed".
trap 'exit 130' INT
trap 'exit 143' TERM

# step NAME COMMAND...: runs one step, timed; stops the script when it fails.
step() {
  local name=$1
  shift
  echo
  echo "=== $name"
  local begun=$SECONDS status=0
  "$@" || status=$?
  STEP_NAMES+=("$name")
  STEP_SECS+=($((SECONDS - begun)))
  if [ "$status" != 0 ]; then
    echo "=== $name FAILED (exit $status)"
    exit "$status"
  fi
}

tools() {
  # rustfmt and clippy come with the toolchain; add them if this machine's toolchain lacks them.
  if ! cargo fmt --version >/dev/null 2>&1 || [ ! -x "$RUSTC_WORKSPACE_WRAPPER" ]; then
    rustup component add rustfmt clippy || return
    RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver) || return
  fi
  # The test runner: per-test processes and deadlines. Fresh machines of this kind carry it;
  # build it from crates.io where one does not.
  if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest || return
  fi
}

# clippy runs inside the builds (above); what is left is the formatting.
fmt() {
  cargo fmt --all -- --check
}

# Test executables from cargo's JSON messages on stdin, as "NAME PATH" lines.
executables() {
  python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable") and message["profile"]["test"]:
        print(message["target"]["name"], message["executable"])
'
}

# The normal world, once, linted as it is built (clippy --workspace --all-targets): every
# target of the workspace (the turmoil lane's and the fuzzer's binaries among them, run
# directly below: `cargo test -p X` would unify features over X alone and build the
# dependency graph a second time; the benches are built to be linted).
build() {
  mkdir -p target
  cargo test --workspace --all-targets --locked --no-run --timings --message-format=json-render-diagnostics |
    executables >target/test-binaries.new || return
  mv target/test-binaries.new target/test-binaries
  cat target/test-binaries
}

# The madsim world, once, as sim-tests/tests/sim.rs builds it (the same features: the
# trampoline then finds nothing to rebuild), io-sim and sim-tests linted as they are built
# (the simulation-only code compiles to nothing in a normal build).
build_madsim() {
  mkdir -p $SIM_TARGET
  RUSTFLAGS="$SIM_RUSTFLAGS" CARGO_TARGET_DIR=$SIM_TARGET \
    cargo test --profile sim --locked -p drover-io-sim -p sim-tests --test sim --no-run --timings \
    --message-format=json-render-diagnostics |
    executables >$SIM_TARGET/test-binaries || return
  cat $SIM_TARGET/test-binaries
}

# The fast lane starts the madsim build first, at the lowest CPU priority: the normal build
# and then the normal world's tests (unit, real-process, turmoil, fuzz: about two and a half
# minutes, much of it waiting on real processes and timers) leave parts of the two cores idle,
# and it takes what they leave; they lose little to it (nice 19 against 0).
MADSIM_BUILD_LOG=target/madsim-build.log
MADSIM_BUILD_PID=
start_madsim_build() {
  mkdir -p target
  (
    renice -n 19 -p "$BASHPID" >/dev/null
    build_madsim
  ) >$MADSIM_BUILD_LOG 2>&1 &
  MADSIM_BUILD_PID=$!
}
wait_madsim_build() {
  local status=0
  wait "$MADSIM_BUILD_PID" || status=$?
  MADSIM_BUILD_PID=
  cat $MADSIM_BUILD_LOG
  return "$status"
}

# The path of test binary NAME in list FILE.
binary() {
  local path
  path=$(awk -v name="$1" '$1 == name { print $2 }' "$2" | tail -1)
  if [ -z "$path" ]; then
    echo "no test binary $1 in $2" >&2
    return 1
  fi
  echo "$path"
}

# nextest filters: unit tests (every crate's own, and the core's datadriven traces) apart from
# the tests that start real agents, plugins and processes.
UNIT='kind(lib) | kind(bin) | package(drover-core)'
REAL='not (kind(lib) | kind(bin) | package(drover-core))'
NEXTEST=(cargo nextest run --workspace --locked --lib --bins --test it --no-fail-fast)

unit() {
  "${NEXTEST[@]}" --profile default -E "$UNIT"
}

# The docker driver's tests run against an Engine of their own (scripts/docker-engine.sh:
# installed where missing, its roots and socket under target/, stopped and removed after).
DOCKER_ENGINE_DIR=target/docker-engine

real_process() {
  local status=0 endpoint
  endpoint=$(scripts/docker-engine.sh start "$DOCKER_ENGINE_DIR") || {
    scripts/docker-engine.sh stop "$DOCKER_ENGINE_DIR" || true
    return 1
  }
  DROVER_TEST_DOCKER_HOST=$endpoint "${NEXTEST[@]}" --profile real -E "$REAL" || status=$?
  scripts/docker-engine.sh stop "$DOCKER_ENGINE_DIR" || status=$?
  python3 scripts/slowest.py target/nextest/real/junit.xml 10 || true
  return "$status"
}

# The docker driver's tests again, against podman's Docker-compatible API
# (scripts/podman-engine.sh: installed where missing, its roots, network and socket under
# target/, stopped and removed after). docs/podman.md lists where podman answers differently.
PODMAN_ENGINE_DIR=target/podman-engine

podman_lane() {
  local status=0 endpoint
  endpoint=$(scripts/podman-engine.sh start "$PODMAN_ENGINE_DIR") || {
    scripts/podman-engine.sh stop "$PODMAN_ENGINE_DIR" || true
    return 1
  }
  DROVER_TEST_DOCKER_HOST=$endpoint "${NEXTEST[@]}" --profile real -E 'test(/^docker::/)' || status=$?
  scripts/podman-engine.sh stop "$PODMAN_ENGINE_DIR" || status=$?
  return "$status"
}

sim() {
  local bin
  bin=$(binary sim $SIM_TARGET/test-binaries) || return
  (cd sim-tests && "$bin" "$@")
}

turmoil() {
  local bin
  bin=$(binary turmoil target/test-binaries) || return
  (cd sim-tests && "$bin" "$@")
}

# The README's simulation commands, each parsed and routed by both lanes (--dry-run), and one
# run replayed end to end through cargo as a newcomer types it (both lanes see its arguments).
sim_commands() {
  local lane args madsim turmoil trampoline
  madsim=$(binary sim $SIM_TARGET/test-binaries) || return
  turmoil=$(binary turmoil target/test-binaries) || return
  trampoline=$(binary sim target/test-binaries) || return
  while IFS=$'\t' read -r lane args; do
    echo "README command ($lane lanes): -- $args"
    if [ "$lane" = both ]; then
      # shellcheck disable=SC2086
      "$madsim" $args --dry-run || return
    fi
    # shellcheck disable=SC2086
    "$turmoil" $args --dry-run || return
  done < <(python3 scripts/readme_sim_commands.py README.md)
  # What `cargo test -p sim-tests -- ARGS` runs: the madsim trampoline (which asks cargo for
  # the madsim build, already made) and the turmoil lane, both with ARGS.
  local replay=(--seed 42 --scenario leader_killed --trace)
  if ! (cd sim-tests && "$trampoline" "${replay[@]}" && "$turmoil" "${replay[@]}") >target/readme-replay.log 2>&1; then
    tail -40 target/readme-replay.log
    return 1
  fi
  echo "README: -- ${replay[*]} exited 0 in both lanes ($(wc -l <target/readme-replay.log) lines of output)"
}

fuzz() {
  local bin
  bin=$(binary fuzz target/test-binaries) || return
  (cd io-real/http && "$bin" "$@")
}

step tools tools
if [ "$LANE" = fast ]; then
  step fmt fmt
  # The madsim build starts first, at nice 19, under the normal world's build and then its
  # tests: it takes only what they leave idle. The normal world's build and what runs on it
  # come first, so their failures show before the madsim build's minutes.
  start_madsim_build
  step build build
  step unit unit
  step real-process real_process
  step turmoil turmoil
  # The corpora and the built-in seeds of every target, then 4,096 cases each from seed 0.
  step fuzz fuzz
  # What is left of the madsim build once the tests above are done.
  step build-madsim wait_madsim_build
  # The fast lane: every scenario on seeds 0..6 with a replay of each, the regression seeds,
  # every switch at its recorded catch, one shrink replayed from its file.
  step sim sim
  step sim-commands sim_commands
else
  # The committed code generated from proto/*.proto is what they generate.
  step proto-regen scripts/regen-proto.sh --check
  step build build
  step build-madsim build_madsim
  step sim sim --long
  step turmoil turmoil --long
  # The docker driver's tests against podman's compatible API. In the long lane until a
  # reattached container's last line, sometimes not in its log under podman, is found.
  step podman podman_lane
  # Every target for three minutes from a fresh seed (printed), two at a time on two cores;
  # crashes are kept.
  step fuzz fuzz --secs 180
fi
