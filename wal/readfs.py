"""The read-only file seam: how every reader of walkv's files reaches them.

The log's segment reader, the snapshot reader, the Spark source, the archive
and replicas read files through a :class:`ReadFS`: list a directory (names,
sizes, kinds), open a file for seekable reading, read a small file whole. Two
implementations exist:

* local files: :class:`wal.fs.FileSystem` (``wal.fs.OS_FS``), the same object
  the writers use, so a reader beside a writer sees one file system;
* :class:`ArrowFS`: any ``pyarrow.fs.FileSystem`` (S3, GCS, HDFS, local), and
  any fsspec file system through pyarrow's ``FSSpecHandler``.

:func:`resolve` turns what a user passes (a local path, a URI, a
``(filesystem, path)`` pair) into a ``(ReadFS, root)`` pair. Readers never
write: nothing here can change a file.

Paths inside a :class:`ReadFS` use ``/`` and are built with :meth:`ReadFS.join`;
:meth:`ReadFS.display` turns one back into what the user gave (a URI keeps its
scheme) for messages.

Object stores are given bounded time (:data:`DEFAULT_TIMEOUT`): an ``s3://``
or ``gs://`` URI resolves to a file system whose every request must connect,
and then keep sending, within that many seconds, and is tried
:data:`REQUEST_ATTEMPTS` times (pyarrow's own defaults wait minutes on an
endpoint that never answers, and retry Google Cloud requests for 15).
``timeout=SECONDS`` in the URI's query sets it for that location (walkv's
option: it is taken out before pyarrow reads the URI). A file system object
passed in a ``(filesystem, path)`` pair keeps the timeouts it was built with.
"""

from __future__ import annotations

import datetime
import math
import os
import time
from typing import Any, BinaryIO, Protocol, runtime_checkable

from wal.fs import OS_FS, FileInfo

DEFAULT_TIMEOUT = 5.0
"""Seconds an object store is given to connect, and then between the bytes
of an answer, for each request (``timeout=`` in a URI changes it)."""
REQUEST_ATTEMPTS = 2
"""How many times an object-store request is tried before it fails."""
TIMEOUT_OPTION = "timeout"


@runtime_checkable
class ReadFS(Protocol):
    """Read-only access to a tree of files (see the module docstring)."""

    def list_dir(self, path: str) -> list[FileInfo]:
        """The entries of directory ``path``; ``[]`` when it does not exist."""
        ...

    def open_input(self, path: str) -> BinaryIO:
        """``path`` open for seekable binary reading (``FileNotFoundError`` when missing)."""
        ...

    def read_file(self, path: str) -> bytes | None:
        """The whole of a small file, or ``None`` when it does not exist."""
        ...

    def file_size(self, path: str) -> int:
        """The size of ``path`` in bytes (``FileNotFoundError`` when missing)."""
        ...

    def join(self, base: str, *names: str) -> str:
        """``base`` with ``names`` appended as path components."""
        ...

    def display(self, path: str) -> str:
        """``path`` as the user would name it, for messages."""
        ...


