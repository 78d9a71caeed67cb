#!/usr/bin/env bash
# Builds a small Go program of this repository from the Go module proxy and
# caches it, keyed by its go.mod, go.sum and main.go: the first build takes
# up to a minute, so it runs once per machine and version. Prints the
# binary's path.
#   scripts/build-go.sh deploy/collector otelcol        the OpenTelemetry
#                                                        Collector (OTLP in,
#                                                        batch, OTLP/HTTP out)
#   scripts/build-go.sh deploy/check manifest-check     the Kubernetes
#                                                        manifests' check
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: scripts/build-go.sh FOLDER NAME" >&2; exit 2; }
cd "$(dirname "$0")/../$1"
name="$2"
cache="${DEEPSPAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deepspan}"
key=$(cat go.mod go.sum main.go | sha256sum | cut -c1-16)
binary="$cache/$name-$key/$name"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
command -v go >/dev/null || { echo "go is required to build $name ($1)" >&2; exit 1; }
echo "building $name of $1 (once; cached in $cache)" >&2
mkdir -p "$(dirname "$binary")"
CGO_ENABLED=0 go build -trimpath -o "$binary.tmp" .
mv "$binary.tmp" "$binary"
echo "$binary"
