#!/usr/bin/env bash
# Regenerates proto/src/generated/ from proto/proto/*.proto (prost and tonic, compiled by protox:
# no system protoc), after a change to a .proto file. The generated code is committed so that no
# build compiles the generators. `--check` (the long lane) fails when the committed code is not
# what the .proto files generate.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked -p drover-proto --features regen
if [ "${1:-}" = --check ]; then
  if ! git diff --exit-code --stat -- proto/src/generated; then
    echo "proto/src/generated is not what proto/proto/*.proto generate: run scripts/regen-proto.sh and commit it" >&2
    exit 1
  fi
  echo "proto/src/generated is current"
fi
