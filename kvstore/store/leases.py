"""Leases, as etcd has them: ``lease = db.grant(ttl)``; keys put with
``lease=lease`` live as long as it does; :meth:`Lease.keepalive` extends it by
its TTL; ``db.revoke(lease)`` deletes every key attached to it in one log
entry, and so does the lease running out (the sweeper's entry). A lock that
dies with its holder::

    lease = db.grant(10)
    with lease.keep_alive():                        # a thread renews it every ttl/3
        if db.compare_and_set(b"lock:42", None, b"me"):   # (a CAS put under the lease:
            ...                                           #  t.put(..., lease=lease))

What each call costs and guarantees: :mod:`kvstore.store.expiring`.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from wal.errors import ClosedError, LeaseNotFoundError, WalkvError

log = logging.getLogger("walkv.expiry")


class LeaseOwner(Protocol):
    """What a lease calls (the store)."""

    def _keepalive(self, lease_id: int, ttl_us: int) -> float: ...
    def _lease_ttl(self, lease_id: int) -> float | None: ...
    def revoke(self, lease: Lease | int) -> int: ...


class Lease:
    """A granted lease: :attr:`id` (an int, what the log names it by) and
    :attr:`granted_ttl` (seconds). Create with ``db.grant(ttl)`` (or
    ``db.lease(id)`` for one granted before)."""

    __slots__ = ("_owner", "id", "_ttl_us")

    def __init__(self, owner: LeaseOwner, lease_id: int, ttl_us: int) -> None:
        self._owner = owner
        self.id = lease_id
        self._ttl_us = ttl_us

    @property
    def granted_ttl(self) -> float:
        return self._ttl_us / 1e6

    def keepalive(self) -> float:
        """Extend the lease to now + its TTL (one durable entry); return the
        seconds it now has. :class:`LeaseNotFoundError` when it already
        expired or was revoked (its keys are gone: grant a new one)."""
        return self._owner._keepalive(self.id, self._ttl_us)

    def ttl(self) -> float | None:
        """Seconds left; None when it is no longer alive."""
        return self._owner._lease_ttl(self.id)

    def revoke(self) -> int:
        """``db.revoke(lease)``."""
        return self._owner.revoke(self)

    def keep_alive(self, every: float | None = None) -> KeepAlive:
        """Keep the lease alive from a background thread, every ``every``
        seconds (default a third of its TTL), until the returned
        :class:`KeepAlive` is stopped (or its ``with`` block ends)."""
        return KeepAlive(self, self.granted_ttl / 3 if every is None else every)

    def __repr__(self) -> str:
        return f"<walkv Lease {self.id} ttl={self.granted_ttl:g}s>"


class KeepAlive:
    """A thread that calls ``lease.keepalive()`` every ``every`` seconds
    until :meth:`stop`. It stops by itself when the lease is gone or the
    store closed: :attr:`error` then says why (a keep-alive that fails
    otherwise is logged and tried again at the next beat)."""

    def __init__(self, lease: Lease, every: float) -> None:
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
            raise ValueError(f"every must be a positive number of seconds, not {every!r}")
        self.lease = lease
        self.every = float(every)
        self.error: WalkvError | None = None
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"walkv-keepalive-{lease.id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.lease.keepalive()
                self.beats += 1
            except (LeaseNotFoundError, ClosedError) as exc:
                self.error = exc
                return
            except WalkvError as exc:
                log.warning("keep-alive of lease %d failed: %s", self.lease.id, exc)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop beating (the lease then runs out at its TTL unless revoked)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> KeepAlive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
