"""The write path's mutex (:mod:`wal.mutex`) keeps what the log and the overlay
rely on from ``threading.Lock``, including under ``threading.Condition``."""

from __future__ import annotations

import threading

import pytest

from wal.mutex import Mutex, condition


def test_a_mutex_is_not_reentrant_and_may_be_released_by_another_thread() -> None:
    m = Mutex()
    assert m.acquire() is True
    assert m.acquire(False) is False  # held, even by this thread
    t = threading.Thread(target=m.release)  # as a group commit's leader releases its waiters
    t.start()
    t.join()
    assert m.acquire(False) is True
    m.release()
    with pytest.raises(RuntimeError):
        m.release()  # not held


def test_a_condition_over_a_mutex_refuses_an_unheld_notify_and_times_out() -> None:
    m = Mutex()
    cond = condition(m)
    with pytest.raises(RuntimeError):
        cond.notify()  # not held: refused, as with threading.Lock
    with cond:
        assert cond.wait(0.001) is False  # nobody notifies: the wait times out...
        assert m.acquire(False) is False  # ... with the mutex held again
    assert m.acquire(False) is True
    m.release()


def test_a_notified_waiter_wakes() -> None:
    m = Mutex()
    cond = condition(m)
    state = {"waiting": False, "go": False, "woke": False}

    def waiter() -> None:
        with cond:
            state["waiting"] = True
            cond.notify()
            while not state["go"]:
                cond.wait()
            state["woke"] = True

    t = threading.Thread(target=waiter)
    with cond:
        t.start()
        while not state["waiting"]:
            cond.wait()
        state["go"] = True
        cond.notify()
    t.join(60)
    assert state["woke"] and not t.is_alive()
