#!/usr/bin/env bash
# The demo that must always work (run as root: the exec driver and the plugin's bind mounts
# need it). One `agent -dev`; the project's fake CSI plugin as a raw_exec system job; a
# volume; an exec job that writes to it; a second job that reads the file back; everything
# stopped. Each step shows the volume's claims, and the end shows the CSI calls in order.
#
#   scripts/demo.sh              # builds the debug binaries first
#   scripts/demo.sh --servers 3  # three servers (bootstrap_expect = 3) and a client-only
#                                # agent; the leader is killed (SIGKILL) while the writer runs
#   BIN=target/release scripts/demo.sh
set -euo pipefail

SERVERS=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --servers) SERVERS=$2; shift 2 ;;
    *) echo "demo: unknown argument $1 (usage: demo.sh [--servers 1|3])" >&2; exit 2 ;;
  esac
done
if [[ $SERVERS != 1 && $SERVERS != 3 ]]; then
  echo "demo: --servers must be 1 or 3" >&2
  exit 2
fi

cd "$(dirname "$0")/.."
BIN=${BIN:-target/debug}
if [[ -z "${SKIP_BUILD:-}" ]]; then
  cargo build -q --bin agent --bin drover-csi-fake
fi
AGENT=$(realpath "$BIN/agent")
FAKE=$(realpath "$BIN/drover-csi-fake")
if [[ $(id -u) -ne 0 ]]; then
  echo "demo: run as root (exec tasks and CSI mounts need it)" >&2
  exit 1
fi

WORK=$(mktemp -d /tmp/drover-demo.XXXXXX)
HTTP=${DEMO_HTTP_PORT:-14646}
export NOMAD_ADDR=http://127.0.0.1:$HTTP
# Every agent started, as "pid name"; the client's alloc dirs are under $DATA/alloc.
PIDS=()
DATA=$WORK/data

