#!/usr/bin/env bash
# Prints Drover's formation and simulation figures. Not part of the test suite: figures are
# measured here, never asserted in timed tests.
#   scripts/bench.sh [ROUNDS] [SIM_SEEDS]
#   scripts/bench.sh cluster [ROUNDS]   only the cluster figures of issue 19: formation, crash
#                                       and graceful failover, consistent against stale reads,
#                                       idle RSS, CSI claim+release (sequential, 32 at once)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = cluster ]; then
  echo "== formation, failover, reads, idle memory (cargo bench -p drover --bench formation -- ${2:-20})"
  cargo bench -p drover --bench formation -- "${2:-20}"
  echo
  echo "== CSI claim+release cycles (cargo bench -p drover --bench csi)"
  exec cargo bench -p drover --bench csi
fi
rounds=${1:-20}
seeds=${2:-200}
echo "== real processes (cargo bench -p drover --bench formation -- $rounds)"
cargo bench -p drover --bench formation -- "$rounds"
echo
echo "== CSI claim+release cycles and 100k-volume snapshot (cargo bench -p drover --bench csi)"
cargo bench -p drover --bench csi
echo
echo "== task start and stop with and without a cgroup per task (cargo bench -p drover-http --bench task_start)"
cargo bench -p drover-http --bench task_start
echo
echo "== Connect: DeriveSIToken for 10 sidecars, the revocation loop with 10k accessors (cargo bench -p drover --bench connect)"
cargo bench -p drover --bench connect
echo
echo "== task log streaming: disk, the client's agent, relayed through a server, following (cargo bench -p drover --bench logs)"
cargo bench -p drover --bench logs
echo
echo "== client -> server allocation updates under 1,000 task events/s (cargo bench -p drover-core --bench alloc_updates)"
cargo bench -p drover-core --bench alloc_updates
echo
echo "== writes and a jobs page against 100k jobs, 1M allocations, 10k nodes (cargo bench -p drover-http --bench state_scale)"
cargo bench -p drover-http --bench state_scale
echo
echo "== whole acknowledged writes through a real agent on that state, alone and with a reader looping on the jobs page (cargo bench -p drover-http --bench acked_writes)"
cargo bench -p drover-http --bench acked_writes
echo
echo "== a big list does not stall the agent: status and writes while clients loop on GET /v1/jobs (cargo bench -p drover --bench read_stall)"
cargo bench -p drover --bench read_stall
echo
echo "== every job's allocations and evaluations with 6,000 jobs: by-job indexes against a scan (cargo bench -p drover-core --bench state_reads)"
cargo bench -p drover-core --bench state_reads
echo
echo "== memory per 1,000 allocations of a 1-group and a 100-group job, and after purge and GC (cargo bench -p drover --bench alloc_memory)"
cargo bench -p drover --bench alloc_memory
echo
echo "== job registers one after another and from 16 clients; 32 clients of mixed load, req/s second by second (cargo bench -p drover --bench write_load)"
cargo bench -p drover --bench write_load
echo
echo "== container tasks against the Engine's own create+start: start, stop, 50 containers, RSS (cargo bench -p drover --bench docker)"
ENGINE=$(scripts/docker-engine.sh start target/docker-engine)
DROVER_TEST_DOCKER_HOST=$ENGINE cargo bench -p drover --bench docker || true
scripts/docker-engine.sh stop target/docker-engine
echo
echo "== scheduler placements (cargo bench -p drover --bench scheduler)"
cargo bench -p drover --bench scheduler
echo
echo "== job register -> all running across simulated clients (cargo test -p sim-tests -- --bench-jobs)"
cargo test -p sim-tests -- --bench-jobs | grep -vE '^(running|test result)'
echo
echo "== simulation lane throughput (cargo test -p sim-tests -- --seeds 0..$seeds)"
cargo test -p sim-tests -- --seeds "0..$seeds" | grep -E '^sim:'
