#!/usr/bin/env bash
# scripts/podman-engine.sh start DIR — podman's Docker-compatible API, as the docker tests'
# Engine: installs Debian's podman, runc, its CNI plugins, iptables and busybox-static where missing, and
# runs `podman system service` with its storage, run root, configuration and socket under DIR.
# Containers on podman's default (bridge) network join a CNI network of DIR's own: a bridge
# and a /24 of 10.214.0.0/16 both named from DIR, no masquerading and no firewall plugin, its
# addresses recorded under DIR; published ports are CNI portmap's DNAT rules. Imports
# `drover-busybox:local` (the host's /bin/busybox with its applets: no registry needed), and
# prints the endpoint (`unix://DIR/podman.sock`). docs/podman.md says how it differs.
#
# scripts/podman-engine.sh stop DIR — removes every container, stops the service and what it
# started (conmon), unmounts what it left mounted under DIR, deletes its bridges and the CNI
# iptables chains made since `start` (the portmap plugin's, the firewall plugin's of networks
# the tests created) and removes DIR.
set -euo pipefail

usage() {
  echo "usage: scripts/podman-engine.sh start|stop DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
DIR=$(realpath -m "$2")
SOCKET="$DIR/podman.sock"
ENDPOINT="unix://$SOCKET"
IMAGE=drover-busybox:local
HASH=$(printf '%s' "$DIR" | md5sum | cut -c1-8)
BRIDGE="pdm$HASH"
SUBNET="10.214.$((16#${HASH:0:2}))"
export CONTAINERS_CONF="$DIR/containers.conf"
export CONTAINERS_STORAGE_CONF="$DIR/storage.conf"
export CONTAINERS_REGISTRIES_CONF="$DIR/registries.conf"

podman_() {
  podman --root "$DIR/storage" --runroot "$DIR/run" "$@"
}

install() {
  local missing=()
  command -v podman >/dev/null 2>&1 || missing+=(podman)
  command -v runc >/dev/null 2>&1 || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  # The tests read the engine with the docker CLI, as a user of podman's API would.
  command -v docker >/dev/null 2>&1 || missing+=(docker.io)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ]; then
    echo "podman-engine: ${missing[*]} missing and not root to install them" >&2
    return 1
  fi
  echo "podman-engine: installing ${missing[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

configure() {
  # runc (Debian's podman recommends crun, which --no-install-recommends leaves out); open
  # files and processes within the host's hard limits (podman's own default, 1048576 open
  # files, fails every start with "error setting rlimit type 7" where the hard limit is
  # lower); cgroups managed directly (no systemd here); events in a file under DIR.
  cat >"$CONTAINERS_CONF" <<EOF
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[network]
network_config_dir = "$DIR/networks"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$DIR/events.log"
tmp_dir = "$DIR/tmp"
volume_path = "$DIR/volumes"
EOF
  cat >"$CONTAINERS_STORAGE_CONF" <<EOF
[storage]
driver = "overlay"
graphroot = "$DIR/storage"
runroot = "$DIR/run"
EOF
  # podman's default network, "podman", as DIR's own CNI network.
  mkdir -p "$DIR/networks" "$DIR/cni"
  cat >"$DIR/networks/podman.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "podman",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni",
        "routes": [{ "dst": "0.0.0.0/0" }],
        "ranges": [[{ "subnet": "$SUBNET.0/24", "gateway": "$SUBNET.1" }]]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
  # No registry is searched for a short name: a missing image fails at once.
  echo 'unqualified-search-registries = []' >"$CONTAINERS_REGISTRIES_CONF"
  mkdir -p "$DIR/tmp" "$DIR/volumes"
}

start() {
  install
  mkdir -p "$DIR"
  if [ -S "$SOCKET" ] && curl -sf --unix-socket "$SOCKET" http://podman/_ping >/dev/null 2>&1; then
    echo "$ENDPOINT"
    return
  fi
  configure
  # The CNI chains the host had before: `stop` removes only the ones made from now on.
  local table
  for table in filter nat; do
    iptables -t "$table" -S 2>/dev/null | awk -v table="$table" '/^-N CNI-/ { print table " " $2 }'
  done >"$DIR/cni-chains-before"
  ip -o link show type bridge | awk -F': ' '{ print $2 }' >"$DIR/bridges-before"
  # setsid: the service outlives this script, in a session of its own; `stop` ends it.
  setsid podman --root "$DIR/storage" --runroot "$DIR/run" --log-level=warn \
    system service --time=0 "$ENDPOINT" >"$DIR/service.log" 2>&1 </dev/null &
  echo $! >"$DIR/service.pid"
  local waited=0
  until curl -sf --unix-socket "$SOCKET" http://podman/_ping >/dev/null 2>&1; do
    sleep 0.2
    waited=$((waited + 1))
    if [ $waited -gt 300 ]; then
      echo "podman-engine: podman system service did not answer within 60 s:" >&2
      tail -20 "$DIR/service.log" >&2
      return 1
    fi
  done
  if ! podman_ image exists "$IMAGE"; then
    # podman names an imported image localhost/NAME; the tag makes the name the tests use
    # resolve as docker's does.
    "$(dirname "$0")/busybox-rootfs.sh" "$DIR/rootfs" |
      podman_ import --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
  fi
  echo "$ENDPOINT"
}

stop() {
  [ -d "$DIR" ] || return 0
  if [ -f "$CONTAINERS_CONF" ]; then
    podman_ rm -a -f -t 0 >/dev/null 2>&1 || true
  fi
  if [ -f "$DIR/service.pid" ]; then
    local pid
    pid=$(cat "$DIR/service.pid")
    kill "$pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$pid" 2>/dev/null; do
      sleep 0.2
      waited=$((waited + 1))
      if [ $waited -gt 100 ]; then
        kill -9 "$pid" 2>/dev/null || true
        break
      fi
    done
  fi
  # conmon (an exec session's lingers for its exit delay, and ignores SIGTERM) and cleanup
  # processes of containers the removal missed: anything naming DIR.
  pkill -f -- "$DIR/" 2>/dev/null || true
  sleep 0.5
  pkill -9 -f -- "$DIR/" 2>/dev/null || true
  # Whatever is still mounted under DIR (overlays, shm, netns), deepest first.
  awk -v dir="$DIR" '$2 == dir || index($2, dir "/") == 1 { print $2 }' /proc/self/mounts |
    sort -r | while read -r mount; do umount -l "$mount" 2>/dev/null || true; done
  ip link delete "$BRIDGE" 2>/dev/null || true
  # Bridges of the networks the tests created (podman names them cni-podmanN).
  local bridge
  for bridge in $(ip -o link show type bridge | awk -F': ' '{ print $2 }' | grep '^cni-podman'); do
    grep -qx -- "$bridge" "$DIR/bridges-before" 2>/dev/null || ip link delete "$bridge" 2>/dev/null || true
  done
  remove_cni_chains
  rm -rf "$DIR"
}

# The CNI chains (filter and nat tables) the host did not have before `start`: the portmap
# plugin's, and the firewall plugin's of networks the tests create. Each is emptied, the jumps
# into it are deleted, and it is removed.
remove_cni_chains() {
  local table chain rule
  for table in filter nat; do
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '/^-N CNI-/ { print $2 }'); do
      grep -qx -- "$table $chain" "$DIR/cni-chains-before" 2>/dev/null && continue
      { iptables -t "$table" -S | grep -E -- "^-A [^ ]+ .*-j $chain( |$)" || true; } |
        while read -r rule; do
          # eval: the rule as iptables printed it, quoted comments and all.
          eval "iptables -t $table ${rule/-A /-D }" 2>/dev/null || true
        done
      iptables -t "$table" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables -t "$table" -S 2>/dev/null | awk '/^-N CNI-/ { print $2 }'); do
      grep -qx -- "$table $chain" "$DIR/cni-chains-before" 2>/dev/null && continue
      iptables -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

case "$1" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
