#!/usr/bin/env bash
# Builds the agent's container image from a built binary: the binary and
# every shared library it loads (as ldd lists them, the dynamic loader
# included) go into an empty image (Containerfile), so nothing is pulled.
#   deploy/agent/image.sh [BINARY [TAG]]
# BINARY defaults to target/release/deepspan, TAG to deepspan-agent:latest.
# Needs podman.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary="${1:-$here/../../target/release/deepspan}"
tag="${2:-deepspan-agent:latest}"
[ -x "$binary" ] || { echo "image.sh: no binary at $binary (cargo build --release -p deepspan)" >&2; exit 1; }
command -v podman >/dev/null || { echo "image.sh: podman is required" >&2; exit 1; }
context=$(mktemp -d "${TMPDIR:-/tmp}/deepspan-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/rootfs/usr/bin" "$context/rootfs/tmp"
cp "$binary" "$context/rootfs/usr/bin/deepspan"
# Each library at the path the loader looks for it: ldd's "name => /path"
# lines and the loader's own absolute path.
ldd "$binary" | awk '/=> \// { print $3 } /^\t\/[^ ]+ \(/ { print $1 }' | while read -r lib; do
  mkdir -p "$context/rootfs$(dirname "$lib")"
  cp -L "$lib" "$context/rootfs$lib"
done
cp "$here/Containerfile" "$context/Containerfile"
podman build --quiet --tag "$tag" --file "$context/Containerfile" "$context" >/dev/null
echo "$tag"