class ArrowFS:
    """A :class:`ReadFS` over a ``pyarrow.fs.FileSystem``.

    Built from a URI, it pickles as the URI and resolves the file system again
    where it is unpickled (a Spark executor), so credentials from the
    environment are looked up there. Built from a file system object it
    pickles that object (pyarrow's file systems pickle).
    """

    def __init__(self, filesystem: Any, *, uri: str | None = None, root: str = "",
                 timeout: float | None = None) -> None:
        self._fs = filesystem
        self._uri = uri
        self._root = root.rstrip("/")
        self.timeout = timeout
        """Seconds per request this file system was given (None: its own, as built by the caller)."""

    @classmethod
    def from_uri(cls, uri: str) -> tuple[ArrowFS, str]:
        """The file system of ``uri`` and the path in it; object stores with
        bounded timeouts (module docstring)."""
        pafs = _pyarrow_fs()
        plain, timeout = _split_timeout(uri)
        try:
            filesystem, root = pafs.FileSystem.from_uri(plain)
        except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
            raise ValueError(f"cannot resolve the URI {redact(uri)!r}: {exc}") from exc
        filesystem, bounded = _bounded(pafs, filesystem, timeout)
        return cls(filesystem, uri=uri, root=root, timeout=timeout if bounded else None), root

    def __getstate__(self) -> dict[str, Any]:
        if self._uri is not None:
            return {"uri": self._uri, "root": self._root}
        return {"fs": self._fs, "root": self._root}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._uri = state.get("uri")
        self._root = state["root"]
        self._fs = state.get("fs")
        self.timeout = None
        if self._fs is None:
            again = ArrowFS.from_uri(self._uri or "")[0]
            self._fs, self.timeout = again._fs, again.timeout

    @property
    def filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` read through (writers beside a reader use it)."""
        return self._fs

    def __repr__(self) -> str:
        return f"ArrowFS({redact(self._uri) if self._uri else type(self._fs).__name__})"

    def list_dir(self, path: str) -> list[FileInfo]:
        pafs = _pyarrow_fs()
        infos = self._fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return [FileInfo(i.base_name, i.path, i.size or 0, i.type == pafs.FileType.Directory) for i in infos]

    def open_input(self, path: str) -> BinaryIO:
        f: BinaryIO = self._fs.open_input_file(path)
        return f

    def read_file(self, path: str) -> bytes | None:
        t0 = time.monotonic()
        try:
            with self._fs.open_input_file(path) as f:
                data: bytes = f.read()
                return data
        except FileNotFoundError:
            return None
        except OSError:
            if self.timeout is not None and time.monotonic() - t0 >= self.timeout:
                raise  # it ran out of time: asking again would only double the wait
            if self._fs.get_file_info(path).type == _pyarrow_fs().FileType.NotFound:
                return None  # some file systems say "missing" only this way
            raise

    def file_size(self, path: str) -> int:
        info = self._fs.get_file_info(path)
        if info.type == _pyarrow_fs().FileType.NotFound:
            raise FileNotFoundError(path)
        return int(info.size or 0)

    def join(self, base: str, *names: str) -> str:
        return "/".join([base.rstrip("/"), *names]) if base.rstrip("/") else "/" + "/".join(names)

    def display(self, path: str) -> str:
        if self._uri is not None and self._root and path.startswith(self._root):
            return redact(self._uri).rstrip("/") + path[len(self._root):]
        return path


def resolve(location: str | os.PathLike[str] | tuple[Any, str]) -> tuple[ReadFS, str]:
    """``(ReadFS, root)`` for what a user passes as a store, snapshot or archive:

    * a local path (``str`` or path-like, no ``://``): the local file system
      and the absolute path;
    * a URI that ``pyarrow.fs.FileSystem.from_uri`` understands (``file://``,
      ``s3://`` with its query options, ``gs://``, ``hdfs://``);
    * a ``(filesystem, path)`` pair: a ``pyarrow.fs.FileSystem``, an fsspec
      file system, or a :class:`ReadFS` already.
    """
    if isinstance(location, tuple):
        if len(location) != 2 or not isinstance(location[1], str):
            raise TypeError("a (filesystem, path) location needs a file system and a str path")
        filesystem, path = location
        if isinstance(filesystem, ReadFS):
            return filesystem, path
        pafs = _pyarrow_fs()
        if not isinstance(filesystem, pafs.FileSystem):
            if not hasattr(filesystem, "ls") or not hasattr(filesystem, "open"):
                raise TypeError(f"not a pyarrow or fsspec file system: {type(filesystem).__name__}")
            filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
        return ArrowFS(filesystem, root=path), path.rstrip("/") or "/"
    if not isinstance(location, (str, os.PathLike)):
        raise TypeError(f"a location is a path, a URI or a (filesystem, path) pair, not {type(location).__name__}")
    text = os.fspath(location)
    if not text:
        raise ValueError("the location is empty: give a directory path or a URI")
    if "://" not in text:
        return OS_FS, os.path.abspath(os.path.expanduser(text))
    fs, root = ArrowFS.from_uri(text)
    return fs, root.rstrip("/") or "/"


def _split_timeout(uri: str) -> tuple[str, float]:
    """``uri`` without walkv's ``timeout=`` query option, and its value (or the default)."""
    head, sep, query = uri.partition("?")
    if not sep:
        return uri, DEFAULT_TIMEOUT
    timeout = DEFAULT_TIMEOUT
    kept = []
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name != TIMEOUT_OPTION:
            kept.append(part)
            continue
        try:
            timeout = float(value)
        except ValueError:
            timeout = math.nan
        if not (0 < timeout < math.inf):
            raise ValueError(f"{TIMEOUT_OPTION}={value!r} in the URI {redact(uri)!r} is not a number of seconds "
                             "greater than 0")
    return head + ("?" + "&".join(kept) if kept else ""), timeout


def _bounded(pafs: Any, filesystem: Any, timeout: float) -> tuple[Any, bool]:
    """``filesystem`` rebuilt with bounded requests when it is an object store
    (S3: connect and read timeouts, :data:`REQUEST_ATTEMPTS` tries; Google
    Cloud: a time limit on its retries), and whether it was."""
    s3 = getattr(pafs, "S3FileSystem", None)
    gcs = getattr(pafs, "GcsFileSystem", None)
    if s3 is not None and isinstance(filesystem, s3):
        rebuild, (options,) = filesystem.__reduce__()
        options.update(connect_timeout=timeout, request_timeout=timeout,
                       retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=REQUEST_ATTEMPTS))
        return rebuild(options), True
    if gcs is not None and isinstance(filesystem, gcs):
        rebuild, (options,) = filesystem.__reduce__()
        if options.get("retry_time_limit") is None:  # pyarrow's retry_limit_seconds= wins
            options["retry_time_limit"] = datetime.timedelta(seconds=timeout * REQUEST_ATTEMPTS)
        return rebuild(options), True
    return filesystem, False


def redact(uri: str) -> str:
    """``uri`` with any credentials (``scheme://KEY:SECRET@host``, or
    ``secret_key=``/``access_key=``/``session_token=`` query options) replaced
    by ``***``: the form every message, log line and stat shows."""
    import re

    if "://" not in uri:
        return uri
    scheme, rest = uri.split("://", 1)
    rest, qsep, query = rest.partition("?")  # a query may follow the host directly
    netloc, sep, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = re.sub(r"((?:secret_key|access_key|session_token|password)=)[^&]*", r"\1***", query, flags=re.IGNORECASE)
    return f"{scheme}://{netloc}{sep}{path}{qsep}{query}"


def _pyarrow_fs() -> Any:
    try:
        import pyarrow.fs as pafs  # type: ignore[import-not-found,import-untyped,unused-ignore]  # optional (walkv[spark]), untyped
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reading a URI or a file system object needs pyarrow: pip install 'walkv[spark]'") from exc
    return pafs


__all__ = ["DEFAULT_TIMEOUT", "REQUEST_ATTEMPTS", "ArrowFS", "FileInfo", "ReadFS", "redact", "resolve"]
