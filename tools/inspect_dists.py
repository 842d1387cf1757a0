"""Check the contents and metadata of harel-store's sdist and wheels, without installing them.

    python tools/inspect_dists.py sdist dist/harel_store-0.1.0.tar.gz [--source DIR]
    python tools/inspect_dists.py wheel dist/harel_store-*-cp312-*.whl --kind compiled
    python tools/inspect_dists.py wheel dist/harel_store-*-py3-none-any.whl --kind pure

The sdist must carry the .pyx source, the tests and perf, and no generated file (``*.c``,
``*.so``, ``*.html``); with ``--source`` every file of the checkout under ``harel_store/``,
``tests/`` and ``perf/`` must be in it. A wheel carries the package and nothing to build it
from (no ``.pyx``, ``.pxd``, ``.c``, ``.h``, ``.html``); a compiled one exactly one extension
module for its own CPython and a manylinux tag, a pure one none and the tag
``py3-none-any``. Every artifact's metadata must be the full project metadata of
pyproject.toml, with the version of ``harel_store.__version__``. Standard library only.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import re
import sys
import tarfile
import zipfile
from email.message import Message
from pathlib import Path, PurePosixPath

NAME = "harel-store"
REQUIRED_CLASSIFIERS = (
    "Programming Language :: Cython",
    "Typing :: Typed",
    "Programming Language :: Python :: 3.10",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Programming Language :: Python :: 3.13",
)
EXTRAS = {"test", "perf", "postgres"}
# Files every artifact's package must hold (the compiled module is checked apart).
PACKAGE_FILES = {
    "__init__.py",
    "__main__.py",
    "_aio.py",
    "_checks.py",
    "_codec.py",
    "_copy.py",
    "_demo/__init__.py",
    "_demo/batched.py",
    "_demo/durable.py",
    "_demo/local.py",
    "_demo/relay.py",
    "_demo/result.py",
    "_demo/workers.py",
    "_demo/workflow.py",
    "_digest.py",
    "_env.py",
    "_errors.py",
    "_group.py",
    "_listing.py",
    "_open.py",
    "_operate.py",
    "_protocols.py",
    "_records.py",
    "_redact.py",
    "_store.py",
    "_store_py.py",
    "_transfer.py",
    "_version.py",
    "cli/__init__.py",
    "cli/_common.py",
    "cli/_serve.py",
    "cli/copy.py",
    "cli/demo.py",
    "cli/inspect.py",
    "cli/prune.py",
    "cli/show.py",
    "metrics.py",
    "postgres/__init__.py",
    "postgres/_aio.py",
    "postgres/_batch.py",
    "postgres/_connections.py",
    "postgres/_core.py",
    "postgres/_operate.py",
    "postgres/_schema.py",
    "postgres/_statements.py",
    "postgres/_store.py",
    "postgres/_tagged.py",
    "py.typed",
    "sqlite/__init__.py",
    "sqlite/_aio.py",
    "sqlite/_batch.py",
    "sqlite/_connection.py",
    "sqlite/_copying.py",
    "sqlite/_operate.py",
    "sqlite/_schema.py",
    "sqlite/_store.py",
    "statemachine/__init__.py",
    "statemachine/_chart.py",
    "statemachine/_core.py",
}
GENERATED = (".c", ".so", ".pyd", ".html", ".pyc", ".o")
BUILD_SOURCES = (".pyx", ".pxd", ".pxi", ".c", ".h", ".cpp", ".html")
SOURCE_DIRS = ("harel_store", "tests", "perf")

problems: list[str] = []


def compiled() -> tuple[str, ...]:
    """The modules a build compiles from their own source (``harel_store/_env.py``, read
    from the checkout that holds this script)."""
    env = Path(__file__).resolve().parent.parent / "harel_store" / "_env.py"
    match = re.search(r"^COMPILED_SOURCES = \(([^)]*)\)", env.read_text(), re.MULTILINE)
    if not match:
        problem(f"{env}: no COMPILED_SOURCES tuple")
        return ()
    return tuple(re.findall(r'"([\w.]+)"', match.group(1)))


def problem(text: str) -> None:
    problems.append(text)


def version_of(init_py: str) -> str:
    match = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""", init_py, re.MULTILINE)
    if not match:
        problem("harel_store/__init__.py sets no __version__ literal")
        return "?"
    return match.group(1)


