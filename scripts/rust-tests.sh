#!/usr/bin/env bash
# scripts/rust-tests.sh: the whole Rust suite (`cargo test --release
# --no-fail-fast -- --include-ignored`, arguments appended), then, when it
# failed, each failed test's output once more at the very end. A failure's
# message is printed by its test binary, long before the other binaries
# finish: at the end of the log it is where a reader of a truncated CI log
# looks.
set -uo pipefail
log=$(mktemp "${TMPDIR:-/tmp}/deepspan-rust-tests.XXXXXX")
trap 'rm -f "$log"' EXIT
"${CARGO:-cargo}" test --release --no-fail-fast "$@" -- --include-ignored 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
  echo "rust-tests: the failed tests' output again (each binary's \"failures:\" section):"
  # From a binary's "failures:" line to its "test result:" line.
  awk '/^failures:$/ { on = 1 } on { print } /^test result:/ { on = 0 }' "$log"
fi
exit "$status"
