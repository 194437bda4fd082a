"""Child process of tests/test_replica.py: writes batches that keep an
invariant to a store with sync="always", until killed or ``COUNT`` batches.

    python tests/replica_writer.py STORE COUNT      # COUNT 0: until killed

Batch i (going on from the store's ``a`` after a restart) sets ``a`` and
``b`` to i (always equal), sets ``k<i % 40>`` to i, and every 7th deletes
``k<(i + 1) % 40>``, every 13th range-deletes ``k3..k5``. Prints ``lsn <n>``
after each 25th acknowledged batch and ``done <lsn>`` at the end.
"""

from __future__ import annotations

import os
import sys

import kvstore


def main() -> None:
    path, count = sys.argv[1], int(sys.argv[2])
    db = kvstore.open(path, sync="always", segment_bytes=64 << 10)
    i = int(db.get(b"a") or b"0")
    os.write(1, b"ready\n")
    n = 0
    while count == 0 or n < count:
        i += 1
        n += 1
        with db.batch() as b:
            b.put(b"a", b"%d" % i)
            b.put(b"k%02d" % (i % 40), b"%d" % i)
            if i % 7 == 0:
                b.delete(b"k%02d" % ((i + 1) % 40))
            if i % 13 == 0:
                b.delete_range(b"k03", b"k05")
            b.put(b"b", b"%d" % i)
        if n % 25 == 0:
            os.write(1, b"lsn %d\n" % b.lsn)
    os.write(1, b"done %d\n" % db.last_lsn)
    db.close()


if __name__ == "__main__":
    main()
