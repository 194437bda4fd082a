"""The background flusher of ``sync="batch"``: a thread that syncs the log
every ``interval`` seconds, or sooner when the writer says enough bytes wait
(:meth:`BatchFlusher.poke`). It shares the group commit's mutex, so a poke or
a stop never races the check the thread makes before it waits."""

from __future__ import annotations

import threading
from collections.abc import Callable

from wal.errors import ClosedError, LogFailedError
from wal.mutex import Mutex, condition


class BatchFlusher:
    """Calls ``sync()`` every ``interval`` seconds until :meth:`stop` (or until
    the log is closed or failed, which ``sync`` reports by raising)."""

    def __init__(self, mutex: Mutex, interval: float, sync: Callable[[], object]) -> None:
        self._due = condition(mutex)
        self._interval = interval
        self._sync = sync
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="walkv-flusher", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Sync now rather than at the end of the interval (mutex held)."""
        self._due.notify()

    def stop(self) -> None:
        """Stop the thread and wait for it (briefly: a sync in flight finishes)."""
        with self._due:
            self._stopping = True
            self._due.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._due:
                if self._stopping:
                    return
                self._due.wait(self._interval)
                if self._stopping:
                    return
            try:
                self._sync()
            except (LogFailedError, ClosedError):
                return
