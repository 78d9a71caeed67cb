#!/usr/bin/env bash
# Builds a program of the Jaeger module from the Go module proxy and caches
# it: the build takes minutes, so it runs once per machine. Prints the
# binary's path.
#   scripts/build-jaeger.sh          Jaeger v2 all-in-one, the tracing
#                                    back-end of the export and agent tests
#   scripts/build-jaeger.sh hotrod   HotROD (examples/hotrod of the same
#                                    module), the cost benchmarks' second
#                                    workload
# `go install` refuses the module (its go.mod has replace directives), so
# the module folder is downloaded, copied somewhere writable, and built
# there.
set -euo pipefail
program="${1:-jaeger}"
case "$program" in
  jaeger) package=./cmd/jaeger ;;
  hotrod) package=./examples/hotrod ;;
  *) echo "build-jaeger.sh: unknown program $program (jaeger or hotrod)" >&2; exit 2 ;;
esac
version="${JAEGER_VERSION:-v1.76.0}"
cache="${DEEPSPAN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deepspan}"
binary="$cache/jaeger-$version/$program"
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi
command -v go >/dev/null || { echo "go is required to build $program" >&2; exit 1; }
echo "building $program of Jaeger $version (once; cached in $cache)" >&2
module_dir=$(go mod download -json "github.com/jaegertracing/jaeger@$version" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
work=$(mktemp -d "${TMPDIR:-/tmp}/deepspan-jaeger-build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -r "$module_dir/." "$work/src"
chmod -R u+w "$work/src"
mkdir -p "$(dirname "$binary")"
(cd "$work/src" && CGO_ENABLED=0 go build -trimpath -o "$work/$program" "$package")
mv "$work/$program" "$binary"
echo "$binary"
