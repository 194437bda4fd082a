"""Child process of tests/test_staged_apply.py: writes two bulk batches
(printing ``acked <lsn>`` after each), then a third whose fsync never
returns: once the writing thread has staged the batch in LMDB and waits for
that fsync, it prints ``staged`` and blocks until it is killed.

    python tests/staged_child.py STORE OPS
"""

from __future__ import annotations

import os
import sys
import threading
import time

import kvstore
from wal.fs import File, FileSystem

WAITING = ("join", "_wait_for_tstate_lock")
"""Where a thread blocked in ``threading.Thread.join`` is (its top Python frame)."""


class _File(File):
    def sync(self, *, full: bool = False) -> None:
        if not (ARMED.is_set() and self.path.endswith(".wal")):
            super().sync(full=full)
            return
        # The fsync that does not return. Wait until the writing thread has staged the batch
        # (it then waits for this thread), then say so.
        leader = threading.main_thread().ident
        end = time.monotonic() + 60
        while True:
            frame = sys._current_frames().get(leader)  # type: ignore[arg-type]
            if frame is not None and frame.f_code.co_name in WAITING:
                break
            if time.monotonic() > end:
                os.write(2, b"the writer never waited for the fsync\n")
                os._exit(3)
            time.sleep(0.001)
        os.write(1, b"staged\n")
        threading.Event().wait()


class _FS(FileSystem):
    def open(self, path: str, *, create: bool = False, exclusive: bool = False, readonly: bool = False) -> File:
        f = super().open(path, create=create, exclusive=exclusive, readonly=readonly)
        return _File(f.path, f.fd)


ARMED = threading.Event()


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
    db = kvstore.open(path, sync="always", fs=_FS())
    for tag in (b"a", b"b", b"c"):
        if tag == b"c":
            ARMED.set()
        with db.batch() as b:
            for i in range(n):
                b.put(b"%s%06d" % (tag, i), b"%s-value-%d" % (tag, i))
        os.write(1, b"acked %d\n" % b.lsn)


if __name__ == "__main__":
    main()
