#!/usr/bin/env bash
# Builds the OpenTelemetry Collector of deploy/collector (OTLP receiver,
# batch processor, OTLP/HTTP exporter, all of one release) from the Go
# module proxy and caches it, keyed by its go.sum: the build takes a minute,
# so it runs once per machine and version. Prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/../deploy/collector"
cache="${DEEPSPAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deepspan}"
key=$(cat go.mod go.sum main.go | sha256sum | cut -c1-16)
binary="$cache/otelcol-$key/otelcol"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
command -v go >/dev/null || { echo "go is required to build the Collector" >&2; exit 1; }
echo "building the OpenTelemetry Collector of deploy/collector (once; cached in $cache)" >&2
mkdir -p "$(dirname "$binary")"
CGO_ENABLED=0 go build -trimpath -o "$binary.tmp" .
mv "$binary.tmp" "$binary"
echo "$binary"
