"""Which twin runs: the mypyc-compiled hot modules, or the same code interpreted.

The build (``setup.py``) compiles :data:`COMPILED_MODULES` with mypyc into C
extensions that sit beside their ``.py`` sources, and writes ``wal/_compiled.json``:
the mypyc version and the SHA-256 of each compiled module's source at build time.
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
modules from their ``.py`` files; nothing else changes. :func:`build_info` says what
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
    "wal.commit",
    "wal.log_writer",
    "wal.append",
    "wal.log",
    "wal.reader",
    "kvstore.entry.limits",
    "kvstore.entry.packing",
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


def _choose() -> tuple[str | None, str]:
    """(the mypyc version when the extensions may run, else None; why not)."""
    if os.environ.get("WALKV_PURE"):
        return None, "WALKV_PURE set"
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), MANIFEST), "rb") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None, "not compiled at install"
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
        return None, "sources changed since the build"
    return str(manifest["mypyc"]), ""


MYPYC_VERSION, PURE_REASON = _choose()
if MYPYC_VERSION is None and not any(isinstance(f, _SourceFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _SourceFinder(COMPILED_MODULES))


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
