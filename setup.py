"""Builds walkv's hot modules with mypyc; everything else is in pyproject.toml.

``pip install .``, ``pip install -e .`` (``make``) and ``python -m build`` run this
with mypy pinned in ``[build-system] requires``. The modules named in
:data:`wal.compiled.COMPILED_MODULES` become C extensions beside their ``.py``
twins, and the build writes ``wal/_compiled.json``: the mypyc version, the
SHA-256 of each compiled module's source, and the module's and its classes'
docstrings, which mypyc leaves out (:func:`wal.compiled.source_docstrings`). At import, :mod:`wal.compiled` loads the
extensions only when every recorded hash matches the ``.py`` beside it (an edited
source in an editable install runs interpreted, with a warning, never stale code).

A build must never leave a user without walkv: when the C compiler fails (no gcc,
no Python headers) or mypyc rejects the code, the build says so on stderr and
installs the pure-Python package, which runs the same code. ``WALKV_NO_COMPILE=1``
asks for that pure build outright.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import sys
import traceback
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
_COMPILED = runpy.run_path(os.path.join(HERE, "wal", "compiled.py"))
MODULES: tuple[str, ...] = _COMPILED["COMPILED_MODULES"]
MANIFEST = os.path.join("wal", "_compiled.json")
HASHES: dict[str, str] = {}
"""SHA-256 of each compiled module's source, taken when mypyc read it."""
DOCS: dict[str, dict[str, str]] = {}
"""Each compiled module's docstrings that its extension is given back at import."""


def _warn(what: str) -> None:
    bar = "=" * 78
    print(f"\n{bar}\nwalkv: {what}\nwalkv: installing the pure-Python package instead (same code, slower).\n{bar}\n",
          file=sys.stderr)


def _source(module: str) -> str:
    return os.path.join(*module.split(".")) + ".py"


def _mypyc_extensions() -> list[Any]:
    if os.environ.get("WALKV_NO_COMPILE"):
        print("walkv: WALKV_NO_COMPILE set: building the pure-Python package", file=sys.stderr)
        return []
    try:
        from mypyc.build import mypycify

        # opt_level 3 (mypyc's default) over the hot modules: about a minute of gcc on 2 cores.
        # lmdb is not in the build environment (its calls type as Any), so ignores for its stubs go unused.
        paths = [_source(m) for m in MODULES] + ["--no-warn-unused-ignores"]
        for module in MODULES:
            with open(os.path.join(HERE, _source(module)), "rb") as f:
                source = f.read()
            HASHES[module] = hashlib.sha256(source).hexdigest()
            DOCS[module] = _COMPILED["source_docstrings"](source)
        # group_name: the shared library is wal/core__mypyc.*.so (inside a package, so an editable
        # install finds it too), not a top-level module named after a hash of the module list.
        return list(mypycify(paths, opt_level="3", multi_file=False, group_name="wal.core"))
    except BaseException as exc:  # mypy's type errors end in SystemExit
        traceback.print_exc()
        _warn(f"mypyc could not compile the hot modules ({type(exc).__name__}: {exc})")
        return []


class BuildExt(build_ext):
    """Compiles the extensions, or falls back to none of them, then records the manifest."""

    def run(self) -> None:
        # In place (`pip install -e .`) the manifest lands beside the sources; for a wheel, in build_lib
        # with the extensions.
        manifest = os.path.join(HERE if self.inplace else self.build_lib, MANIFEST)
        if os.path.exists(manifest):  # a failed rebuild must not leave an old manifest vouching for old .so files
            os.remove(manifest)
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as exc:  # CompileError, LinkError, a missing compiler
            traceback.print_exc()
            _warn(f"the C compiler failed on the mypyc output ({type(exc).__name__}: {exc})")
            self.extensions = self.distribution.ext_modules = []  # nothing for the wheel to look for
            return
        from mypy.version import __version__ as mypy_version

        os.makedirs(os.path.dirname(manifest), exist_ok=True)
        with open(manifest, "w") as f:
            json.dump({"mypyc": mypy_version, "sources": HASHES, "docs": DOCS}, f, indent=1, sort_keys=True)
            f.write("\n")


setup(ext_modules=_mypyc_extensions(), cmdclass={"build_ext": BuildExt})