def check_metadata(text: str, version: str, where: str) -> Message:
    meta = email.parser.Parser(policy=email.policy.compat32).parsestr(text)

    def expect(field: str, wanted: str) -> None:
        if meta.get(field) != wanted:
            problem(f"{where}: {field} is {meta.get(field)!r}, expected {wanted!r}")

    expect("Name", NAME)
    expect("Version", version)
    expect("Requires-Python", ">=3.10")
    expect("License-Expression", "MIT")
    expect("Description-Content-Type", "text/markdown")
    if not meta.get("Summary"):
        problem(f"{where}: no Summary")
    if len(meta.get_payload() or "") < 200:
        problem(f"{where}: no long description (the README)")
    classifiers = meta.get_all("Classifier") or []
    for classifier in REQUIRED_CLASSIFIERS:
        if classifier not in classifiers:
            problem(f"{where}: classifier {classifier!r} missing")
    extras = set(meta.get_all("Provides-Extra") or [])
    if not EXTRAS <= extras:
        problem(f"{where}: extras {sorted(EXTRAS - extras)} missing (has {sorted(extras)})")
    for requirement in meta.get_all("Requires-Dist") or []:
        if "extra ==" not in requirement:
            problem(f"{where}: runtime dependency {requirement!r}: only the standard library")
    if not meta.get_all("Project-URL"):
        problem(f"{where}: no Project-URL")
    return meta


def check_sdist(path: Path, source: Path | None) -> None:
    match = re.fullmatch(r"harel_store-(.+)\.tar\.gz", path.name)
    if not match:
        problem(f"{path.name}: not an sdist name harel_store-VERSION.tar.gz")
        return
    root = f"harel_store-{match.group(1)}"
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        files = {
            str(PurePosixPath(name).relative_to(root))
            for name, m in members.items()
            if m.isfile() and name.startswith(root + "/")
        }
        if len(files) != sum(m.isfile() for m in members.values()):
            problem(f"{path.name}: files outside {root}/")

        def read(name: str) -> str:
            member = tar.extractfile(members[f"{root}/{name}"])
            assert member is not None
            return member.read().decode("utf-8")

        for required in (
            "PKG-INFO",
            "pyproject.toml",
            "setup.py",
            "MANIFEST.in",
            "README.md",
            "LICENSE",
            "harel_store/_store_c.pyx",
            "tests/conftest.py",
        ):
            if required not in files:
                problem(f"{path.name}: {required} missing")
        for name in PACKAGE_FILES:
            if f"harel_store/{name}" not in files:
                problem(f"{path.name}: harel_store/{name} missing")
        if not any(re.fullmatch(r"tests/test_\w+\.py", f) for f in files):
            problem(f"{path.name}: no tests/test_*.py")
        if not any(re.fullmatch(r"perf/\w+\.py", f) for f in files):
            problem(f"{path.name}: no perf/*.py")
        for name in sorted(files):
            if name.endswith(GENERATED) or "__pycache__" in name:
                problem(f"{path.name}: generated file {name}")
            if name.startswith(("build/", "dist/", "wheelhouse/", ".")):
                problem(f"{path.name}: stray {name}")
        if source is not None:
            for directory in SOURCE_DIRS:
                for file in sorted((source / directory).rglob("*")):
                    rel = file.relative_to(source).as_posix()
                    generated = rel.endswith(GENERATED) or "__pycache__" in rel
                    if file.is_file() and not generated and rel not in files:
                        problem(f"{path.name}: {rel} is in the source tree, not in the sdist")
        if "PKG-INFO" in files and "harel_store/__init__.py" in files:
            version = version_of(read("harel_store/_version.py"))
            if version != match.group(1):
                problem(f"{path.name}: file name version {match.group(1)}, package {version}")
            check_metadata(read("PKG-INFO"), version, f"{path.name} PKG-INFO")
    print(f"{path.name}: {len(files)} files, .pyx + tests + perf, no generated files")


