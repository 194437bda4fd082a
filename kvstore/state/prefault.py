"""What the state tells the kernel about LMDB's map: faulting in, on a
helper thread, the map pages a bulk LMDB write is about to fill
(:class:`Prefault`, :meth:`kvstore.state.environment.Environment.make_room`),
and reading the map ahead of a scan of all of it (:class:`SequentialScan`).

With ``writemap`` LMDB writes its dirty pages straight into the shared map
of ``data.mdb``, and the first write to each new page is a page fault the
kernel serves on the writing thread: a new page-cache page, the file
system's ``page_mkwrite``, the page table. A batch of 100,000 puts fills
about 3,100 new pages (13 MB), and those faults cost 4-6 ms of the ~55 the
whole durable batch took. ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14)
takes the same faults without writing anything, so a helper thread that
runs it over the pages past the end of the data, started as the
transaction begins, takes them on another core, ahead of the writer (13 MB
in 3-4.5 ms: three to four times as fast as LMDB fills them).

Why it is safe: populating changes no byte of the file (the pages past the
end of the data are zeros, ``fallocate``'d by
:func:`~kvstore.state.lmdb_ops.preallocate`, and stay zeros until LMDB
writes them), so it races with nothing LMDB does; what it costs is that
pages LMDB does not fill after all are written back once as the zeros they
were. The one thing it must not outlive is the mapping: the environment
calls :meth:`Prefault.wait` before every remap (a grown map) and at close.

Where it does nothing: other systems than Linux, kernels without
``MADV_POPULATE_WRITE`` (found once, then never tried again), and an
environment opened without ``writemap`` (its pages are written with
``pwrite``, not through the map).

Reading ahead (:class:`SequentialScan`): the store opens LMDB without
readahead (:mod:`kvstore.state.lmdb_env`: ``MADV_RANDOM`` on the map), right
for gets on a map larger than the page cache, where reading ahead would
fetch 128 KiB for every 4 KiB page a get needs. A scan of the whole map in
key order (a snapshot) then reads one page per fault: a snapshot of 10M
keys whose map was not in the cache took 54.6 s, and 10.4 s with
``MADV_SEQUENTIAL`` over the map while it ran (then ``MADV_RANDOM`` again).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
from collections.abc import Callable
from typing import Final

Madvise = Callable[[int, int, int], int]

MADV_POPULATE_WRITE: Final = 23
"""Linux's ``madvise`` advice (``<linux/mman.h>``, since 5.14)."""
MADV_RANDOM: Final = 1
MADV_SEQUENTIAL: Final = 2

_libc: ctypes.CDLL | None = None
_supported = sys.platform.startswith("linux")


def _madvise() -> Madvise | None:
    """libc's ``madvise``, or None where it cannot populate."""
    return _libc_madvise() if _supported else None


def _libc_madvise() -> Madvise | None:
    """libc's ``madvise``, or None off Linux."""
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)  # the GIL is released during its calls
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise


def map_address(path: str, length: int) -> int | None:
    """Where this process maps the first ``length`` bytes of the file at
    ``path`` (found in ``/proc/self/maps`` by the file's device and inode),
    or None."""
    try:
        st = os.stat(path)
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ino = str(st.st_ino).encode()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}".encode()
    near = b" " + ino + b" "
    for line in lines:
        if near not in line:  # (a substring test first: a process maps hundreds of files)
            continue
        fields = line.split(None, 5)
        if len(fields) < 6 or fields[4] != ino or fields[3] != dev or int(fields[2], 16) != 0:
            continue
        start, end = (int(x, 16) for x in fields[0].split(b"-"))
        if end - start >= length:
            return start
    return None


class Prefault:
    """At most one populating thread at a time, over a range of one
    environment's map (the module docstring says why, and when not).

    ``threading.Thread.start`` returns once the thread runs, which is what
    gives it its head start on the writer: started without that wait
    (``_thread.start_new_thread``), it faulted the same first pages as LMDB
    wrote them, and the transaction took 2-6 ms longer, not less."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None

    def start(self, address: int, length: int) -> None:
        """Populate ``length`` bytes of the map from ``address`` (page
        aligned) on a helper thread, after the previous range."""
        madvise = _madvise()
        if madvise is None or length <= 0:
            return
        self.wait()
        thread = threading.Thread(target=_populate, args=(madvise, address, length),
                                  name="walkv-prefault", daemon=True)
        thread.start()
        self._thread = thread

    def wait(self) -> None:
        """Return once no thread populates (before the map may be unmapped)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()


def _populate(madvise: Madvise, address: int, length: int) -> None:
    global _supported
    if madvise(address, length, MADV_POPULATE_WRITE) != 0 and ctypes.get_errno() == errno.EINVAL:  # a kernel before 5.14
        _supported = False


class SequentialScan:
    """``MADV_SEQUENTIAL`` over ``length`` bytes of the map at ``address``
    while a scan of all of it runs, then ``MADV_RANDOM`` again, the advice
    LMDB gave it (module docstring). A hint: it changes no byte, a failed
    call is ignored, and it does nothing without ``address`` or off Linux.
    :meth:`end` gives the map its advice back early (before the map may be
    remapped: once the scan's read transaction is closed)."""

    def __init__(self, address: int | None, length: int) -> None:
        self._madvise = _libc_madvise() if address is not None else None
        self._address = address or 0
        self._length = length

    def __enter__(self) -> SequentialScan:
        if self._madvise is not None:
            self._madvise(self._address, self._length, MADV_SEQUENTIAL)
        return self

    def end(self) -> None:
        madvise, self._madvise = self._madvise, None
        if madvise is not None:
            madvise(self._address, self._length, MADV_RANDOM)

    def __exit__(self, *exc: object) -> None:
        self.end()
