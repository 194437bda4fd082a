"""Child processes of tests/test_trio.py: a writer, a replica and a watcher of
one store, each in its own process, each killed with SIGKILL and restarted.

    python tests/trio_child.py writer  STORE COUNT      # COUNT 0: until killed
    python tests/trio_child.py replica STORE DIR
    python tests/trio_child.py watcher STORE FROM_LSN

Each prints ``ready`` once open, then one line per event, each line ONE
``os.write`` (a pipe write under PIPE_BUF bytes is atomic, so a kill never
leaves half a line):

* writer: batch i (going on from the store's ``a`` after a restart) sets
  ``a`` and ``b`` to i (always equal), ``k<i % 40>`` to i, deletes
  ``k<(i + 1) % 40>`` every 7th, range-deletes ``k03..k05`` every 13th;
  every 5th is a transaction requiring ``a`` to be as the writer last set it (it
  holds) and
  every 11th one requiring ``a`` to be absent (it fails: no writes, its LSN
  consumed). After each acknowledged batch: ``ack LSN i`` (``ack LSN fail``
  for the failed ones); ``done LSN`` after COUNT batches.
* replica: ``kvstore.open_replica(STORE, DIR)``, then views in a loop; for
  each view at a new LSN: ``view LSN OK DIGEST`` (OK: ``a == b`` in it;
  DIGEST: :func:`digest` of all its pairs).
* watcher: ``kvstore.open(STORE, readonly=True).watch(from_lsn=FROM_LSN)``;
  the changes of one batch as one line ``batch LSN JSON`` (JSON: a list of
  ``[op, key, value, end_key]``, bytes in hex), written once the next batch
  or a progress marker shows the batch complete; ``progress LSN`` for
  progress markers. So everything up to the last LSN printed was delivered,
  and a restart resumes at that LSN + 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable

import kvstore
from kvstore.watch.watcher import PROGRESS, Change


def digest(items: Iterable[tuple[bytes, bytes]]) -> str:
    """A hash of the pairs, in key order, each length-prefixed."""
    h = hashlib.sha256()
    for key, value in sorted(items):
        h.update(b"%d:%s%d:%s" % (len(key), key, len(value), value))
    return h.hexdigest()


def change_row(c: Change) -> list:
    return [c.op, c.key.hex(), None if c.value is None else c.value.hex(),
            None if c.end_key is None else c.end_key.hex()]


def say(line: str) -> None:
    os.write(1, line.encode() + b"\n")


def writer(path: str, count: int) -> None:
    db = kvstore.open(path, sync="always", segment_bytes=64 << 10)
    a = db.get(b"a")
    i = int(a or b"0")
    say("ready")
    n = 0
    while count == 0 or n < count:
        i += 1
        n += 1
        if i % 11 == 0:
            with db.transaction() as t:
                t.require(b"a", absent=True)
                t.put(b"never", b"%d" % i)
            assert t.succeeded is False and t.lsn is not None
            say(f"ack {t.lsn} fail")
            continue
        with db.transaction() as t:
            if i % 5 == 0 and a is not None:
                t.require(b"a", equals=a)
            elif i % 5 == 0:
                t.require(b"a", absent=True)
            t.put(b"a", b"%d" % i)
            t.put(b"k%02d" % (i % 40), b"%d" % i)
            if i % 7 == 0:
                t.delete(b"k%02d" % ((i + 1) % 40))
            if i % 13 == 0:
                t.delete_range(b"k03", b"k05")
            t.put(b"b", b"%d" % i)
        assert t.succeeded and t.lsn is not None
        a = b"%d" % i
        say(f"ack {t.lsn} {i}")
    say(f"done {db.last_lsn}")
    db.close()


def replica(path: str, directory: str) -> None:
    rep = kvstore.open_replica(path, directory)
    say("ready")
    last = -1
    while True:
        with rep.view() as v:
            lsn = v.lsn
            if lsn != last:
                items = list(v.scan())
                pairs = dict(items)
                say(f"view {lsn} {int(pairs.get(b'a') == pairs.get(b'b'))} {digest(items)}")
                last = lsn
        time.sleep(0.002)


def watcher(path: str, from_lsn: int) -> None:
    db = kvstore.open(path, readonly=True)
    say("ready")
    pending: list[Change] = []

    def flush() -> None:
        if pending:
            say(f"batch {pending[0].lsn} {json.dumps([change_row(c) for c in pending])}")
            pending.clear()

    for change in db.watch(from_lsn=from_lsn, progress_every=0.05):
        if change.op == PROGRESS:
            flush()
            say(f"progress {change.lsn}")
            continue
        if pending and pending[0].lsn != change.lsn:
            flush()
        pending.append(change)


def main() -> None:
    mode, path, arg = sys.argv[1:4]
    if mode == "writer":
        writer(path, int(arg))
    elif mode == "replica":
        replica(path, arg)
    else:
        watcher(path, int(arg))


if __name__ == "__main__":
    main()