def check_wheel(path: Path, kind: str) -> None:
    # name-version-python-abi-platform.whl (no build tag here)
    parts = path.name[: -len(".whl")].split("-")
    if not path.name.endswith(".whl") or len(parts) != 5 or parts[0] != "harel_store":
        problem(f"{path.name}: not a harel_store wheel name")
        return
    _, version, python_tag, abi_tag, platform_tag = parts
    with zipfile.ZipFile(path) as whl:
        names = [n for n in whl.namelist() if not n.endswith("/")]  # auditwheel adds dirs
        info = f"harel_store-{version}.dist-info"
        wheel_meta = whl.read(f"{info}/WHEEL").decode()
        check_metadata(whl.read(f"{info}/METADATA").decode(), version, f"{path.name} METADATA")
        package_version = version_of(whl.read("harel_store/_version.py").decode())
        if package_version != version:
            problem(f"{path.name}: file name version {version}, package {package_version}")
    for name in names:
        top = name.split("/", 1)[0]
        if top not in ("harel_store", info):
            problem(f"{path.name}: {name} is outside the package")
        if name.endswith(BUILD_SOURCES) or "__pycache__" in name or name.endswith(".pyc"):
            problem(f"{path.name}: carries {name}")
    package = {n.split("/", 1)[1] for n in names if n.startswith("harel_store/")}
    for name in sorted(PACKAGE_FILES - package):
        problem(f"{path.name}: harel_store/{name} missing")
    extensions = sorted(n for n in package if n.endswith((".so", ".pyd")))
    if kind == "pure":
        if (python_tag, abi_tag, platform_tag) != ("py3", "none", "any"):
            problem(f"{path.name}: a pure wheel must be tagged py3-none-any")
        if extensions:
            problem(f"{path.name}: a pure wheel carries {extensions}")
        if "Root-Is-Purelib: true" not in wheel_meta:
            problem(f"{path.name}: WHEEL says Root-Is-Purelib is not true")
    else:
        match = re.fullmatch(r"cp3(\d+)", python_tag)
        if not match or abi_tag != python_tag:
            problem(f"{path.name}: a compiled wheel must be tagged cp3X-cp3X")
        if not all(tag.startswith("manylinux") for tag in platform_tag.split(".")):
            problem(
                f"{path.name}: platform tag {platform_tag} is not manylinux (auditwheel repair)"
            )
        stems = sorted(["_store_c", *(m.split(".", 1)[1].replace(".", "/") for m in compiled())])
        found = sorted(e.split(".", 1)[0] for e in extensions)
        tag = f".cpython-{python_tag[2:]}-"
        if found != stems or not all(tag in e for e in extensions):
            problem(
                f"{path.name}: expected the extensions {stems} for {python_tag}, has {extensions}"
            )
        if "Root-Is-Purelib: false" not in wheel_meta:
            problem(f"{path.name}: WHEEL says Root-Is-Purelib is not false")
    extra = sorted(package - PACKAGE_FILES - set(extensions))
    if extra:
        problem(f"{path.name}: unexpected files {extra}")
    print(f"{path.name}: {kind}, {len(names)} files, {', '.join(extensions) or 'no extension'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sdist = sub.add_parser("sdist")
    sdist.add_argument("path", type=Path)
    sdist.add_argument("--source", type=Path, help="the checkout the sdist was built from")
    wheel = sub.add_parser("wheel")
    wheel.add_argument("path", type=Path)
    wheel.add_argument("--kind", choices=("compiled", "pure"), required=True)
    args = parser.parse_args()
    if args.what == "sdist":
        check_sdist(args.path, args.source)
    else:
        check_wheel(args.path, args.kind)
    for text in problems:
        print(f"  PROBLEM: {text}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
