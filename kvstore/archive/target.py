"""Where an archive lives: reads through the read-only seam, writes beside it.

:class:`ArchiveTarget` is one archive prefix. Reads go through a
:class:`wal.readfs.ReadFS` (from :func:`wal.readfs.resolve`); writes are
whole objects only (:meth:`ArchiveTarget.put`), never an update in place:

* a local directory or ``file://``: through :class:`wal.fs.FileSystem` (so
  the tests' fault injector sees every write): a temporary name
  (:func:`kvstore.archive.layout.temp_name`), the data, fsync, rename, fsync
  of the directory. Durable and atomic when :meth:`put` returns.
* any other ``pyarrow.fs.FileSystem`` (S3, GCS, HDFS, fsspec): one output
  stream closed after the last byte; an object store makes the object
  visible whole at that close (a single PUT or a completed multipart
  upload), never a part of it.

Credentials never leave this module in text: :meth:`display` redacts every
path it shows (:func:`wal.readfs.redact`), and :meth:`scrub` removes the
secrets of the location from any message (an error from the object store's
client) before it is logged, raised or kept in stats.

An object store that fails or does not answer: every request has bounded
time (:mod:`wal.readfs`: ``timeout=SECONDS`` in the URI, default
:data:`wal.readfs.DEFAULT_TIMEOUT`), and every read, listing, write and
delete through a target turns the client's error into one
:class:`~wal.errors.ArchiveUnavailableError` naming the archive, what was
being done, whether it timed out, and what to do (the archiver retries it).
A local archive where a file stands (the path, or a directory above it) is
an :class:`~wal.errors.ArchiveError` from :meth:`ArchiveTarget.require_directory`,
which readers and the sidecar call first (an archiver in a store's process
retries it as an outage: the file may be moved away).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import parse_qsl, unquote, urlsplit

from kvstore.archive.layout import is_temp_name, temp_name
from wal.errors import ArchiveError, ArchiveUnavailableError
from wal.fs import OS_FS, FileInfo, FileSystem, file_in_the_way
from wal.readfs import REQUEST_ATTEMPTS, ArrowFS, ReadFS, redact, resolve

Location = str | os.PathLike[str] | tuple[Any, str]
_SECRET_OPTIONS = ("secret_key", "access_key", "session_token", "password")


class ArchiveTarget:
    """One archive prefix: ``fs`` and ``root`` for reads, :meth:`put` and
    :meth:`delete` for writes. Paths are given as names under ``root``."""

    def __init__(self, fs: ReadFS, root: str, *, local: FileSystem | None = None, arrow: Any = None,
                 uri: str | None = None) -> None:
        self.root = root
        self._local = local
        self._arrow = arrow
        self._secrets = _secrets_of(uri) if uri else []
        self.uri = redact(uri) if uri else fs.display(root)
        self.timeout = fs.timeout if isinstance(fs, ArrowFS) else None
        self.fs: ReadFS = _RemoteFS(fs, self) if arrow is not None else fs

    @classmethod
    def open(cls, location: Location, *, fs: FileSystem = OS_FS) -> ArchiveTarget:
        """The archive at ``location``: a local path, a URI pyarrow
        understands (``s3://KEY:SECRET@bucket/prefix?endpoint_override=host:port&scheme=http``,
        ``file://``, ``gs://``, ``hdfs://``) or a ``(filesystem, path)`` pair
        (pyarrow or fsspec). ``fs`` is the write seam used for local targets."""
        uri = os.fspath(location) if isinstance(location, (str, os.PathLike)) else None
        read_fs, root = resolve(location)
        if isinstance(read_fs, FileSystem):
            return cls(read_fs, root, local=fs, uri=None)
        if isinstance(read_fs, ArrowFS):
            import pyarrow.fs as pafs  # type: ignore[import-not-found,import-untyped,unused-ignore]

            arrow = read_fs.filesystem
            if isinstance(arrow, pafs.LocalFileSystem):
                return cls(read_fs, root, local=fs, uri=uri)
            return cls(read_fs, root, arrow=arrow, uri=uri)
        return cls(read_fs, root, uri=uri)  # a ReadFS pair: readable only

    def __repr__(self) -> str:
        return f"ArchiveTarget({self.uri})"

    def require_directory(self) -> None:
        """:class:`ArchiveError` when the archive is local and a file stands
        where its directory, or a directory above it, would be."""
        if self._local is None:
            return
        blocker = file_in_the_way(self.root)
        if blocker is None:
            return
        where = "it is a file" if blocker == os.path.abspath(self.root) else f"{blocker} is a file"
        raise ArchiveError(f"no archive can be at {self.uri}: {where}, not a directory; an archive is a directory "
                           "(made when a store is first archived to it) or an object store URI: give another "
                           "location")

    # -- paths and text ---------------------------------------------------------------

    def path(self, *names: str) -> str:
        return self.fs.join(self.root, *names) if names else self.root

    def display(self, path: str | None = None) -> str:
        """``path`` (default: the archive) as shown to people: credentials redacted."""
        return self.scrub(self.fs.display(self.root if path is None else path))

    @contextlib.contextmanager
    def failures(self, doing: str, path: str | None = None) -> Iterator[None]:
        """Around one request to an object store: its client's error (an
        ``OSError``, but not a missing file, which callers handle) becomes
        :class:`ArchiveUnavailableError` saying what and what to do."""
        try:
            yield
        except FileNotFoundError:
            raise
        except OSError as e:
            raise self.unavailable(e, doing, path) from None

    def unavailable(self, error: OSError, doing: str, path: str | None) -> ArchiveUnavailableError:
        """The error for ``error`` met ``doing`` something to ``path`` (see :meth:`failures`)."""
        text = self.scrub(" ".join(str(error).split()))
        if len(text) > _CLIENT_TEXT:  # google-cloud-cpp says everything twice
            text = text[: _CLIENT_TEXT - 1] + "…"
        name = path[len(self.root):].strip("/") if path is not None and path.startswith(self.root) else None
        what = f"{doing} {name or (self.display(path) if path is not None else 'it')}"
        timed_out = any(s in text for s in _TIMEOUT_TEXTS)
        if timed_out:
            given = (f"requests are given {self.timeout:g} s each, tried {REQUEST_ATTEMPTS} times"
                     if self.timeout is not None else "its file system's own timeouts")
            return ArchiveUnavailableError(
                f"the archive {self.uri} did not answer in time: {what} timed out ({given}: {text}); check "
                "that its object store is up and reachable from this machine (endpoint, network, credentials), "
                "or give it longer with timeout=SECONDS in the URI", uri=self.uri, timed_out=True)
        return ArchiveUnavailableError(
            f"the archive {self.uri} cannot be reached: {what} failed ({text}); check that its object store is "
            "up and reachable from this machine and that the URI (endpoint, bucket, credentials) is right",
            uri=self.uri, timed_out=False)

    def scrub(self, text: str) -> str:
        """``text`` with every credential of the location replaced by ``***``."""
        text = redact(text) if "://" in text else text
        for s in self._secrets:
            text = text.replace(s, "***")
        return text

    # -- reads --------------------------------------------------------------------------

    def list(self, *names: str) -> list[FileInfo]:
        """The entries of a directory under the root (``[]`` when missing),
        temporary names left out."""
        return [i for i in self.fs.list_dir(self.path(*names)) if not is_temp_name(i.name)]

    def read(self, *names: str) -> bytes | None:
        return self.fs.read_file(self.path(*names))

    # -- writes -------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        return self._local is not None or self._arrow is not None

    def put(self, data: bytes, *names: str) -> None:
        """Create the object ``names`` with ``data``, atomically (see the
        module docstring): on return it is whole and durable, or absent."""
        path = self.path(*names)
        if self._local is not None:
            _put_local(self._local, path, data)
        elif self._arrow is not None:
            with self.failures("writing", path), self._arrow.open_output_stream(path) as out:
                out.write(data)
        else:
            raise TypeError(f"the archive {self.uri} was given as a read-only file seam; pass a URI, a "
                            "local path or a pyarrow/fsspec file system to write to it")

    def delete(self, *names: str) -> None:
        """Delete the object ``names``; a missing one is not an error.

        pyarrow's S3 file system writes an empty "directory marker" for the
        parent after every delete (apache/arrow#36275); where that PUT fails
        the object is gone all the same, so an error is raised only when it
        is still there. (``rclone serve s3`` mishandles those markers: the
        tests' S3 archives never delete.)"""
        path = self.path(*names)
        try:
            if self._local is not None:
                self._local.unlink(path)
                self._local.fsync_dir(os.path.dirname(path))
            elif self._arrow is not None:
                with self.failures("deleting", path):
                    try:
                        self._arrow.delete_file(path)
                    except OSError:
                        import pyarrow.fs as pafs  # type: ignore[import-not-found,import-untyped,unused-ignore]

                        if self._arrow.get_file_info(path).type != pafs.FileType.NotFound:
                            raise
        except FileNotFoundError:
            pass

    def remove_temps(self, *names: str) -> int:
        """Delete the temporary names a killed writer left in a local
        directory under the root (object stores leave none); return how many."""
        if self._local is None:
            return 0
        n = 0
        for info in self.fs.list_dir(self.path(*names)):
            if is_temp_name(info.name) and not info.is_dir:
                self.delete(*names, info.name)
                n += 1
        return n


_CLIENT_TEXT = 300
"""At most this much of an object-store client's own message goes into an error."""
_TIMEOUT_TEXTS = ("Timeout was reached", "timed out", "Retry policy exhausted", "DEADLINE_EXCEEDED")
"""How object-store clients (the AWS SDK's curl, google-cloud-cpp) say a request ran out of time."""


class _RemoteFS:
    """An object store's :class:`ReadFS`, each request's failure turned into
    :class:`ArchiveUnavailableError` by its target (:meth:`ArchiveTarget.failures`)."""

    def __init__(self, fs: ReadFS, target: ArchiveTarget) -> None:
        self.inner = fs
        self.target = target

    def list_dir(self, path: str) -> list[FileInfo]:
        with self.target.failures("listing", path):
            return self.inner.list_dir(path)

    def open_input(self, path: str) -> BinaryIO:
        with self.target.failures("reading", path):
            return _RemoteFile(self.inner.open_input(path), self.target, path)  # type: ignore[return-value]

    def read_file(self, path: str) -> bytes | None:
        with self.target.failures("reading", path):
            return self.inner.read_file(path)

    def file_size(self, path: str) -> int:
        with self.target.failures("reading", path):
            return self.inner.file_size(path)

    def join(self, base: str, *names: str) -> str:
        return self.inner.join(base, *names)

    def display(self, path: str) -> str:
        return self.inner.display(path)


class _RemoteFile:
    """An object open for reading whose every call's failure is turned into
    :class:`ArchiveUnavailableError` (a ranged read is a request too)."""

    def __init__(self, f: BinaryIO, target: ArchiveTarget, path: str) -> None:
        self._f = f
        self._target = target
        self._path = path

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._f, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._target.failures("reading", self._path):
                return attr(*args, **kwargs)
        return call

    def __enter__(self) -> _RemoteFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def _put_local(fs: FileSystem, path: str, data: bytes) -> None:
    directory, name = os.path.split(path)
    fs.makedirs(directory)
    tmp = os.path.join(directory, temp_name(name, secrets.token_hex(8)))
    try:
        fs.write_file(tmp, data)
        fs.rename(tmp, path)
    except BaseException:
        try:
            fs.unlink(tmp)
        except OSError:
            pass
        raise
    fs.fsync_dir(directory)


def _secrets_of(uri: str) -> list[str]:
    """The credential strings in ``uri`` (user info and secret query options)."""
    out: list[str] = []
    try:
        parts = urlsplit(uri)
    except ValueError:
        return out
    netloc = parts.netloc
    if "@" in netloc:
        for piece in netloc.rsplit("@", 1)[0].split(":"):
            out += [piece, unquote(piece)]
    for key, value in parse_qsl(parts.query, keep_blank_values=False):
        if key.lower() in _SECRET_OPTIONS:
            out.append(value)
    return sorted({s for s in out if len(s) >= 3}, key=len, reverse=True)


__all__ = ["ArchiveTarget", "Location"]
