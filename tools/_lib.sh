# shellcheck shell=bash
# Shared by tools/build_dists.sh and tools/check_dists.sh (sourced, not run).
#
# PY_VERSIONS  the CPython versions that get a compiled wheel (default: 3.10 3.11 3.12 3.13)
# PYTHON3_12   (one per version) the interpreter to use for that version; otherwise the first
#              of `python3.12` on PATH and pyenv's newest 3.12.x that runs and has its headers
# PYTHON       the interpreter for the tools' own venv and the pure wheel (default: python3)

PY_VERSIONS=${PY_VERSIONS:-3.10 3.11 3.12 3.13}

step() { printf '\n==== %s ====\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# The switches of setup.py and harel_store/_env.py are set per command, never inherited:
# .ci/run exports HAREL_STORE_REQUIRE_EXTENSIONS, and with HAREL_STORE_NO_EXTENSIONS also
# set every build would fail.
unset HAREL_STORE_NO_EXTENSIONS HAREL_STORE_REQUIRE_EXTENSIONS HAREL_STORE_CYTHON_TRACE
unset PYTHONPATH PYTHONHOME PYTHONSAFEPATH PIP_REQUIRE_VIRTUALENV

# find_python 3.12: the path of a CPython 3.12 with the headers to compile against.
_FIND_PYTHON_CHECK='
import os, platform, sys, sysconfig
assert platform.python_implementation() == "CPython"
assert "%d.%d" % sys.version_info[:2] == sys.argv[1]
assert os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
print(sys.executable)
'
find_python() {
    local version=$1 override candidate
    override="PYTHON${version/./_}"
    local candidates=()
    if [ -n "${!override:-}" ]; then
        candidates=("${!override}")
    else
        candidates=("python$version")
        local root=${PYENV_ROOT:-$HOME/.pyenv}
        if [ -d "$root/versions" ]; then
            while IFS= read -r candidate; do
                candidates+=("$candidate")
            done < <(find "$root/versions" -maxdepth 3 -path "*/versions/$version.*/bin/python$version" \
                | sort -V -r)
        fi
    fi
    local found
    for candidate in "${candidates[@]}"; do
        # The real executable, not a pyenv shim whose meaning depends on the directory.
        if found=$("$candidate" -c "$_FIND_PYTHON_CHECK" "$version" 2>/dev/null) && [ -n "$found" ]; then
            printf '%s\n' "$found"
            return 0
        fi
    done
    die "no CPython $version with its headers found (tried: ${candidates[*]}); set PYTHON${version/./_}=/path/to/python$version"
}

# new_venv DIR PYTHON: a fresh virtual environment, with the pip that the interpreter ships.
new_venv() {
    rm -rf "$1"
    "$2" -m venv "$1"
}

# pyver PYTHON: "3.12.1"
pyver() {
    "$1" -c 'import platform; print(platform.python_version())'
}

# seconds since the script started
elapsed() {
    echo "$((SECONDS - ${_start:-0}))s"
}
