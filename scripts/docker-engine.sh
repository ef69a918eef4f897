#!/usr/bin/env bash
# scripts/docker-engine.sh start DIR — a Docker Engine of the tests' own: installs Debian's
# docker.io and busybox-static where missing, starts dockerd with its data root, exec root,
# pid file and socket under DIR, on a bridge of its own (named from DIR, on a /24 of
# 10.213.0.0/16 drawn from DIR's name) with no iptables chains and no masquerading: published
# ports go through Docker's userland proxy, and the host's firewall is left as it was. Imports
# `drover-busybox:local` (the host's /bin/busybox with its applets: no registry needed), and
# prints the endpoint (`unix://DIR/docker.sock`).
#
# scripts/docker-engine.sh stop DIR — removes every container, stops dockerd and what it
# started, unmounts what it left mounted under DIR, deletes its bridge and removes DIR.
set -euo pipefail

usage() {
  echo "usage: scripts/docker-engine.sh start|stop DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
DIR=$(realpath -m "$2")
SOCKET="$DIR/docker.sock"
ENDPOINT="unix://$SOCKET"
IMAGE=drover-busybox:local
# The bridge: a name of at most 15 characters and a subnet, both from DIR, so two engines
# (a developer's and CI's) on one host do not meet.
HASH=$(printf '%s' "$DIR" | md5sum | cut -c1-8)
BRIDGE="drv$HASH"
SUBNET_OCTET=$((16#${HASH:0:2}))

cli() {
  docker -H "$ENDPOINT" "$@"
}

install() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker >/dev/null 2>&1 || missing+=(docker.io)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ]; then
    echo "docker-engine: ${missing[*]} missing and not root to install them" >&2
    return 1
  fi
  echo "docker-engine: installing ${missing[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

start() {
  install
  mkdir -p "$DIR"
  if [ -S "$SOCKET" ] && cli version >/dev/null 2>&1; then
    echo "$ENDPOINT"
    return
  fi
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "10.213.$SUBNET_OCTET.1/24" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  # setsid: the daemon outlives this script, in a session of its own; `stop` ends it.
  setsid dockerd \
    --data-root "$DIR/data" \
    --exec-root "$DIR/exec" \
    --pidfile "$DIR/dockerd.pid" \
    -H "$ENDPOINT" \
    --iptables=false \
    --ip-masq=false \
    --bridge="$BRIDGE" \
    --log-level=warn \
    >"$DIR/dockerd.log" 2>&1 </dev/null &
  local waited=0
  until cli version >/dev/null 2>&1; do
    sleep 0.2
    waited=$((waited + 1))
    if [ $waited -gt 300 ]; then
      echo "docker-engine: dockerd did not answer within 60 s:" >&2
      tail -20 "$DIR/dockerd.log" >&2
      return 1
    fi
  done
  if ! cli image inspect "$IMAGE" >/dev/null 2>&1; then
    "$(dirname "$0")/busybox-rootfs.sh" "$DIR/rootfs" |
      cli import --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
  fi
  echo "$ENDPOINT"
}

stop() {
  [ -d "$DIR" ] || return 0
  if [ -S "$SOCKET" ]; then
    local containers
    containers=$(cli ps -aq 2>/dev/null || true)
    if [ -n "$containers" ]; then
      # shellcheck disable=SC2086
      cli rm -f $containers >/dev/null 2>&1 || true
    fi
  fi
  if [ -f "$DIR/dockerd.pid" ]; then
    local pid
    pid=$(cat "$DIR/dockerd.pid")
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
  # The containerd dockerd started, and any shim left behind.
  pkill -f -- "$DIR/exec" 2>/dev/null || true
  # Whatever is still mounted under DIR (overlays, the exec root's bind mounts), deepest first.
  awk -v dir="$DIR" '$2 == dir || index($2, dir "/") == 1 { print $2 }' /proc/self/mounts |
    sort -r | while read -r mount; do umount -l "$mount" 2>/dev/null || true; done
  ip link delete "$BRIDGE" 2>/dev/null || true
  rm -rf "$DIR"
}

case "$1" in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