# Processes of the demo's own still running: those whose working directory or command line
# is under $WORK (tasks, their log collectors, the plugin), this script aside.
strays() {
  local proc pid cmdline
  for proc in /proc/[0-9]*; do
    pid=${proc#/proc/}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    cmdline=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || continue
    if [[ $(readlink "$proc/cwd" 2>/dev/null) == "$WORK"* || $cmdline == *"$WORK"* ]]; then
      echo "$pid"
    fi
  done
}

cleanup() {
  local entry pid
  # The client first, so it stops its tasks while the servers still answer.
  for entry in "${PIDS[@]}"; do
    pid=${entry%% *}
    if kill -0 "$pid" 2>/dev/null; then
      kill -INT "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  # A client agent that stops leaves its tasks running, to reattach to them when it comes
  # back (as Nomad's does): a demo that ended early, before its jobs stopped, stops them here
  # with their log collectors, so nothing it started outlives it.
  for pid in $(strays); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # And the volumes its plugin still has staged and published, deepest first.
  awk -v work="$WORK/" 'index($2, work) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r point; do umount -l "$point" 2>/dev/null || true; done
}
trap cleanup EXIT

step() { printf '\n==== %s\n' "$*"; }

# Polls a condition (a shell snippet) for up to $2 seconds.
wait_until() {
  local what=$1 limit=$2 condition=$3
  for _ in $(seq 1 $((limit * 5))); do
    if eval "$condition" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  echo "demo: timed out waiting for $what" >&2
  for log in "$WORK"/*.log; do
    echo "---- $(basename "$log") (last 40 lines)" >&2
    tail -40 "$log" >&2
  done
  return 1
}

json() { curl -sf "$NOMAD_ADDR$1"; }

# The allocation of a job, by its status ("" for any).
alloc_of() {
  json "/v1/job/$1/allocations" | python3 -c "
import json, sys
allocs = [a for a in json.load(sys.stdin) if '$2' in ('', a['ClientStatus'])]
print(allocs[0]['ID'] if allocs else '')"
}

claims() {
  json /v1/volume/csi/vol0 | python3 -c "
import json, sys
v = json.load(sys.stdin)
print('  claims: read=%s write=%s' % (sorted(v['ReadAllocs']), sorted(v['WriteAllocs'])))"
}

# The RPC address (as /v1/status/leader names it) -> pid and name of each server.
declare -A SERVER_PID SERVER_NAME

start_cluster() {
  local i http rpc serf join=() servers=()
  for i in 1 2 3; do
    join+=("-retry-join=127.0.0.1:$((HTTP + 10 * i + 2))")
    servers+=("127.0.0.1:$((HTTP + 10 * i + 1))")
  done
  for i in 1 2 3; do
    http=$((HTTP + 10 * i)) rpc=$((HTTP + 10 * i + 1)) serf=$((HTTP + 10 * i + 2))
    "$AGENT" -server -bootstrap-expect=3 -data-dir="$WORK/s$i" -node="s$i" -bind=127.0.0.1 \
      -http-port=$http -rpc-port=$rpc -serf-port=$serf -retry-interval=1s "${join[@]}" \
      >"$WORK/s$i.log" 2>&1 &
    PIDS+=("$! s$i")
    SERVER_PID["127.0.0.1:$rpc"]=$!
    SERVER_NAME["127.0.0.1:$rpc"]=s$i
  done
  # raw_exec is off unless enabled (Nomad's default); the plugin job below needs it.
  cat >"$WORK/c1.hcl" <<'HCL'
plugin "raw_exec" {
  config {
    enabled = true
  }
}
HCL
  "$AGENT" -client -data-dir="$DATA" -node=c1 -bind=127.0.0.1 -http-port="$HTTP" \
    -rpc-port=$((HTTP + 1)) -serf-port=$((HTTP + 2)) -servers="$(IFS=,; echo "${servers[*]}")" \
    -config="$WORK/c1.hcl" >"$WORK/c1.log" 2>&1 &
  # The client goes first in cleanup.
  PIDS=("$! c1" "${PIDS[@]}")
}

leader_of() { curl -sf "http://127.0.0.1:$1/v1/status/leader" | tr -d '"'; }

# The leader all live servers agree on ("" while they do not).
agreed_leader() {
  local i leader="" seen
  for i in 1 2 3; do
    kill -0 "${SERVER_PID[127.0.0.1:$((HTTP + 10 * i + 1))]}" 2>/dev/null || continue
    seen=$(leader_of $((HTTP + 10 * i))) || return 1
    [[ -n $seen && ( -z $leader || $seen == "$leader" ) ]] || return 1
    leader=$seen
  done
  echo "$leader"
}

kill_leader() {
  local leader pid i
  leader=$(agreed_leader)
  pid=${SERVER_PID[$leader]}
  step "kill the leader ${SERVER_NAME[$leader]} ($leader) with SIGKILL"
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
  if [[ $NOMAD_ADDR == "http://127.0.0.1:$((${leader##*:} - 1))" ]]; then
    # The CLI's server was the one killed (leadership moved to it since): use a survivor.
    for i in 1 2 3; do
      if [[ "127.0.0.1:$((HTTP + 10 * i + 1))" != "$leader" ]]; then
        export NOMAD_ADDR=http://127.0.0.1:$((HTTP + 10 * i))
        break
      fi
    done
    echo "  the CLI now uses $NOMAD_ADDR"
  fi
  wait_until "a new leader" 60 "next=\$(agreed_leader) && [[ -n \$next && \$next != $leader ]]"
  echo "  new leader: ${SERVER_NAME[$(agreed_leader)]} ($(agreed_leader))"
  "$AGENT" operator raft list-peers
}

if [[ $SERVERS == 1 ]]; then
  step "start agent -dev (data in $DATA)"
  "$AGENT" -dev -data-dir="$DATA" -http-port="$HTTP" -rpc-port=$((HTTP + 1)) -serf-port=$((HTTP + 2)) \
    >"$WORK/agent.log" 2>&1 &
  PIDS+=("$! agent")
else
  step "start three servers (bootstrap_expect = 3) and a client-only agent (data in $WORK)"
  start_cluster
  wait_until "the servers to elect a leader" 60 "[[ -n \$(agreed_leader) ]]"
  # The CLI talks to a follower's HTTP API, which forwards writes to the leader.
  for i in 1 2 3; do
    if [[ "127.0.0.1:$((HTTP + 10 * i + 1))" != "$(agreed_leader)" ]]; then
      export NOMAD_ADDR=http://127.0.0.1:$((HTTP + 10 * i))
      break
    fi
  done
  echo "  the CLI uses $NOMAD_ADDR (a follower)"
  "$AGENT" server members
  "$AGENT" operator raft list-peers
fi
wait_until "the node" 30 "json /v1/nodes | grep -q '\"Status\":\"ready\"'"
"$AGENT" node status

step "run the fake CSI plugin as a raw_exec system job"
cat >"$WORK/plugin.hcl" <<EOF
job "plugin" {
  type = "system"
  group "nodes" {
    task "plugin" {
      driver = "raw_exec"
      config {
        command = "$FAKE"
        args    = ["--state-dir=$WORK/fake-state", "--node-id=demo-node", "--stage-unstage", "--auto-create"]
      }
      csi_plugin {
        id   = "fake"
        type = "monolith"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
EOF
"$AGENT" job run "$WORK/plugin.hcl"
wait_until "the plugin to be healthy" 60 \
  "json /v1/plugin/csi/fake | python3 -c 'import json,sys; p=json.load(sys.stdin); sys.exit(0 if p[\"NodesHealthy\"]==1 and p[\"ControllersHealthy\"]==1 else 1)'"
"$AGENT" plugin status fake

step "register volume vol0"
cat >"$WORK/volume.hcl" <<EOF
id        = "vol0"
name      = "vol0"
type      = "csi"
plugin_id = "fake"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
EOF
"$AGENT" volume register "$WORK/volume.hcl"
"$AGENT" volume status vol0

consumer() {
  local name=$1 script=$2
  cat >"$WORK/$name.hcl" <<EOF
job "$name" {
  type = "batch"
  group "g" {
    volume "data" {
      type            = "csi"
      source          = "vol0"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }
    task "$name" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "$script"]
      }
      volume_mount {
        volume      = "data"
        destination = "/data"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
EOF
}

step "run an exec job that writes to the volume"
consumer writer "echo hello from the writer > /data/hello && sleep 2"
"$AGENT" job run "$WORK/writer.hcl"
wait_until "the writer to run" 60 "[[ -n \$(alloc_of writer running) ]]"
claims
if [[ $SERVERS == 3 ]]; then
  kill_leader
fi
wait_until "the writer to finish" 60 "[[ -n \$(alloc_of writer complete) ]]"
"$AGENT" job stop -purge writer
wait_until "the writer's claim to be released" 60 \
  "json /v1/volume/csi/vol0 | python3 -c 'import json,sys; v=json.load(sys.stdin); sys.exit(0 if not v[\"WriteAllocs\"] and not v[\"ReadAllocs\"] else 1)'"
claims

step "run a second job that reads the file back"
consumer reader "cat /data/hello && sleep 2"
"$AGENT" job run "$WORK/reader.hcl"
wait_until "the reader to run" 60 "[[ -n \$(alloc_of reader running) ]]"
claims
wait_until "the reader to finish" 60 "[[ -n \$(alloc_of reader complete) ]]"
READER=$(alloc_of reader complete)
READ=$(cat "$DATA/alloc/$READER/alloc/logs/reader.stdout.0")
echo "  the reader printed: $READ"
"$AGENT" job stop -purge reader
wait_until "the reader's claim to be released" 60 \
  "json /v1/volume/csi/vol0 | python3 -c 'import json,sys; v=json.load(sys.stdin); sys.exit(0 if not v[\"WriteAllocs\"] and not v[\"ReadAllocs\"] else 1)'"
claims

step "the CSI calls the plugin saw, in order"
PLUGIN_ALLOC=$(alloc_of plugin running)
grep -h '^drover-csi-fake: ' "$DATA/alloc/$PLUGIN_ALLOC/alloc/logs/plugin.stderr.0" \
  | grep -v -e 'serving on' -e 'Probe' -e 'GetPluginInfo' -e 'GetPluginCapabilities' -e 'NodeGetInfo' \
    -e 'NodeGetCapabilities' -e 'ControllerGetCapabilities' \
  | sed 's/^drover-csi-fake: /  /'

step "stop everything"
"$AGENT" job stop -purge plugin
wait_until "the plugin to stop" 30 "[[ -z \$(alloc_of plugin running) ]]"

if [[ "$READ" == "hello from the writer" ]]; then
  step "demo complete: the reader read what the writer wrote"
else
  echo "demo: the reader did not read the writer's file (got: $READ)" >&2
  exit 1
fi
