"""A durable subscription's position is an LSN on a timeline
(kvstore/watch/subscription.py): the HA issue's fork (a repair cuts LSN 70,
the store writes 50 more entries at LSNs 70..119 on timeline 2) seen by
subscriptions acknowledged past it and behind it, reopened after the fork or
running across it, and records written before timelines."""

from __future__ import annotations

import json

import pytest

import kvstore
from kvstore.watch import consumers
from tests.test_archive_timelines import fill, fork, new, old
from wal.errors import ForkedHistoryError, SubscriptionForkedError, SubscriptionInvalidatedError


def take(sub, upto: int) -> list[tuple[int, bytes]]:
    """The changes of ``sub`` up to LSN ``upto``, each acknowledged."""
    got = []
    for change in sub:
        got.append((change.lsn, change.key))
        sub.ack(change.lsn)
        if change.lsn == upto:
            return got
    raise AssertionError(f"the subscription ended at {got[-1:]}")


AFTER_THE_FORK = [(lsn, old(lsn)) for lsn in range(61, 70)] + [(70 + i, new(i)) for i in range(50)]


def test_reopened_after_the_fork_past_it_is_invalidated_behind_it_goes_on(tmp_path):
    path = str(tmp_path / "store")
    fill(path)
    with kvstore.open(path) as db:
        with db.subscribe("past", from_lsn=1) as sub:
            take(sub, 80)
        with db.subscribe("behind", from_lsn=1) as sub:
            take(sub, 60)
    legacy = consumers._record_path(path, "legacy")  # written before timelines: no history in it
    with open(consumers._record_path(path, "past")) as f:
        rec = json.load(f)
    rec.update(name="legacy", next=[91, 0])
    del rec["history"], rec["forked"]
    with open(legacy, "w") as f:
        json.dump(rec, f)
    assert consumers.read(path, "legacy").history[-1].timeline == 1

    fork(path)
    with kvstore.open(path) as db:
        for name, acked in (("past", 80), ("legacy", 90)):
            with pytest.raises(SubscriptionForkedError) as e:
                db.subscribe(name)
            err = e.value
            assert isinstance(err, ForkedHistoryError) and isinstance(err, SubscriptionInvalidatedError)
            assert err.fork_lsn == 69 and err.mine.timeline == 1 and err.theirs.timeline == 2 and err.name == name
            text = str(err)
            assert f"up to LSN {acked} on timeline 1" in text and "after LSN 69" in text and "timeline 2" in text
            assert "from_lsn=70" in text and "drop" in text
        with pytest.raises(SubscriptionForkedError):  # invalidated for good: its record says so
            db.subscribe("past")
        infos = {s.name: s for s in db.subscriptions()}
        assert "after LSN 69" in infos["past"].invalidated and infos["behind"].invalidated is None
        with db.subscribe("behind", timeout=5) as sub:
            assert take(sub, 119) == AFTER_THE_FORK  # the new entries 70.., once each
        rec = consumers.read(path, "behind")
        assert rec.next_lsn == 120 and rec.history == db.history  # acknowledged on timeline 2
        db.drop_subscription("past")
        with db.subscribe("past", from_lsn=70, timeout=5) as sub:  # what its error says to do
            assert take(sub, 119) == AFTER_THE_FORK[9:]


def test_running_across_the_fork(tmp_path):
    """Subscriptions of a read-only process beside the writer, iterating while
    the store is repaired and written again: the one acknowledged past the
    fork is invalidated; the one behind it (which had been delivered old
    changes past it, unacknowledged) is given the new ones."""
    path = str(tmp_path / "store")
    fill(path)
    with kvstore.open(path, readonly=True) as ro:
        past = ro.subscribe("past", from_lsn=1, timeout=10)
        behind = ro.subscribe("behind", from_lsn=1, timeout=10)
        take(past, 100)
        delivered = [next(behind) for _ in range(100)]
        behind.ack(60)
        assert delivered[-1].key == old(100)
        fork(path)
        with pytest.raises(SubscriptionForkedError) as e:
            next(past)
        assert e.value.fork_lsn == 69 and e.value.theirs.timeline == 2
        first = next(behind)  # it meets the fork: delivered again from its acknowledged position
        assert (first.lsn, first.key) == (61, old(61))
        with pytest.raises(ForkedHistoryError, match="delivered again from LSN 61"):
            behind.ack(100)  # an old change, of the history the store left
        behind.ack(61)
        assert take(behind, 119) == AFTER_THE_FORK[1:]
        past.close()
        behind.close()
