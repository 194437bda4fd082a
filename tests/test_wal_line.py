"""wal/line.py: the group commit's waiting line: who a written or failed
group wakes, along which chain, and who stays."""

from __future__ import annotations

import threading

from wal.line import Waiter, WaitingLine


def _joined(line: WaitingLine, lsn: int, exclusive: bool = False) -> Waiter:
    """A waiter joined from a thread of its own (each thread has one)."""
    out: list[Waiter] = []
    t = threading.Thread(target=lambda: out.append(line.join(lsn, exclusive)))
    t.start()
    t.join()
    return out[0]


def _asleep(w: Waiter) -> bool:
    if w.lock.acquire(False):
        w.lock.release()
        return False
    return True


def test_an_acknowledged_group_releases_only_the_first_and_chains_the_rest():
    line = WaitingLine()
    a, b, c = (_joined(line, lsn) for lsn in (1, 2, 3))
    assert line.wake_acknowledged(2, None) == 2
    assert not _asleep(a) and _asleep(b)  # b is a's to wake
    assert a.next is b and b.next is None and a.failed is None
    assert list(line.waiters) == [c] and _asleep(c)


def test_an_exclusive_waiter_stops_the_chain_and_a_failure_releases_everyone_else():
    line = WaitingLine()
    a, x, b = _joined(line, 1), _joined(line, 1, exclusive=True), _joined(line, 2)
    assert line.wake_acknowledged(5, None) == 1  # (x waits for its turn, b behind it)
    assert list(line.waiters) == [x, b]
    error = OSError("fsync failed")
    assert line.wake_acknowledged(5, error) == 0
    assert list(line.waiters) == [x] and _asleep(x)
    assert not _asleep(b) and b.failed is error and not _asleep(a)


def test_the_leadership_goes_to_the_oldest_and_a_waiter_leaves_once():
    line = WaitingLine()
    assert not line.pass_leadership()
    a, b = _joined(line, 1), _joined(line, 2)
    assert line.pass_leadership() and a.lead and not _asleep(a)
    assert line.leave(b) and not line.waiters
    assert not line.leave(a)  # released already: it holds what its releaser set
