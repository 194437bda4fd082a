"""An archive's timelines (:mod:`wal.timeline`; where they lie:
:mod:`kvstore.archive.layout`): which it holds, each one's lineage, the one a
reader follows, and the fence an archiver checks before it ships.

The timeline a reader follows (``timeline=`` of
:class:`~kvstore.archive.reader.ArchiveReader`, of ``kvstore.restore`` and of
``walkv restore --timeline``, as PostgreSQL's ``recovery_target_timeline``):

* None or ``"latest"`` (the default): the one with the highest number, as
  numbers only grow along a history (a newer writer's is higher). Two with
  that number and different uids were begun by two writers nobody
  coordinated (two promotions of replicas of one store): neither is newer,
  so the reader refuses (:class:`~wal.errors.ArchiveError` naming both)
  rather than pick one at random; the user gives ``"N:UID"``. (An archiver
  never adds the second: the first fences it, :meth:`ArchiveTimelines.fence`.)
* ``N`` (an int, or its text): timeline ``N``, refused the same way when two have it;
* ``"N:UID"`` (the uid in hex, as ``walkv archive-ls`` shows it), a
  :class:`~wal.timeline.TimelineStart` or a
  :class:`~kvstore.archive.layout.TimelineId`: exactly that one.

The choice is made again at each read from a fresh listing, so a reader
following the latest (a replica of the archive) moves to a new timeline as
soon as its history object is there. Lineages are read once per reader: a
history object never changes.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from kvstore.archive.layout import (
    ROOT_TIMELINE,
    WAL_DIR,
    TimelineId,
    decode_lineage,
    history_object_name,
    parse_history_object_name,
    parse_timeline_name,
)
from kvstore.archive.target import ArchiveTarget
from wal.errors import ArchiveError, CorruptionError, Damage
from wal.fs import FileInfo
from wal.timeline import ROOT, History, TimelineStart, fork_point, timeline_at

TimelineChoice = int | str | TimelineStart | TimelineId | None
"""What ``timeline=`` takes (module docstring)."""

_CHOICE_RE = re.compile(r"(\d+)(?::([0-9a-fA-F]{1,16}))?")


def parse_choice(value: TimelineChoice) -> int | TimelineId | None:
    """``timeline=`` as a number, an exact timeline or None (the latest);
    ValueError for anything else."""
    if value is None or value == "latest":
        return None
    if isinstance(value, TimelineStart):
        return TimelineId.of(value)
    if isinstance(value, TimelineId):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"a timeline is numbered from 1, not {value}")
        return value
    m = _CHOICE_RE.fullmatch(value.strip()) if isinstance(value, str) else None
    if m is None or int(m.group(1)) < 1:
        raise ValueError(f"timeline must be 'latest', a number N or 'N:UID' (the uid in hex, as `walkv "
                         f"archive-ls` shows it), not {value!r}")
    return int(m.group(1)) if m.group(2) is None else TimelineId(int(m.group(1)), int(m.group(2), 16))


class Listed(NamedTuple):
    """One listing of ``wal/``: timeline 1's objects are among ``infos``;
    ``histories`` have a history object, ``directories`` log objects."""

    infos: list[FileInfo]
    histories: set[TimelineId]
    directories: set[TimelineId]

    @property
    def timelines(self) -> set[TimelineId]:
        """Every timeline the archive holds (timeline 1 always: the root of every lineage)."""
        return {ROOT_TIMELINE} | self.histories | self.directories


class Fence(NamedTuple):
    """A newer timeline of the archive left the shipper's at ``fork_lsn``:
    ``mine`` and ``theirs`` are the timelines of the two histories after it."""

    fork_lsn: int
    mine: TimelineStart
    theirs: TimelineStart


class ArchiveTimelines:
    """The timelines of the archive at ``target`` of store ``store_id`` ("": not compared)."""

    def __init__(self, target: ArchiveTarget, store_id: str) -> None:
        self.target = target
        self.store_id = store_id
        self._lineages: dict[TimelineId, History] = {ROOT_TIMELINE: ROOT}

    def listed(self) -> Listed:
        infos = self.target.list(WAL_DIR)
        histories, directories = set(), set()
        for info in infos:
            if info.is_dir:
                tid = parse_timeline_name(info.name)
                if tid is not None:
                    directories.add(tid)
            else:
                tid = parse_history_object_name(info.name)
                if tid is not None:
                    histories.add(tid)
        return Listed(infos, histories, directories)

    def lineage(self, tid: TimelineId) -> History:
        """Timeline ``tid``'s lineage, from its history object (timeline 1:
        :data:`~wal.timeline.ROOT`); a missing or damaged one is
        :class:`CorruptionError`."""
        found = self._lineages.get(tid)
        if found is None:
            name = history_object_name(tid)
            shown = self.target.display(self.target.path(WAL_DIR, name))
            data = self.target.read(WAL_DIR, name)
            if data is None:
                raise CorruptionError(
                    f"the archive holds {tid} but not its history object, which is written before its first "
                    "log object: its lineage is unknown", kind=Damage.MISSING, path=shown, offset=0,
                    hint="`walkv archive-verify URI` lists what else is missing; while the store's log still "
                         "holds this timeline, archiving it again writes the object")
            found = self._lineages[tid] = decode_lineage(data, tid, self.store_id, shown)
        return found

    def follow(self, choice: int | TimelineId | None, listed: Listed | None = None) -> History:
        """The lineage a reader follows for ``choice`` (:func:`parse_choice`; module docstring)."""
        listed = self.listed() if listed is None else listed
        held = listed.timelines
        if isinstance(choice, TimelineId):
            if choice not in held:
                raise ArchiveError(f"the archive {self.target.uri} holds no {choice}; it holds "
                                   f"{_names(held)} (`walkv archive-ls URI` lists them)")
            return self.lineage(choice)
        number = max(t.timeline for t in held) if choice is None else choice
        tops = sorted(t for t in held if t.timeline == number)
        if not tops:
            raise ArchiveError(f"the archive {self.target.uri} holds no timeline {number}; it holds {_names(held)}")
        if len(tops) > 1:
            raise ArchiveError(
                f"the archive {self.target.uri} holds {len(tops)} timelines numbered {number} ({_names(tops)}): "
                "two writers of the store began them without coordinating, and neither is newer; choose one "
                f"with timeline='{number}:UID' (walkv restore --timeline {number}:UID)")
        return self.lineage(tops[0])

    def fence(self, history: History, last: int, listed: Listed | None = None) -> Fence | None:
        """Where the archive fences a writer whose log holds LSNs up to
        ``last`` along ``history``: the earliest LSN at which a timeline of
        the archive not older than the writer's (numbered above its newest,
        or with that number and another uid) left ``history``; None when
        no such timeline left it by ``last`` (layout: fencing)."""
        listed = self.listed() if listed is None else listed
        ours = history[-1]
        mine = {TimelineId.of(s) for s in history}
        found: Fence | None = None
        for tid in listed.timelines - mine:
            if tid.timeline < ours.timeline:
                continue
            theirs = self.lineage(tid)
            fork = fork_point(history, last, theirs)
            if fork is not None and (found is None or fork < found.fork_lsn):
                found = Fence(fork, timeline_at(history, fork + 1), timeline_at(theirs, fork + 1))
        return found


def _names(tids: set[TimelineId] | list[TimelineId]) -> str:
    return ", ".join(f"{t.timeline}:{t.uid:x}" if t.uid else str(t.timeline) for t in sorted(tids))


__all__ = ["ArchiveTimelines", "Fence", "Listed", "TimelineChoice", "parse_choice"]
