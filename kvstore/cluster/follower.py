"""A follower: a store that copies its leader's log into its own, entry for
entry, and so can take over from it (:mod:`kvstore.cluster.node`).

Unlike a read replica (:mod:`kvstore.replica`), which applies its source's
entries to an LMDB state and keeps no log, a follower is a whole store: the
leader's entries are written into its own log with their own LSNs and
commit times (:meth:`kvstore.store.following.Following.append_replicated`: written, fsynced,
then applied), its history is the leader's (it begins each of the leader's
timelines where the leader did), and its own writers are refused
(:class:`~wal.errors.NotLeaderError`, :meth:`kvstore.store.following.Following.refuse_writes`).

How it reads: ``GET /v1/log/segment?from_lsn=NEXT&wait=S&replica=ME&epoch=E``
on the leader (:mod:`kvstore.server.log`), the leader's segment bytes read
with wal's record reader (:mod:`kvstore.replica.http_log`), each group of
entries appended as it arrives (bounded: :data:`GROUP_ENTRIES`,
:data:`GROUP_BYTES`). The next request is its report: ``from_lsn - 1`` is
durable here, which the leader's synchronous replicas count
(:mod:`kvstore.store.replication`). A request waits (long poll) until the
leader has something new, so a write reaches a waiting follower in one round
trip.

What it refuses, so that histories never mix (:mod:`wal.timeline`):

* a leader of another store (its store id), or one of an older epoch than
  this follower knows (a deposed leader still serving: its entries are the
  history the new leader forked from), or a node at the leader's address
  whose history has not reached the epoch it was elected at (the leader
  killed and started again from an older disk): neither's history is
  compared with this store's, so nothing is discarded for it;
* entries past a fork: when the leader's history left this store's at LSN
  F and this store holds LSNs after F (it led once, and wrote entries no
  replica confirmed), it discards them (:meth:`kvstore.store.following.Following.discard_after`,
  logging how many) and goes on on the leader's line. When its state had
  applied any of them the store must be reopened first (the state is
  rebuilt): :attr:`Follower.needs` says so and the follower stops. A
  timeline this store began after its last entry and never wrote on (it won
  an election and was killed before its first write) holds nothing to
  discard: the store takes the leader's line from its next LSN.
* a gap: when the leader's log no longer reaches this store's next LSN
  (its retention trimmed it), or it forked before the leader's first LSN,
  the store must be built again from the leader's snapshot
  (:mod:`kvstore.cluster.bootstrap`): :attr:`Follower.needs` says so.

Errors (the leader unreachable, a broken answer) are kept in
:attr:`Follower.last_error` and retried with backoff, up to a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kvstore.client.http import Http
from kvstore.replica.http_log import SegmentStream
from kvstore.store.store import KVStore
from wal.errors import LogGapError, ReplicaError, SnapshotError, WalkvError
from wal.segment import Entry
from wal.timeline import History, fork_point, history_from_json, history_until, same_timeline, timeline_at

log = logging.getLogger("walkv.cluster")

GROUP_ENTRIES = 4096
GROUP_BYTES = 8 << 20
LONG_POLL_SECONDS = 0.5
MAX_BACKOFF = 1.0


class FollowerStopped(WalkvError):
    """The follower cannot go on with this store as it is (:attr:`Follower.needs`)."""


class Follower:
    """Follows the leader :meth:`follow` names, in a thread, into ``store``
    (module docstring). ``me`` is this node's URL (its report's name).
    ``before_report(timeline)`` is called, in the follower's thread, before
    each request reports a position whose history's newest timeline is
    ``timeline`` (the node records it in etcd first:
    :meth:`kvstore.cluster.election.Elector.hold`); when it raises, the
    request is not made and is retried as after any error."""

    def __init__(self, store: KVStore, me: str, *, token: str | None = None, verify: Any = True,
                 on_stop: Callable[[str], None] | None = None,
                 before_report: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.me = me
        self._token = token
        self._verify = verify
        self._on_stop = on_stop
        self._before_report = before_report
        self._target: tuple[str, int] | None = None
        self._changed = threading.Condition()
        self._stopping = False
        self._idle = True
        self._http: Http | None = None  # the connection to the leader followed now
        self.needs: str | None = None
        """Why the store must be reopened ("reopen: ...") or built again from
        the leader ("bootstrap: ..."); the follower stopped."""
        self.last_error: BaseException | None = None
        self.leader_durable_lsn = 0
        self.on_leaders_line = False
        """Whether this store's history has been checked against the leader
        followed now (and what it held past the leader's fork discarded):
        until then its state may hold entries no leader acknowledged (it led
        once and wrote them), so its node answers no read
        (:meth:`kvstore.cluster.node.ClusterNode.check_read`)."""
        self._seen_epoch = 0  # the epoch the leader last said it leads (reported when following without one)
        self._thread = threading.Thread(target=self._run, name="walkv-follower", daemon=True)
        self._thread.start()

    def follow(self, url: str | None, epoch: int) -> None:
        """Follow the leader at ``url`` of epoch ``epoch`` (None: no leader
        now); a request to the one it followed is cut at once (that leader may
        be paused, its socket still accepting)."""
        with self._changed:
            target = None if url is None else (url, epoch)
            if target == self._target:
                return
            self._target = target
            self.on_leaders_line = False  # checked again against the new leader's history before a read
            http = self._http
            self._changed.notify_all()
        if http is not None:
            http.close()

    @property
    def idle(self) -> bool:
        """Not following (no leader to follow, or stopped): its store's position is final until it follows again."""
        return self._idle

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    # -- the loop -----------------------------------------------------------------------

    def _current(self, target: tuple[str, int]) -> bool:
        return not self._stopping and self._target == target and self.needs is None

    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._changed:
                while not self._stopping and (self._target is None or self._target[0] == self.me):
                    self._idle = True
                    self._changed.wait()
                if self._stopping:
                    self._idle = True
                    return
                target = self._target
                self._idle = False
            assert target is not None
            try:
                self._follow(*target)
                backoff = 0.0
            except FollowerStopped as exc:
                log.warning("follower %s stops: %s", self.me, exc)
                self._idle = True
                if self._on_stop is not None:
                    self._on_stop(str(exc))
                return
            except Exception as exc:  # noqa: BLE001 - kept, logged once, retried
                if self.last_error is None or str(self.last_error) != str(exc):
                    log.warning("follower %s cannot follow %s (retrying): %s", self.me, target[0], exc)
                self.last_error = exc
                backoff = min(max(backoff * 2, 0.02), MAX_BACKOFF)
                with self._changed:
                    if self._target == target and not self._stopping:
                        self._changed.wait(backoff)

    def _stop_for(self, why: str) -> None:
        self.needs = why
        raise FollowerStopped(why)

    def _follow(self, url: str, epoch: int) -> None:
        http = Http(url, token=self._token, verify=self._verify, timeout=10.0)
        with self._changed:
            if self._target != (url, epoch):
                http.close()
                return
            self._http = http
        try:
            bounds = http.request("GET", "/v1/log/bounds").json()
            sid = bounds.get("store_id")
            if sid != self.store.store_id:
                if self.store.last_lsn == 0:
                    self._stop_for(f"bootstrap: this store is new and its leader {url} is store {sid}")
                raise ReplicaError(f"the leader {url} serves store {sid}, and this node holds store "
                                   f"{self.store.store_id}: a node follows one store; give it a directory of its own")
            theirs = history_from_json(bounds.get("history"), f"{url}/v1/log/bounds")
            if theirs[-1].timeline < epoch:
                raise ReplicaError(f"{url} is on timeline {theirs[-1].timeline}, not on epoch {epoch}'s: it does "
                                   "not lead that epoch (a node started again at its address from an older disk, "
                                   "or a leader not yet begun); its history is not one to discard entries for")
            self._reconcile(theirs, int(bounds["first_lsn"]), url)
            target = (url, epoch)
            with self._changed:
                self.on_leaders_line = self._current(target)
            while self._current(target):
                self._read(http, url, epoch)
                self.last_error = None
        finally:
            with self._changed:
                self._http = None
            http.close()

    def _reconcile(self, theirs: History, leader_first: int, url: str) -> None:
        """Discard what this store holds past the leader's fork, if anything
        (module docstring)."""
        store = self.store
        fork = fork_point(store.history, store.last_lsn, theirs)
        if fork is None:
            if store.last_lsn + 1 < leader_first:
                self._stop_for(f"bootstrap: the leader {url}'s log starts at LSN {leader_first}, after this "
                               f"store's next LSN {store.last_lsn + 1} (its retention trimmed it)")
            if history_until(theirs, store.last_lsn + 1) != history_until(store.history, store.last_lsn + 1):
                store.following.discard_after(store.last_lsn, theirs)  # a timeline it began and never wrote on: none of its
            return                                           # entries to drop, the leader's line from here
        if fork + 1 < leader_first:
            self._stop_for(f"bootstrap: this store left the leader {url}'s history after LSN {fork}, before "
                           f"the leader's log starts (LSN {leader_first})")
        try:
            dropped = store.following.discard_after(fork, theirs)
        except SnapshotError as exc:
            self._stop_for(f"bootstrap: {exc}")
            raise
        log.warning("follower %s discarded %d entries after LSN %d that its leader %s does not hold",
                    self.me, dropped, fork, url)
        if store.applied_lsn > fork:
            self._stop_for(f"reopen: it discarded {dropped} entries after LSN {fork} that its state had applied")

    def _read(self, http: Http, url: str, epoch: int) -> None:
        """One request: append what it brings, group by group."""
        store = self.store
        nxt = store.last_lsn + 1
        if self._before_report is not None:
            self._before_report(max(s.timeline for s in store.history))
        try:
            stream = SegmentStream(http, url, store.store_id or "", nxt, LONG_POLL_SECONDS,
                                   params={"replica": self.me, "epoch": epoch or self._seen_epoch})
        except LogGapError:
            self._stop_for(f"bootstrap: the leader {url} no longer holds LSN {nxt} (its retention trimmed it)")
            raise  # (unreachable)
        try:
            self.leader_durable_lsn = stream.durable_lsn
            self._seen_epoch = stream.epoch
            if stream.epoch < epoch:
                raise ReplicaError(f"{url} leads epoch {stream.epoch}, not {epoch}: a deposed leader; waiting for "
                                   "the new one")
            history = stream.history
            if fork_point(store.history, store.last_lsn, history) is not None:
                self._reconcile(history, 1, url)
                return
            group: list[Entry] = []
            size = 0
            for entry in stream.take(stream.durable_lsn):
                here = timeline_at(history, entry.lsn)
                if not same_timeline(here, store.history[-1]):
                    if group:
                        store.following.append_replicated(group)
                        group, size = [], 0
                    if here.first_lsn != entry.lsn:
                        raise ReplicaError(f"{url}'s history puts LSN {entry.lsn} on {here}, which began at LSN "
                                           f"{here.first_lsn}, but this store is on {store.history[-1]} there")
                    store.start_timeline(timeline=here)
                group.append(entry)
                size += len(entry.payload)
                if len(group) >= GROUP_ENTRIES or size >= GROUP_BYTES:
                    store.following.append_replicated(group)
                    group, size = [], 0
            if group:
                store.following.append_replicated(group)
        finally:
            stream.close()
