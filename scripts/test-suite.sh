#!/usr/bin/env bash
# scripts/test-suite.sh: the build and test stages of `make test` (the
# set-up, the Java extension and the web UI's bundle come first).
#
# The deepspan CLI's system tests are most of the suite's time, and they run
# one at a time: each injects faults into this one machine (CPU hogs and
# quotas, disk floods, shaped links) and judges what the kernel shows. So
# they start as soon as the binaries they run are built, and everything
# else happens beside them:
#
#   build: release binaries, CLI tests ─┬─ CLI tests, system tests one at a time ──────┬─ system tests of the
#                                       └─ build the other tests (nice 19), their       │  other crates, fleet
#                                          tests that need no root, SDKs, UI units      ┘  tables, UI end to end
#
# The build beside them takes only the CPU time the system tests leave; if
# they end first, it gets its full share back (a busy machine would starve
# it otherwise).
#
# Nothing that injects faults or records the kernel runs beside the CLI's
# system tests: the other crates' system tests (#[ignore = "system: …"]) wait
# for them. Every test runs once: the other crates' tests in two passes,
# without their ignored tests and then only those.
#
# The CLI's tests log to a file printed whole when they end, so the log
# reads as stages one after another. At the end: each stage's wall time,
# then, when a Rust test failed, the failed tests' output once more (a
# truncated CI log shows its end). Exits non-zero when any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
target=${TARGET_DIR:-${CARGO_TARGET_DIR:-target}}
deepspan=$target/release/deepspan
logs=$target/test-logs
timed=scripts/timed.sh
binaries=scripts/test-binaries.py

step() {
  case "$1" in
    # What the CLI's tests run: the release binaries and the CLI's test
    # executables (their names go to cli.json).
    build-cli)
      "$cargo" build --release -p deepspan -p deepspan-workloads &&
        "$cargo" test --release -p deepspan --no-run --message-format=json-render-diagnostics \
          >"$logs/cli.json" ;;
    cli-tests)
      "$binaries" "$logs/cli.json" -- --include-ignored ;;
    # Every other test executable of the default members.
    build-rest)
      "$cargo" test --release --no-run --message-format=json-render-diagnostics \
        >"$logs/rest.json" ;;
    rest-tests)
      "$binaries" "$logs/rest.json" --except deepspan &&
        "$cargo" test --release --doc ;;
    rest-system-tests)
      "$binaries" "$logs/rest.json" --except deepspan -- --ignored ;;
    *)
      echo "test-suite: unknown step $1" >&2
      return 2 ;;
  esac
}

if [ $# -gt 0 ]; then
  step "$1"
  exit
fi

rm -rf "$logs"
mkdir -p "$logs"
"$timed" "build (binaries, CLI tests)" "$0" build-cli || exit

"$timed" "CLI tests (one at a time)" "$0" cli-tests >"$logs/cli.log" 2>&1 &
cli=$!

# A process and all its descendants.
tree() {
  local child
  echo "$1"
  for child in $(pgrep -P "$1"); do tree "$child"; done
}

failed=0
run() { "$timed" "$@" 2>&1 | tee -a "$logs/rest.log" || failed=1; }
nice -n 19 "$timed" "build (other tests, beside)" "$0" build-rest &
build=$!
while kill -0 "$build" 2>/dev/null; do
  if ! kill -0 "$cli" 2>/dev/null; then
    # Twice: a compiler started while the first pass ran kept cargo's nice.
    for _ in 1 2; do
      renice -n 0 -p $(tree "$build") >/dev/null 2>&1
      sleep 1
    done
    break
  fi
  sleep 2
done
if wait "$build"; then
  run "Rust tests (other, beside)" "$0" rest-tests
else
  failed=1
fi
run "Python SDK tests (beside)" python3 -m pytest -q -p no:cacheprovider sdk/python/tests
run "Node.js SDK tests (beside)" node --test sdk/node/test/
run "UI units (beside)" node ui/test/units.test.mjs
run "UI queue band (beside)" node ui/test/queue.test.mjs

wait "$cli" || failed=1
cat "$logs/cli.log"
[ -s "$logs/rest.json" ] && run "Rust system tests (other)" "$0" rest-system-tests

# The fleet tables are read from demo_real's kept row-lock run (the same
# `deepspan demo --scenario db-row-lock` the fleet test records without it)
# when this suite made it.
fleet_run=$target/tmp/kept-demo/db-row-lock
if [ "$fleet_run/analysis/requests.json" -nt "$logs/cli.json" ]; then
  export DEEPSPAN_FLEET_RUN=$fleet_run
fi
run "fleet tables" python3 -m pytest -q -p no:cacheprovider tests/fleet --deepspan "$deepspan"
run "UI end to end" node ui/e2e/e2e.mjs --deepspan "$deepspan" --out "$target/ui-e2e"

if grep -q '^failures:$' "$logs/cli.log" "$logs/rest.log" 2>/dev/null; then
  echo "test-suite: the failed tests' output again (each executable's \"failures:\" section):"
  # From an executable's "failures:" line to its "test result:" line.
  cat "$logs/cli.log" "$logs/rest.log" |
    awk '/^failures:$/ { on = 1 } on { print } /^test result:/ { on = 0 }'
fi
exit "$failed"
