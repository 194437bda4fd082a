"""The faces ``wal/__init__.py`` and ``kvstore/__init__.py`` import most of
their names on first use (:mod:`wal.lazy`): every name they list is there,
from the module the face says; the ``TYPE_CHECKING`` imports mypy and
tests/test_layers.py read say the same; and ``import kvstore`` alone imports
neither the store nor the log's writer (a Spark worker reading files never
needs them)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from importlib import import_module
from pathlib import Path
from types import ModuleType

import pytest

import kvstore
import wal

FACES = [wal, kvstore]


@pytest.mark.parametrize("face", FACES, ids=lambda m: m.__name__)
def test_every_public_name_resolves_to_its_home(face: ModuleType) -> None:
    for name in face.__all__:
        value = getattr(face, name)
        home = face._HOMES.get(name)
        if home is not None:
            assert value is getattr(import_module(home), name), name
    assert set(face._HOMES) <= set(face.__all__)
    assert set(face.__all__) <= set(dir(face))


@pytest.mark.parametrize("face", FACES, ids=lambda m: m.__name__)
def test_no_lazy_name_is_a_submodule_name(face: ModuleType) -> None:
    # Importing the submodule would set the package's attribute to it first.
    submodules = {m.name for m in pkgutil.iter_modules(face.__path__)}
    assert set(face._HOMES) & submodules == set()


@pytest.mark.parametrize("face", FACES, ids=lambda m: m.__name__)
def test_unknown_name_is_an_attribute_error(face: ModuleType) -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        face.no_such_name


@pytest.mark.parametrize("face", FACES, ids=lambda m: m.__name__)
def test_type_checking_imports_name_the_same_homes(face: ModuleType) -> None:
    tree = ast.parse(Path(face.__file__).read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    declared = {a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert declared == face._HOMES


def test_import_kvstore_leaves_the_store_and_the_writer_unimported() -> None:
    code = ("import sys, kvstore\n"
            "print(sorted(m for m in sys.modules if m.startswith(('kvstore.', 'lmdb', 'wal.log', 'wal.group'))))\n"
            "kvstore.open\n"
            "print('kvstore.store.store' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(kvstore.__file__).parent.parent).stdout.splitlines()
    assert out == ["[]", "True"]
