"""Which twin runs: the mypyc-compiled hot modules, or the same code interpreted.

The build (``setup.py``) compiles :data:`COMPILED_MODULES` with mypyc into C
extensions that sit beside their ``.py`` sources, and writes ``wal/_compiled.json``:
the mypyc version, the SHA-256 of each compiled module's source at build time,
and the docstrings mypyc leaves out (below).
Python's import system prefers an extension to a ``.py`` of the same name, so this
module, imported before any of them (first by ``wal/__init__.py``, which every
import of ``wal`` or ``kvstore`` runs), decides once per process:

- ``WALKV_PURE=1`` in the environment: the ``.py`` sources run, interpreted.
- No manifest (installed without a compiler, or ``WALKV_NO_COMPILE=1``): interpreted.
- A source differs from its recorded hash (an edited file in an editable install,
  ``pip install -e .`` not rerun): interpreted, with a :class:`StaleBuildWarning`
  naming the files. Running the stale extension instead would run code that is no
  longer in the file, silently; failing would stop every edit-and-test cycle until
  a rebuild. It is all modules or none: compiled modules call each other directly
  in C, so one interpreted module among compiled ones would still leave the old
  code of the others bound to it.
- Otherwise the extensions run.

To run interpreted, a finder placed first on :data:`sys.meta_path` loads the listed
modules from their ``.py`` files; nothing else changes.

Docstrings. mypyc 2.4 compiles no docstring: a compiled module's ``__doc__`` is
None, a class's is its constructor's signature (or "mypyc filler docstring"),
and a function or method has only its signature (``__text_signature__``, when
its defaults can be written in one). So the API reference is built from the
sources (``make docs`` runs with ``WALKV_PURE=1``), and for ``help()`` on what
users run the build records each compiled module's docstring and its classes'
(:func:`source_docstrings`), which a loader puts back on the extension as it is
imported (:func:`restore_docstrings`). A method's or a function's docstring
cannot be put back (their ``__doc__`` is read-only): ``help()`` shows their
signatures, the reference their docs. :func:`build_info` says what
runs, from the loaded modules themselves (``walkv stats`` prints it on its first line,
the benchmark report in its header).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

COMPILED_MODULES: tuple[str, ...] = (
    "wal.crc",
    "wal.fs",
    "wal.stats",
    "wal.record",
    "wal.record_reader",
    "wal.segment",
    "wal.segment_writer",
    "wal.segments",
    "wal.group",
    "wal.hooks",
    "wal.line",
    "wal.commit",
    "wal.log_writer",
    "wal.append",
    "wal.log",
    "wal.reader",
    "kvstore.entry.limits",
    "kvstore.entry.packing",
    "kvstore.entry.opcodes",
    "kvstore.entry.shape",
    "kvstore.entry.codec",
    "kvstore.entry.conditions",
    "kvstore.state.meta",
    "kvstore.state.overlay",
    "kvstore.state.lmdb_ops",
    "kvstore.state.keyspace_dbs",
    "kvstore.state.readers",
    "kvstore.state.reads",
    "kvstore.state.view",
    "kvstore.state.environment",
    "kvstore.state.expiring_reads",
    "kvstore.state.base_load",
    "kvstore.state.commits",
    "kvstore.state.staged",
    "kvstore.state.machine",
    "kvstore.store.group_hooks",
    "kvstore.store.fast_path",
    "kvstore.store.write_batch",
    "kvstore.store.aio_writes",
)
"""The modules ``setup.py`` compiles (read there with :func:`runpy.run_path`, so this
module imports only the standard library): the record framing and reader, the
segment writer and scanner, group commit and the log's write path (with its file
seam and counters, which a profile of appends showed next), the entry codec and
conditions, the overlay and the state machine's apply and read paths, the
store's hooks into its log (run once per group), the batch (one call per put
of a bulk load), and the asyncio front's way to the log and back (twice per
write on the event loop's thread)."""

MANIFEST = "_compiled.json"
"""The build's record beside this module: ``{"mypyc": version, "sources": {module: sha256}}``."""


