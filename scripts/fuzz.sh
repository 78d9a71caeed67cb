#!/usr/bin/env bash
# Runs every cargo-fuzz target for the given number of seconds (default 600),
# seeded with the small traces kept under fuzz/<target>_seeds. The fuzzers
# need nightly-only compiler flags; RUSTC_BOOTSTRAP lets the stable
# toolchain of this machine accept them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-600}
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1
for target in trace_dat ctf; do
  mkdir -p "corpus/$target"
  echo "== fuzzing $target for ${seconds}s"
  cargo fuzz run "$target" "corpus/$target" "${target}_seeds" -- \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10
done
