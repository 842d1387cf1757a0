#!/usr/bin/env bash
# Install every artifact of tools/build_dists.sh in a fresh virtual environment and check it:
#
#   bash tools/check_dists.sh [DISTDIR]        (default: dist/)
#
# - each compiled wheel, on its own CPython, installed with --no-index: --version and --info
#   (compiled, loaded from the venv, the Cython version it was built with), no line tracing,
#   and the whole test suite of the sdist, run from a directory that holds no harel_store/,
#   under HAREL_STORE_REQUIRE_EXTENSIONS=1;
# - the pure wheel on the oldest and the newest CPython, installed with --no-index: --info
#   says pure, the demo runs;
# - the sdist with no C compiler (CC, CXX and LDSHARED all /bin/false): the install
#   succeeds, prints the loud fallback WARNING, and --info says pure; the same install under
#   HAREL_STORE_REQUIRE_EXTENSIONS=1 fails with a message that names the variable.
#
# Needs the interpreters of build_dists.sh and PyPI: pytest and hypothesis (the `test` extra)
# for the test runs, setuptools and Cython for the isolated builds of the sdist. pytest reads
# PYTEST_ADDOPTS as usual (e.g. PYTEST_ADDOPTS=-x while debugging); CI sets none.
set -euo pipefail
_start=$SECONDS
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
# shellcheck source=tools/_lib.sh
source "$here/_lib.sh"
[ -d "${1:-$root/dist}" ] || die "no ${1:-$root/dist}: run tools/build_dists.sh first"
dist=$(cd "${1:-$root/dist}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/harel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Every command runs from here, so `python -m harel_store` never imports a checkout.
cd "$work"

sdists=("$dist"/harel_store-*.tar.gz)
{ [ ${#sdists[@]} -eq 1 ] && [ -f "${sdists[0]}" ]; } || die "expected one sdist in $dist"
sdist=${sdists[0]}
version=${sdist##*/harel_store-}
version=${version%.tar.gz}
pure_wheel=$dist/harel_store-$version-py3-none-any.whl
[ -f "$pure_wheel" ] || die "no pure wheel $pure_wheel"
declare -A pythons wheels
for v in $PY_VERSIONS; do
    pythons[$v]=$(find_python "$v")
    found=("$dist"/harel_store-"$version"-cp"${v/./}"-cp"${v/./}"-manylinux*.whl)
    { [ ${#found[@]} -eq 1 ] && [ -f "${found[0]}" ]; } || die "expected one manylinux wheel for $v in $dist"
    wheels[$v]=${found[0]}
done
read -r -a versions <<<"$PY_VERSIONS"
oldest=${versions[0]}
newest=${versions[${#versions[@]} - 1]}

# The test suite as the sdist ships it, in a directory with no harel_store/: tests/, plus
# README.md (test_readme.py runs its examples) and pyproject.toml (the pytest settings).
mkdir "$work/sdist" "$work/suite"
tar -xzf "$sdist" -C "$work/sdist"
unpacked=$work/sdist/harel_store-$version
cp -R "$unpacked/tests" "$unpacked/README.md" "$unpacked/pyproject.toml" "$work/suite/"

# expect_installed VENV IMPLEMENTATION: --version and --info of the installed package agree
# with its metadata, name IMPLEMENTATION, and point into the venv.
expect_installed() {
    local py=$1/bin/python impl=$2
    local out
    out=$("$py" -m harel_store --version)
    [ "$out" = "harel-store $version" ] || die "--version printed '$out', expected 'harel-store $version'"
    "$py" -m harel_store --info >"$work/info.txt"
    sed 's/^/    /' "$work/info.txt"
    "$py" - "$impl" "$work/info.txt" <<'EOF' || die "--info is wrong"
import importlib.metadata, platform, sys, sysconfig
import harel_store

impl, info = sys.argv[1], open(sys.argv[2]).read().splitlines()
fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in info[1:])}
version = importlib.metadata.version("harel-store")
site = sysconfig.get_paths()["purelib"]
problems = []
if info[0] != f"harel-store {version}" or harel_store.__version__ != version:
    problems.append(f"{info[0]!r}, metadata {version}, __version__ {harel_store.__version__}")
if fields.get("implementation") != impl or harel_store.IMPLEMENTATION != impl:
    problems.append(f"implementation {fields.get('implementation')!r}, expected {impl!r}")
module = {"compiled": "harel_store._store_c", "pure": "harel_store._store_py"}[impl]
if fields.get("store module") != module:
    problems.append(f"store module {fields.get('store module')!r}, expected {module!r}")
if not fields.get("store file", "").startswith(site + "/harel_store/"):
    problems.append(f"store file {fields.get('store file')!r} is not in {site}")
if not fields.get("python", "").startswith(platform.python_version() + " "):
    problems.append(f"python {fields.get('python')!r}, expected {platform.python_version()}")
cython = fields.get("cython", "")
if impl == "compiled" and not cython[:1].isdigit():
    problems.append(f"cython {cython!r}: expected the version the store was built with")
if impl == "pure" and not cython.startswith("not used"):
    problems.append(f"cython {cython!r} for the pure store")
import importlib
from importlib.machinery import EXTENSION_SUFFIXES
from harel_store._env import COMPILED_SOURCES
for name in COMPILED_SOURCES:
    file = importlib.import_module(name).__file__ or ""
    if (impl == "compiled") != file.endswith(tuple(EXTENSION_SUFFIXES)) or not file.startswith(site):
        problems.append(f"{name} loaded from {file!r} in a {impl} install")
for problem in problems:
    print(f"  PROBLEM: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
}

# test_requirements VENV: the `test` extra of the installed metadata (pytest, hypothesis)
test_requirements() {
    "$1/bin/python" - <<'EOF'
import importlib.metadata, re
for text in importlib.metadata.requires("harel-store") or []:
    requirement, _, marker = text.partition(";")
    if re.fullmatch(r"""\s*extra\s*==\s*["']test["']\s*""", marker):
        print(requirement.strip())
EOF
}

for v in $PY_VERSIONS; do
    py=${pythons[$v]}
    wheel=${wheels[$v]}
    step "compiled wheel on CPython $(pyver "$py"): ${wheel##*/} ($(elapsed))"
    venv=$work/venv-$v
    new_venv "$venv" "$py"
    "$venv/bin/python" -m pip install -q --no-index "$wheel"
    expect_installed "$venv" compiled
    "$venv/bin/python" "$here/check_no_tracing.py" --under "$venv"
    mapfile -t reqs < <(test_requirements "$venv")
    [ ${#reqs[@]} -ge 2 ] || die "the test extra is ${reqs[*]:-empty}"
    "$venv/bin/python" -m pip install -q "${reqs[@]}"
    echo "test suite but the durable stores (${reqs[*]}), HAREL_STORE_REQUIRE_EXTENSIONS=1, from $work/suite:"
    # The durable stores are pure Python, tested once by the main run: here, what a wheel
    # changes (the compiled store on each CPython).
    (cd "$work/suite" && HAREL_STORE_REQUIRE_EXTENSIONS=1 "$venv/bin/pytest" -q -p no:cacheprovider -m "not durable") \
        >"$work/pytest-$v.log" 2>&1 || { cat "$work/pytest-$v.log"; die "tests failed on $v"; }
    tail -n 1 "$work/pytest-$v.log"
    rm -rf "$venv"
done

for v in $oldest $newest; do
    py=${pythons[$v]}
    step "pure wheel on CPython $(pyver "$py"): ${pure_wheel##*/} ($(elapsed))"
    venv=$work/venv-pure-$v
    new_venv "$venv" "$py"
    "$venv/bin/python" -m pip install -q --no-index "$pure_wheel"
    expect_installed "$venv" pure
    "$venv/bin/python" -m harel_store -n 200 --quiet | tail -n 1
    rm -rf "$venv"
done

# The README's install commands, exactly as written, from the repository root (they name
# dist/ relatively), each in a fresh venv of the newest CPython.
readme_install() {
    local venv=$1 command=$2 impl=$3
    step "README: $command ($(elapsed))"
    new_venv "$venv" "${pythons[$newest]}"
    (cd "$root" && PATH="$venv/bin:$PATH" VIRTUAL_ENV=$venv bash -euo pipefail -c "$command")
    expect_installed "$venv" "$impl"
    rm -rf "$venv"
}
if [ "$dist" = "$root/dist" ]; then
    readme_install "$work/venv-readme" "pip install --no-index --find-links dist harel-store" compiled
    readme_install "$work/venv-readme" "pip install --no-index dist/harel_store-*-py3-none-any.whl" pure
else
    step "README install commands skipped: they name dist/, and this run checks $dist"
fi

# pip_sdist_without_compiler VENV LOG [ENV...]: pip install -v the sdist with every compiler
# command /bin/false; --no-cache-dir so that no wheel built here is reused by the next run.
pip_sdist_without_compiler() {
    local venv=$1 log=$2
    shift 2
    env CC=/bin/false CXX=/bin/false LDSHARED=/bin/false "$@" \
        "$venv/bin/python" -m pip install -v --no-cache-dir "$sdist" >"$log" 2>&1
}
py=${pythons[$newest]}
step "sdist without a C compiler, on CPython $(pyver "$py") ($(elapsed))"
venv=$work/venv-sdist
new_venv "$venv" "$py"
pip_sdist_without_compiler "$venv" "$work/sdist.log" \
    || { cat "$work/sdist.log"; die "the sdist did not install without a compiler"; }
grep -A4 "WARNING: harel_store's compiled store could not be built" "$work/sdist.log" | sed 's/^/    /' \
    || { cat "$work/sdist.log"; die "no fallback WARNING in the pip -v output"; }
grep -q "Installing the PURE-PYTHON store instead" "$work/sdist.log" || die "no PURE-PYTHON line"
grep -q "/bin/false" "$work/sdist.log" || die "the build never ran the (missing) compiler"
expect_installed "$venv" pure
if find "$venv" -path '*/harel_store/*' \( -name '*.so' -o -name '*.pyd' \) | grep .; then
    die "a compiled store was installed without a compiler"
fi
rm -rf "$venv"

step "sdist without a C compiler, HAREL_STORE_REQUIRE_EXTENSIONS=1 ($(elapsed))"
venv=$work/venv-sdist-required
new_venv "$venv" "$py"
if pip_sdist_without_compiler "$venv" "$work/sdist-required.log" HAREL_STORE_REQUIRE_EXTENSIONS=1; then
    cat "$work/sdist-required.log"
    die "the install succeeded although the compiled store was required and could not be built"
fi
grep "error: HAREL_STORE_REQUIRE_EXTENSIONS is set and the compiled store could not be built" \
    "$work/sdist-required.log" | sed 's/^/    /' \
    || { cat "$work/sdist-required.log"; die "the failure does not name HAREL_STORE_REQUIRE_EXTENSIONS"; }
if "$venv/bin/python" -c 'import harel_store' 2>/dev/null; then
    die "harel_store is installed after the failed install"
fi
echo "    (the install failed, as it must)"
rm -rf "$venv"

echo
echo "check_dists: OK in $(elapsed): ${#versions[@]} compiled wheels with the test suite, the pure wheel on $oldest and $newest, the sdist without a compiler"
