#!/usr/bin/env bash
# Runs every cargo-fuzz target (as `cargo fuzz list` names them, so a new
# target needs no edit here) for the given number of seconds each (default
# 600), one after the other. Seeds: fuzz/<target>_seeds when it exists, plus
# the shared test data folders that hold the target's input format (read
# only; libFuzzer writes what it learns to fuzz/corpus/<target>). The fuzzers
# need nightly-only compiler flags; RUSTC_BOOTSTRAP lets the stable
# toolchain of this machine accept them.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
fuzz_dir="$(cd "$(dirname "$0")/../fuzz" && pwd)"
testdata="$fuzz_dir/../../shared/testdata"
cd "$fuzz_dir"
seconds=${1:-600}
shift || true
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
export RUSTC_BOOTSTRAP=1

# Shared test data a target reads as extra seeds (none for the others).
extra_seeds() {
  case "$1" in
    import_jaeger) echo "$testdata/spans/jaeger $testdata/spans/jaeger-ui-critical-path" ;;
    import_zipkin) echo "$testdata/spans/zipkin" ;;
    import_otlp_json) echo "$testdata/spans/otlp" ;;
    import_otlp_proto) echo "$fuzz_dir/span_store_seeds" ;;
  esac
}

if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi
failed=()
for target in "${targets[@]}"; do
  mkdir -p "corpus/$target"
  seeds=()
  [ -d "${target}_seeds" ] && seeds+=("${target}_seeds")
  for dir in $(extra_seeds "$target"); do
    [ -d "$dir" ] && seeds+=("$dir")
  done
  echo "== fuzzing $target for ${seconds}s (seeds: ${seeds[*]:-none})"
  if ! cargo fuzz run "$target" "corpus/$target" "${seeds[@]}" -- \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1; then
    failed+=("$target")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets that found a problem (inputs in fuzz/artifacts/): ${failed[*]}" >&2
  exit 1
fi
