"""What :func:`kvstore.open` checks before it opens anything: what a path
must be to open a store there, or to make one (:func:`store_path`), and the
options it refuses (:func:`checked_limits`, :func:`refuse_writer_options`).

* A path (``str``, ``bytes`` or ``os.PathLike``) to a directory that holds a
  log (``wal/``): a store.
* A path where nothing is, or an empty directory: a new store is made there
  (its missing parents too); a read-only open says there is no store.
* A directory that holds only what walkv itself puts in a store's directory
  (:data:`kvstore.layout.STORE_NAMES`: a ``LOCK`` left by a writer that
  stopped before its log existed, a restore's or a promotion's parts) or a
  file system's ``lost+found``: as a new store.
* A file, or a path through a file: refused, "is a file, not a directory"
  (as restore says).
* A directory that holds anything else and no log (someone's home folder, a
  project, a store's own ``wal/`` given by mistake): refused, naming what is
  there. It never silently becomes a store.

The refusals are :class:`~wal.errors.NotAStoreError`, before anything is
made, locked or written.

An option that cannot hold is a ValueError (a number out of range) or a
TypeError (an option a read-only store does not take), before anything is
opened either.
"""

from __future__ import annotations

import os
from typing import Final

from kvstore.entry.codec import ENTRY_OVERHEAD, MAX_KEY_BYTES
from kvstore.layout import REPLICA_NAME, STORE_NAMES, WAL_DIR
from wal.errors import NotAStoreError
from wal.fs import file_in_the_way
from wal.segment import segment_first_lsn

_ALSO_FINE: Final = frozenset(("lost+found",))
"""What a fresh file system's root holds: a store may be made there."""
_SHOWN: Final = 5
"""The names a refusal lists (then "and N more")."""


def store_path(path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> str:
    """``path`` as an absolute ``str``, checked as the module docstring says
    (for a read-only open too: it makes nothing, but a directory that is not
    a store is refused with the same words)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"a store's path is a str, bytes or os.PathLike, not {type(path).__name__}")
    root = os.path.abspath(os.fsdecode(path))
    blocker = file_in_the_way(root)
    if blocker is not None:
        what = "it is a file" if blocker == root else f"{blocker} is a file"
        raise NotAStoreError(f"cannot open a store at {root}: {what}, not a directory; a store is a directory "
                             "(give a new path, an empty directory or a store's)")
    if not os.path.isdir(root) or os.path.isdir(os.path.join(root, WAL_DIR)):
        return root  # a store, or nothing there yet (a read-only open says there is no store)
    names = sorted(os.listdir(root))
    if REPLICA_NAME in names:
        return root  # a read replica's directory: the writer says how to open or promote it
    foreign = [n for n in names if n not in STORE_NAMES and n not in _ALSO_FINE]
    if foreign:
        raise NotAStoreError(f"{root} is not a walkv store and is not empty: it holds {describe(root, foreign)} "
                             f"but no {WAL_DIR}/ directory. walkv makes a store only in a new or empty "
                             "directory: give another path" + _hint(root, foreign))
    return root


def describe(root: str, names: list[str]) -> str:
    """The first few of ``names`` (entries of ``root``), directories with a ``/``."""
    shown = [n + ("/" if os.path.isdir(os.path.join(root, n)) else "") for n in names[:_SHOWN]]
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(shown) + more


def _hint(root: str, names: list[str]) -> str:
    """What the directory looks like, when it looks like a part of a store."""
    if any(segment_first_lsn(n) is not None for n in names):
        return f" (it holds log segments: it looks like a store's {WAL_DIR}/ directory; open its parent, " \
               f"{os.path.dirname(root)})"
    return ""


def checked_limits(max_value_bytes: int, max_record_bytes: int, max_retained_bytes: int) -> int:
    """The size options checked (``max_record_bytes`` at least 4096,
    ``max_retained_bytes`` an int >= 0); returns the largest value a store
    with them takes: ``max_value_bytes``, or less when an entry of that value
    and the longest key would not fit a log record."""
    if max_record_bytes < 4096:
        raise ValueError(f"max_record_bytes must be at least 4096, not {max_record_bytes!r}")
    limit = min(int(max_value_bytes), max_record_bytes - ENTRY_OVERHEAD - MAX_KEY_BYTES)
    if limit < 1:
        raise ValueError(f"max_value_bytes must be positive, not {max_value_bytes!r}")
    if type(max_retained_bytes) is not int or max_retained_bytes < 0:
        raise ValueError(f"max_retained_bytes must be an int >= 0, not {max_retained_bytes!r}")
    return limit


def refuse_writer_options(*, archive: object, replicas: bool, log_options: dict[str, object]) -> None:
    """TypeError for what only a store's writer does, asked of a store opened
    with ``readonly=True``: archive it, wait for replicas, run its log."""
    if archive is not None:
        raise TypeError("a store opened with readonly=True does not archive; its writer does "
                        "(or run `walkv archive STORE URI` beside it)")
    if log_options:
        raise TypeError(f"readonly stores take no log options: {sorted(log_options)}")
    if replicas:
        raise TypeError("a store opened with readonly=True writes nothing; its writer waits for replicas")
