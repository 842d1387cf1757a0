#!/bin/sh
# Smoke test of the benchmark suite, run by CI so that it cannot rot: every case of every
# implementation once, at toy sizes, then the report on that JSON, which must hold every
# case for every implementation asked for. Takes about ten seconds. The figures mean nothing.
#
#   perf/smoke.sh            # compiled, pure and the spec port (the compiled store must be built)
#   perf/smoke.sh pure,spec  # any --impl value of bench_store.py
#
# PYTHON picks the interpreter (default: python).
set -eu
python=${PYTHON:-python}
impls=${1:-all}
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$python" "$here/bench_store.py" --quick --impl "$impls" \
    --processes 1 --values 1 --warmups 0 --loops 1 --quiet -o "$tmp/smoke.json"
"$python" "$here/report.py" "$tmp/smoke.json" --require "$impls" >"$tmp/smoke.md"
for heading in "## All cases" "## Targets" "## Drain growth" "## Machine"; do
    grep -qx "$heading" "$tmp/smoke.md" || { echo "perf smoke: no '$heading' in the report" >&2; exit 1; }
done
echo "perf smoke: OK"
