#!/bin/sh
# Smoke test of the durable benchmarks (perf/bench_durable.py), run by CI so that they
# cannot rot: every case of every durable store, its floors and peers, once, at toy sizes,
# then the report on that JSON, which must hold every case. It starts a throwaway
# PostgreSQL cluster (tests/_pg.py) unless HAREL_STORE_PG_URL names a server. Takes well
# under a minute. The figures mean nothing.
#
#   perf/smoke_durable.sh                 # sqlite-normal, sqlite-full and postgres
#   perf/smoke_durable.sh sqlite          # any --store value of bench_durable.py
#
# PYTHON picks the interpreter (default: python).
set -eu
python=${PYTHON:-python}
stores=${1:-all}
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$python" "$here/bench_durable.py" --quick --store "$stores" \
    --processes 1 --values 1 --warmups 0 --loops 1 --quiet -o "$tmp/smoke.json"
"$python" "$here/report.py" "$tmp/smoke.json" --require-durable "$stores" >"$tmp/smoke.md"
for heading in "## Durable stores" "### Durable targets" "## Machine"; do
    grep -qx "$heading" "$tmp/smoke.md" || { echo "perf durable smoke: no '$heading' in the report" >&2; exit 1; }
done
echo "perf durable smoke: OK"
