"""Names a package's face imports on first use (module ``__getattr__``, PEP 562).

``wal`` and ``kvstore`` list their public names in ``__init__.py``; most live
in modules a process may never need (a Spark worker reading snapshot files
needs neither the log's writer nor the store, LMDB or the archive). Importing
them all up front costs each process tens of milliseconds and leaves
thousands more objects for every ``gc.collect()`` to walk, so a face maps each
such name to its module (``homes``) and imports that module when the name is
first read. The face keeps the same names under ``if TYPE_CHECKING:`` as
plain imports, for mypy and for tests/test_layers.py, and installs the hooks
``if not TYPE_CHECKING:``, so mypy still flags a misspelt name.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_names(namespace: dict[str, Any], homes: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of the package whose
    globals are ``namespace``: a name in ``homes`` is imported from its
    module when first read, then kept in ``namespace`` (later reads are
    plain lookups); any other missing name is an ``AttributeError``."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
