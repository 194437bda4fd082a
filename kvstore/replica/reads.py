"""The read side of a replica (:class:`kvstore.replica.replica.Replica`): gets,
scans and views of its current LMDB state, going on across the swap after a
rebuild (rules in :mod:`kvstore.replica.replica`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import TypeVar

from kvstore.state.machine import State
from kvstore.state.readers import Lookups
from kvstore.state.view import DEFAULT_MAX_VIEW_SECONDS, View, scan_bounds
from wal.errors import ClosedError

T = TypeVar("T")


class ReplicaReads(Lookups):
    """Reads through ``_state``; a read that meets the state closed by a
    swap (``_swapping`` under ``_swap``) waits for it and reads the new one."""

    path: str
    _state: State
    _swap: threading.Condition
    _swapping: bool
    _closed: bool

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the replica {self.path} is closed")

    def _after_swap(self, used: State) -> State:
        """The state to read after ``used`` raised ClosedError: the new one
        once a swap is done; ClosedError when the replica itself closed."""
        with self._swap:
            while self._swapping and not self._closed:
                self._swap.wait()
            if self._closed or self._state is used:
                raise ClosedError(f"the replica {self.path} is closed")
            return self._state

    def _read(self, fn: Callable[[State], T]) -> T:
        state = self._state
        while True:
            try:
                return fn(state)
            except ClosedError:
                state = self._after_swap(state)

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        """The value of ``key`` as of :attr:`applied_lsn`, or ``default``."""
        try:
            return self._state.get(key, default)
        except ClosedError:
            return self._read(lambda s: s.get(key, default))

    def __len__(self) -> int:
        self._check_open()
        return self._read(lambda s: s.count())

    def scan(self, start: bytes | None = None, stop: bytes | None = None, *,
             prefix: bytes | None = None, reverse: bool = False) -> Generator[tuple[bytes, bytes], None, None]:
        """Like :meth:`kvstore.KVStore.scan` (each key once, in order, with a
        value it had at some moment during the scan)."""
        lo, hi = scan_bounds(start, stop, prefix)
        self._check_open()
        return self._scan(lo, hi, reverse)

    def _scan(self, lo: bytes, hi: bytes | None, reverse: bool) -> Generator[tuple[bytes, bytes], None, None]:
        state = self._state
        while True:
            try:
                for key, value in state.scan(lo, hi, reverse):
                    if reverse:
                        hi = key
                    else:
                        lo = key + b"\x00"
                    yield key, value
                return
            except ClosedError:
                state = self._after_swap(state)

    def view(self, max_seconds: float = DEFAULT_MAX_VIEW_SECONDS) -> View:
        """Several keys as of one LSN (:meth:`kvstore.KVStore.view`); closed
        by a rebuild's swap (module docstring)."""
        self._check_open()
        return self._read(lambda s: s.view(max_seconds))

