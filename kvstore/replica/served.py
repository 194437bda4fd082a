"""The state a replica serves reads from, swapped whole after a rebuild.

:class:`ServedState` holds the replica's current :class:`~kvstore.state.State`.
After the source's retention trimmed past the replica, a new LMDB is built
beside the old one while reads go on serving the OLD state; then
:meth:`ServedState.swap` closes the old state and installs the new one. A read
that meets the old state closed (:class:`~wal.errors.ClosedError`) while a
swap is under way waits for it and reads the new state; a scan in progress
goes on after its last key from the new state (each key once, in order); a
``view()`` open across the swap is closed (take a new one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from typing import TypeVar

from kvstore.state import State
from wal.errors import ClosedError

T = TypeVar("T")


class ServedState:
    """The state reads go to (module docstring); ``name`` is how errors name
    the replica."""

    def __init__(self, state: State, name: str) -> None:
        self.current = state
        self._name = name
        self._swap = threading.Condition()  # held while the state is swapped
        self._swapping = False
        self._closed = False

    def swap(self, replace: Callable[[], State]) -> State:
        """Close the current state and install ``replace()``'s (reads wait
        meanwhile); return the new state."""
        with self._swap:
            self._swapping = True
        try:
            self.current.close(sync=False)  # waits for reads in flight; later ones wait for the swap
            state = replace()
            with self._swap:
                self.current = state
            return state
        finally:
            with self._swap:
                self._swapping = False
                self._swap.notify_all()

    def close(self) -> State:
        """No more reads: wake readers waiting for a swap (they get
        ClosedError); return the state, for the caller to close or hand on."""
        with self._swap:
            self._closed = True
            self._swap.notify_all()
        return self.current

    def _after_swap(self, used: State) -> State:
        """The state to read after ``used`` raised ClosedError: the new one
        once a swap is done; ClosedError when the replica itself closed."""
        with self._swap:
            while self._swapping and not self._closed:
                self._swap.wait()
            if self._closed or self.current is used:
                raise ClosedError(f"the replica {self._name} is closed")
            return self.current

    def read(self, fn: Callable[[State], T]) -> T:
        """``fn(state)``, again on the new state if a swap closed the old one."""
        state = self.current
        while True:
            try:
                return fn(state)
            except ClosedError:
                state = self._after_swap(state)

    def get(self, key: bytes, default: bytes | None) -> bytes | None:
        try:
            return self.current.get(key, default)
        except ClosedError:
            return self.read(lambda s: s.get(key, default))

    def scan(self, lo: bytes, hi: bytes | None, reverse: bool) -> Generator[tuple[bytes, bytes], None, None]:
        state = self.current
        while True:
            try:
                for key, value in state.expiring_reads.scan(lo, hi, reverse):
                    if reverse:
                        hi = key
                    else:
                        lo = key + b"\x00"
                    yield key, value
                return
            except ClosedError:
                state = self._after_swap(state)
