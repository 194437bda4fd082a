"""Child process of tests/test_expiry_kill.py: writes keys that expire soon
(TTLs of 5..85 ms, keys under 30 ms leases that are kept alive or revoked)
and plain keys from three threads with sync="always", while the sweeper
deletes expired keys every 2 ms, until it is killed.

    python tests/expiry_child.py STORE

Once a put returns (durable), the thread writes ``"<lsn> <key hex> <value
hex>\\n"`` to stdout with one ``os.write`` (atomic on a pipe): a line is
printed only for an acknowledged write.
"""

from __future__ import annotations

import os
import sys
import threading

import kvstore


def main() -> None:
    path = sys.argv[1]
    db = kvstore.open(path, sync="always", segment_bytes=256 << 10, map_size=1 << 20, sweep_interval=0.002)
    os.write(1, b"ready\n")
    run = os.getpid()

    def ack(lsn: int, key: bytes, value: bytes) -> None:
        os.write(1, b"%d %s %s\n" % (lsn, key.hex().encode(), value.hex().encode()))

    def ttl_keys() -> None:
        i = 0
        while True:
            i += 1
            key, value = b"t%02d" % (i % 50), b"%d:%d" % (run, i)
            ack(db.put(key, value, ttl=0.005 + (i % 9) * 0.01), key, value)

    def leased_keys() -> None:
        i = 0
        while True:
            i += 1
            lease = db.grant(0.03)
            try:
                for j in range(3):
                    key, value = b"l%d%d" % (i % 4, j), b"%d:%d" % (run, i)
                    ack(db.put(key, value, lease=lease), key, value)
                if i % 3 == 0:
                    db.revoke(lease)
                elif i % 3 == 1:
                    lease.keepalive()
            except kvstore.LeaseNotFoundError:
                pass  # it ran out first: nothing was written

    def plain_keys() -> None:
        i = 0
        while True:
            i += 1
            key, value = b"p%02d" % (i % 20), b"%d:%d" % (run, i)
            ack(db.put(key, value), key, value)

    threads = [threading.Thread(target=f, daemon=True) for f in (ttl_keys, leased_keys, plain_keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
