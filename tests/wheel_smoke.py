"""Smoke test of an installed walkv wheel (``make wheel-smoke``).

Run by the interpreter of a fresh virtual environment that has only the wheel
(and its dependencies) installed, from an empty temporary directory, with
``python -I``: no source checkout is on ``sys.path``, so everything used here
comes from the wheel. It checks that the packages come from site-packages
(not an editable install), that each ships ``py.typed``, that the hot modules
run compiled (mypyc), the Python API
(open, put/get, batch, snapshot, restore), the ``walkv`` console script
(``--version``, ``put``, ``get``) and, given ``--mypy PATH``, that a user's
mypy sees walkv's type hints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata, resources

PACKAGES = ("wal", "snapshot", "kvstore")


def check_installed() -> str:
    """The packages come from this environment's site-packages, each with
    its ``py.typed``; return walkv's version."""
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    for name in PACKAGES:
        module = __import__(name)
        where = os.path.realpath(os.path.dirname(module.__file__))
        assert where == os.path.join(site, name), f"{name} imported from {where}, not from {site}"
        assert resources.files(name).joinpath("py.typed").is_file(), f"{name} has no py.typed in the wheel"
    dist = metadata.distribution("walkv")
    direct = dist.read_text("direct_url.json")
    if direct is not None:  # pip records where it installed from: a file, not an editable directory
        assert not json.loads(direct).get("dir_info", {}).get("editable"), direct
    typed = sorted(str(f) for f in dist.files or () if f.name == "py.typed")
    assert typed == sorted(f"{name}/py.typed" for name in PACKAGES), typed
    check_compiled(dist)
    return dist.version


def check_compiled(dist: metadata.Distribution) -> None:
    """The wheel holds the mypyc-compiled twin of every module wal.compiled lists, and
    they are what runs (the build recorded their sources' hashes, which match)."""
    import wal
    from wal.compiled import COMPILED_MODULES, is_compiled

    info = wal.build_info()
    assert info.startswith("compiled (mypyc "), f"the wheel runs {info}"
    for name in COMPILED_MODULES:
        module = __import__(name, fromlist=["_"])
        assert is_compiled(module), f"{name} runs from {module.__file__}, not a compiled extension"
    extensions = [str(f) for f in dist.files or () if str(f).endswith(".so")]
    assert len(extensions) == len(COMPILED_MODULES) + 1, extensions  # and mypyc's shared library


def check_api(work: str) -> None:
    import kvstore

    path = os.path.join(work, "store")
    with kvstore.open(path) as db:
        lsn = db.put(b"user:1", b"Ada")
        assert db.get(b"user:1") == b"Ada"
        with db.batch() as b:
            b.put(b"order:1", b"pending")
            b.put(b"order:2", b"pending")
            b.delete(b"user:1")
        assert b.lsn == lsn + 1
        assert db.get_many([b"user:1", b"order:2"]) == [None, b"pending"]
        info = db.snapshot()
        assert (info.lsn, info.count) == (lsn + 1, 2)
        db.delete_range(b"order:", b"order;")
    restored = kvstore.restore(path, os.path.join(work, "restored"), to_lsn=lsn + 1)
    assert restored.lsn == lsn + 1
    with kvstore.open(os.path.join(work, "restored"), readonly=True) as old:
        assert [k for k, _ in old.scan(prefix=b"order:")] == [b"order:1", b"order:2"]
    import kvstore.spark  # importable without pyspark (register() needs it)

    assert callable(kvstore.spark.register)


def check_cli(work: str, version: str) -> None:
    walkv = os.path.join(os.path.dirname(sys.executable), "walkv")
    assert os.access(walkv, os.X_OK), f"no console script at {walkv}"

    def run(*args: str) -> str:
        done = subprocess.run([walkv, *args], cwd=work, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
        return done.stdout

    assert run("--version").strip() == f"walkv {version}"
    run("put", "cli-store", "greeting", "hello")
    assert run("get", "cli-store", "greeting").strip() == "hello"


USER_CODE = '''\
import kvstore

with kvstore.open("store") as db:
    lsn: str = db.put(b"k", b"v")
'''


def check_types(work: str, mypy: str) -> None:
    """A user's mypy, pointed at this environment, type-checks against
    walkv's annotations (without py.typed it would report the package as
    untyped and see no error in the user's code)."""
    user = os.path.join(work, "user.py")
    with open(user, "w", encoding="utf-8") as fh:
        fh.write(USER_CODE)
    done = subprocess.run([mypy, "--python-executable", sys.executable, "--cache-dir", os.path.join(work, ".mypy"),
                           "--no-error-summary", "user.py"], cwd=work, capture_output=True, text=True, timeout=300)
    expected = 'user.py:4: error: Incompatible types in assignment (expression has type "int", variable has type "str")'
    assert done.stdout.splitlines() == [f"{expected}  [assignment]"], (done.returncode, done.stdout, done.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mypy", help="a mypy executable: check that it sees walkv's type hints")
    args = parser.parse_args()
    version = check_installed()
    with tempfile.TemporaryDirectory(prefix="walkv-smoke-") as work:
        check_api(work)
        check_cli(work, version)
        if args.mypy:
            check_types(work, args.mypy)
    print(f"wheel smoke: walkv {version} from {os.path.dirname(sysconfig.get_paths()['purelib'])}: "
          f"API, console script, py.typed ({', '.join(PACKAGES)}){', mypy' if args.mypy else ''}: ok")


if __name__ == "__main__":
    main()
