#!/usr/bin/env bash
# Builds the Jaeger v2 all-in-one binary that the export test sends spans to,
# from the Go module proxy, and caches it: the build takes minutes, so it runs
# once per machine. `go install` refuses the module (its go.mod has replace
# directives), so the module folder is downloaded, copied somewhere writable,
# and built there. Prints the binary's path.
set -euo pipefail
version="${JAEGER_VERSION:-v1.76.0}"
cache="${DEEPSPAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deepspan}"
binary="$cache/jaeger-$version/jaeger"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
command -v go >/dev/null || { echo "go is required to build Jaeger" >&2; exit 1; }
echo "building Jaeger $version (once; cached in $cache)" >&2
module_dir=$(go mod download -json "github.com/jaegertracing/jaeger@$version" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
work=$(mktemp -d "${TMPDIR:-/tmp}/deepspan-jaeger-build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$module_dir/." "$work/src"
chmod -R u+w "$work/src"
mkdir -p "$(dirname "$binary")"
(cd "$work/src" && CGO_ENABLED=0 go build -trimpath -o "$work/jaeger" ./cmd/jaeger)
mv "$work/jaeger" "$binary"
echo "$binary"
