"""Timelines: a log's history as a line of forks, so that two histories are
never mixed (PostgreSQL's timelines are the model).

A store's history is ``(store_id, timeline, LSN)``. The log begins on
timeline 1. Whenever the entries after some LSN ``F`` are replaced by others
(a repair that cuts or fills, ``truncate_after``, a promote, a failover, a
deposed leader that discards what it wrote past the new leader's fork), the
log goes on on a NEW timeline that begins at ``F + 1``; the old one may live
on elsewhere (a replica that had it, an archive, a deposed leader), but never
again in this log.

The history (:data:`History`) is the line of timelines that leads to the
log's newest entry, oldest first: ``(timeline, first_lsn, uid)`` triples
(:class:`TimelineStart`), each timeline beginning at ``first_lsn`` and ending
where the next one begins. Which timeline an LSN is on is
:func:`timeline_at`; where two histories part is :func:`fork_point`.

Rules, and why:

* Timeline numbers only grow along a history, so the newest of several
  histories (an archive's, a restore target's) is the one with the highest
  number, as PostgreSQL's ``recovery_target_timeline = 'latest'`` picks it.
  In a cluster the number is the election's epoch (:mod:`kvstore.cluster`),
  so a deposed leader's timeline is always below its successor's.
* Every timeline but the first of a store has a random 64-bit ``uid``: two
  promotions of two replicas of one store, made with nobody coordinating
  them, both pick the next number, and only the uid tells their timelines
  apart. A timeline is identified by ``(timeline, uid)``; timeline 1 of
  every store has uid 0 (the store id already tells stores apart).
* A history's ``first_lsn`` values never decrease (a timeline may begin and
  end at the same LSN: two forks with no write between them).
* Stored in each segment's header (:mod:`wal.segment`, format version 3): the
  newest segment's header holds the log's history; an older segment's holds
  the history as it was when that segment began, which must agree with the
  newest one up to that segment's first LSN (recovery checks it). A fork
  rolls the log to a new segment, so every timeline a live log begins starts
  at a segment's first entry; a repair may place one inside an older
  segment (the LSNs it filled). Segments of format 1 and 2 are on
  :data:`ROOT`, timeline 1.
* Encoded as a count (uint16) then ``<QQQ`` per timeline, little-endian, at
  most :data:`MAX_HISTORY` of them: a header is a few hundred bytes even
  after a thousand failovers, and a longer line is refused as corruption,
  never an allocation.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from wal.errors import CorruptionError, Damage, ForkedHistoryError

MAX_HISTORY: Final = 4096
_COUNT: Final = struct.Struct("<H")
_START: Final = struct.Struct("<QQQ")


class TimelineStart(NamedTuple):
    """Timeline ``timeline`` (identified with ``uid``) begins at ``first_lsn``."""

    timeline: int
    first_lsn: int
    uid: int = 0

    def __str__(self) -> str:
        return f"timeline {self.timeline}" if self.uid == 0 else f"timeline {self.timeline} ({self.uid:016x})"


History = tuple[TimelineStart, ...]
"""A log's line of timelines, oldest first (module docstring)."""

ROOT: Final[History] = (TimelineStart(1, 1, 0),)
"""The history of a log that never forked: timeline 1 from the start."""


def same_timeline(a: TimelineStart, b: TimelineStart) -> bool:
    return a.timeline == b.timeline and a.uid == b.uid


def timeline_at(history: Sequence[TimelineStart], lsn: int) -> TimelineStart:
    """The timeline ``lsn`` is on in ``history`` (the first one for LSNs before it)."""
    found = history[0]
    for start in history[1:]:
        if start.first_lsn > lsn:
            break
        found = start
    return found


def fork_point(mine: Sequence[TimelineStart], last_lsn: int, theirs: Sequence[TimelineStart]) -> int | None:
    """The last LSN up to which ``mine`` (a log or state holding LSNs up to
    ``last_lsn``) is on the same history as ``theirs``, or None when all of
    it is (``theirs`` may go on past it). Two histories agree at an LSN when
    it is on the same timeline in both: both change course only where a
    timeline begins, so the first disagreement is at one of those LSNs."""
    for lsn in sorted({s.first_lsn for s in mine} | {s.first_lsn for s in theirs} | {1}):
        if lsn > last_lsn:
            break
        if not same_timeline(timeline_at(mine, lsn), timeline_at(theirs, lsn)):
            return lsn - 1
    return None


def check_follows(mine: Sequence[TimelineStart], last_lsn: int, theirs: Sequence[TimelineStart], *,
                  what: str, source: str, hint: str) -> None:
    """Raise :class:`ForkedHistoryError` when ``what`` (holding LSNs up to
    ``last_lsn`` along ``mine``) holds entries ``theirs`` (``source``'s
    history) does not: a mix of the two would be a state neither had."""
    fork = fork_point(mine, last_lsn, theirs)
    if fork is None:
        return
    ours, other = timeline_at(mine, fork + 1), timeline_at(theirs, fork + 1)
    raise ForkedHistoryError(
        f"{what} holds LSNs up to {last_lsn} on {ours}, but {source}'s history left that timeline "
        f"after LSN {fork} (its LSN {fork + 1} is on {other}); the two histories forked there and must "
        f"not be mixed; {hint}", mine=ours, theirs=other, fork_lsn=fork)


def extends(old: Sequence[TimelineStart], new: Sequence[TimelineStart]) -> bool:
    """Does ``new`` continue ``old`` (every timeline of ``old`` in it, unchanged)?"""
    return len(new) >= len(old) and all(a == b for a, b in zip(old, new))


