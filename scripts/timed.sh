#!/usr/bin/env bash
# scripts/timed.sh STAGE CMD...: runs CMD, then prints "STAGE: T s" (and
# "failed" when it did) to stderr. With DEEPSPAN_STAGE_LOG set, the line is
# appended to that file too: .ci/run prints the stages' times at its end,
# also when one failed.
set -uo pipefail
stage="$1"
shift
started=$(date +%s)
"$@"
status=$?
line=$(printf '%-28s %5d s' "$stage" "$(( $(date +%s) - started ))")
[ "$status" -eq 0 ] || line+="  (failed, exit $status)"
echo "stage: $line" >&2
[ -n "${DEEPSPAN_STAGE_LOG:-}" ] && echo "$line" >>"$DEEPSPAN_STAGE_LOG"
exit "$status"
