"""Child process of tests/test_subscriptions.py: a consumer of a store that
another process (the test) writes, until it is killed.

    python tests/subscriber_child.py sub STORE NAME STOP     # STOP 0: until killed
    python tests/subscriber_child.py replica STORE REPLICA

``sub``: opens the store with ``readonly=True``, iterates its subscription
``NAME`` (which the test created) and, for each change, first writes
``"<lsn> <key>\\n"`` to stdout with one ``os.write`` (atomic on a pipe, so a
line is either whole or absent after a kill), then acknowledges it: a kill
between the two leaves one change delivered and not acknowledged. Ends
after acknowledging an LSN >= ``STOP``.

``replica``: opens a replica of STORE at REPLICA (which holds the store's
log while it runs), prints ``ready <applied LSN>`` and follows until killed.
"""

from __future__ import annotations

import os
import sys
import time

import kvstore


def subscriber(path: str, name: str, stop: int) -> None:
    db = kvstore.open(path, readonly=True)
    sub = db.subscribe(name, timeout=60)
    os.write(1, b"ready\n")
    for change in sub:
        os.write(1, b"%d %s\n" % (change.lsn, change.key))
        sub.ack(change.lsn)
        if stop and change.lsn >= stop:
            break
    sub.close()
    db.close()


def replica(path: str, rdir: str) -> None:
    rep = kvstore.open_replica(path, rdir)
    os.write(1, b"ready %d\n" % rep.applied_lsn)
    while True:
        time.sleep(1)


def main() -> None:
    if sys.argv[1] == "sub":
        subscriber(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "replica":
        replica(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")


if __name__ == "__main__":
    main()
