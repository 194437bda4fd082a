"""The public face, ``kvstore/__init__.py``: every name it lists is there,
and ``import kvstore`` alone imports none of the store's modules (they load
on first use: a Spark worker reading files never imports the store, LMDB
or the archive)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import kvstore

FACE = Path(kvstore.__file__)


def test_every_public_name_resolves_to_its_home() -> None:
    from importlib import import_module

    for name in kvstore.__all__:
        value = getattr(kvstore, name)
        home = kvstore._HOMES.get(name)
        if home is not None:
            assert value is getattr(import_module(home), name), name
    assert set(kvstore._HOMES) <= set(kvstore.__all__)
    assert set(kvstore.__all__) <= set(dir(kvstore))


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        kvstore.no_such_name  # type: ignore[attr-defined]
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("kvstore.no_such_name did not raise AttributeError")


def test_type_checking_imports_name_the_same_homes() -> None:
    # mypy and tests/test_layers.py read the TYPE_CHECKING imports; the
    # interpreter reads _HOMES: the two must say the same.
    tree = ast.parse(FACE.read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    declared = {a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for a in node.names}
    assert declared == kvstore._HOMES


def test_import_kvstore_leaves_the_store_unimported() -> None:
    code = ("import sys, kvstore\n"
            "print(sorted(m for m in sys.modules if m.startswith(('kvstore.', 'lmdb'))))\n"
            "kvstore.open\n"
            "print('kvstore.store.store' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=FACE.parent.parent).stdout.splitlines()
    assert out == ["[]", "True"]