def source_docstrings(source: str | bytes) -> dict[str, str]:
    """The docstrings of a module's source that :func:`restore_docstrings` can
    put back on its compiled twin: the module's (under ``""``) and each of its
    top-level classes' (under the class's name). Run by the build."""
    import ast

    tree = ast.parse(source)
    docs = {"": ast.get_docstring(tree, clean=False)}
    docs.update((node.name, ast.get_docstring(node, clean=False)) for node in tree.body
                if isinstance(node, ast.ClassDef))
    return {name: doc for name, doc in docs.items() if doc is not None}


def restore_docstrings(module: ModuleType, docs: dict[str, str]) -> None:
    """Set ``module``'s docstring and its classes' from ``docs``
    (:func:`source_docstrings` of its source)."""
    for name, doc in docs.items():
        target = module if name == "" else getattr(module, name, None)
        if isinstance(target, (ModuleType, type)):
            target.__doc__ = doc


class _DocumentedExtension(importlib.machinery.ExtensionFileLoader):
    """Loads a compiled module, then puts back the docstrings the build recorded for it."""

    def __init__(self, fullname: str, path: str, docs: dict[str, str]) -> None:
        super().__init__(fullname, path)
        self.docs = docs

    def exec_module(self, module: ModuleType) -> None:
        super().exec_module(module)
        restore_docstrings(module, self.docs)


class _ExtensionFinder:
    """Finds :data:`COMPILED_MODULES`' extensions, as the path finder would, to
    load them with :class:`_DocumentedExtension`."""

    def __init__(self, docs: dict[str, dict[str, str]]) -> None:
        self.docs = docs

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        docs = self.docs.get(fullname)
        if docs is None or not path:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader) or not spec.origin:
            return None
        spec.loader = _DocumentedExtension(fullname, spec.origin, docs)
        return spec


class StaleBuildWarning(RuntimeWarning):
    """A compiled module's source changed after the build: the interpreted sources run."""


class _SourceFinder:
    """Loads :data:`COMPILED_MODULES` from their ``.py`` files, ahead of the extensions."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names or not path:
            return None
        for entry in path:
            finder = importlib.machinery.FileFinder(
                entry, (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES))
            spec = finder.find_spec(fullname)
            if spec is not None:
                return spec
        return None


def _root() -> str:
    """The directory that holds the ``wal`` and ``kvstore`` packages."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _choose() -> tuple[str | None, str, dict[str, dict[str, str]]]:
    """(the mypyc version when the extensions may run, else None; why not; the
    docstrings the build recorded)."""
    if os.environ.get("WALKV_PURE"):
        return None, "WALKV_PURE set", {}
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), MANIFEST), "rb") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None, "not compiled at install", {}
    root = _root()
    recorded: dict[str, str] = manifest["sources"]
    stale = []
    for module in COMPILED_MODULES:
        source = os.path.join(root, *module.split(".")) + ".py"
        try:
            with open(source, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except FileNotFoundError:  # an installation without sources: nothing to disagree with
            continue
        if recorded.get(module) != digest:
            stale.append(source)
    if stale:
        warnings.warn(
            f"walkv: {len(stale)} compiled module(s) changed since the build ({', '.join(stale)}): "
            "running all of them interpreted; rebuild with `pip install -e .` (or `make`) to compile them again",
            StaleBuildWarning, stacklevel=3)
        return None, "sources changed since the build", {}
    return str(manifest["mypyc"]), "", manifest.get("docs", {})


MYPYC_VERSION, PURE_REASON, _DOCS = _choose()
if MYPYC_VERSION is None and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceFinder(COMPILED_MODULES))
elif MYPYC_VERSION is not None and _DOCS and not any(isinstance(f, _ExtensionFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _ExtensionFinder(_DOCS))


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from a C extension."""
    return isinstance(getattr(module, "__loader__", None), importlib.machinery.ExtensionFileLoader)


def build_info() -> str:
    """``"compiled (mypyc X)"`` when the hot modules run as C extensions, else
    ``"pure Python (why)"``: read from the loaded modules, not from the build."""
    import wal.record

    if is_compiled(wal.record):
        return f"compiled (mypyc {MYPYC_VERSION})"
    return f"pure Python ({PURE_REASON or 'extensions not loaded'})"