def new_timeline(history: Sequence[TimelineStart], first_lsn: int, number: int | None = None) -> TimelineStart:
    """A new timeline beginning at ``first_lsn`` after ``history``: numbered
    ``number`` (an election's epoch; it must be above every number in the
    history) or the next number, with a fresh random uid."""
    top = max(s.timeline for s in history)
    if number is None:
        number = top + 1
    elif number <= top:
        raise ValueError(f"a new timeline's number must be above {top}, the highest in the history, not {number}")
    return TimelineStart(number, first_lsn, secrets.randbits(63) | 1)


def history_until(history: Sequence[TimelineStart], lsn: int) -> History:
    """``history`` as it was when ``lsn`` was the next LSN: the timelines begun by then."""
    return tuple(s for s in history if s.first_lsn <= lsn) or (history[0],)


def fork_history(history: Sequence[TimelineStart], start: TimelineStart) -> History:
    """``history`` up to ``start.first_lsn - 1``, then ``start``: what a log
    whose LSNs from ``start.first_lsn`` on are replaced goes on with
    (timelines that began after that LSN are dropped from the line)."""
    kept = [s for s in history if s.first_lsn < start.first_lsn] or [history[0]]
    if start.timeline <= max(s.timeline for s in history):
        raise ValueError(f"{start} is not above the history's highest timeline")
    return (*kept, start)


def history_after_cut(mine: History, lsn: int, last_lsn: int, follow: History | None) -> History | None:
    """The history a log on ``mine`` whose last LSN is ``last_lsn`` goes on
    on once every entry after ``lsn`` is dropped (:meth:`wal.Log.truncate_after`):
    ``mine`` forked by a new timeline from ``lsn + 1``, or, with ``follow``
    (a leader's history, which must agree with ``mine`` up to ``lsn``), the
    line ``follow`` takes from there. None when nothing changes: nothing is
    after ``lsn``, and with ``follow``, no timeline of ``mine`` begins at
    ``lsn + 1`` that ``follow`` lacks (a leader killed before its first
    write began one there, and it is given up for ``follow``'s line)."""
    if lsn >= last_lsn and (follow is None or lsn > last_lsn
                            or history_until(follow, lsn + 1) == history_until(mine, lsn + 1)):
        return None
    if follow is None:
        return fork_history(mine, new_timeline(mine, lsn + 1))
    if fork_point(mine, lsn, follow) is None:
        return history_until(follow, lsn + 1)
    raise ValueError(f"cannot follow a history that left this log's before LSN {lsn}")


def timeline_from(history: History, first_lsn: int, timeline: TimelineStart | None,
                  number: int | None) -> TimelineStart:
    """The timeline a log on ``history`` goes on on from ``first_lsn``
    (:meth:`wal.Log.start_timeline`): ``timeline`` as given (a follower
    takes its leader's), which must begin there and be numbered above the
    history's; else :func:`new_timeline`'s."""
    if timeline is None:
        return new_timeline(history, first_lsn, number)
    top = history[-1].timeline  # (numbers grow along a history: check_history)
    if timeline.first_lsn != first_lsn or timeline.timeline <= top:
        raise ValueError(f"{timeline} (from LSN {timeline.first_lsn}) cannot begin at LSN {first_lsn} after "
                         f"this log's history (highest: timeline {top})")
    return timeline


def check_history(history: Sequence[TimelineStart]) -> None:
    """ValueError unless ``history`` is well formed (module docstring)."""
    if not history or len(history) > MAX_HISTORY:
        raise ValueError(f"a history holds 1..{MAX_HISTORY} timelines, not {len(history)}")
    for a, b in zip(history, history[1:]):
        if b.timeline <= a.timeline or b.first_lsn < a.first_lsn:
            raise ValueError(f"{b} (from LSN {b.first_lsn}) cannot follow {a} (from LSN {a.first_lsn})")


def history_bytes(count: int) -> int:
    """The encoded size of a history of ``count`` timelines."""
    return _COUNT.size + count * _START.size


def encode_history(history: Sequence[TimelineStart]) -> bytes:
    check_history(history)
    return _COUNT.pack(len(history)) + b"".join(_START.pack(*s) for s in history)


def decode_history(data: bytes, path: str) -> History:
    """A history as :func:`encode_history` wrote it (the whole of ``data``);
    anything else is :class:`CorruptionError` naming ``path``."""
    if len(data) < _COUNT.size:
        raise CorruptionError("segment header's timeline history is cut short", kind=Damage.HEADER, path=path,
                              offset=0)
    (count,) = _COUNT.unpack_from(data)
    if not 0 < count <= MAX_HISTORY or len(data) != _COUNT.size + count * _START.size:
        raise CorruptionError(f"segment header's timeline history has a bad size ({count} timelines in "
                              f"{len(data)} bytes)", kind=Damage.HEADER, path=path, offset=0)
    history = tuple(TimelineStart(*_START.unpack_from(data, _COUNT.size + i * _START.size)) for i in range(count))
    try:
        check_history(history)
    except ValueError as e:
        raise CorruptionError(f"segment header's timeline history is not a line: {e}", kind=Damage.HEADER,
                              path=path, offset=0) from None
    return history


def history_to_json(history: Sequence[TimelineStart]) -> list[list[int]]:
    """The history as JSON lists ``[timeline, first_lsn, uid]`` (the HTTP API, manifests, archives)."""
    return [[s.timeline, s.first_lsn, s.uid] for s in history]


def history_from_json(value: object, where: str) -> History:
    """:func:`history_to_json`'s lists back (a ValueError naming ``where`` for anything else)."""
    try:
        history = tuple(TimelineStart(int(t), int(f), int(u)) for t, f, u in value)  # type: ignore[attr-defined]
        check_history(history)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: not a timeline history ({e})") from None
    return history
