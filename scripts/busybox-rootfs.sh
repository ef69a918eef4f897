#!/usr/bin/env bash
# scripts/busybox-rootfs.sh DIR — writes to stdout, as a tar, the root filesystem of the tests'
# `drover-busybox:local` image: the host's /bin/busybox with a link for each of its applets, and
# a root user. DIR is its scratch directory, removed afterwards. The engine scripts import it
# (`scripts/docker-engine.sh`, `scripts/podman-engine.sh`): no registry is needed.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: scripts/busybox-rootfs.sh DIR" >&2; exit 2; }
rootfs=$1
rm -rf "$rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp" "$rootfs/proc" "$rootfs/sys" "$rootfs/dev"
cp /bin/busybox "$rootfs/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ -e "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
done
echo "root:x:0:0:root:/:/bin/sh" >"$rootfs/etc/passwd"
echo "root:x:0:" >"$rootfs/etc/group"
tar -C "$rootfs" -c .
rm -rf "$rootfs"
