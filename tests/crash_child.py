"""Child process of tests/test_crash_kill.py: writes to a store from several
threads with sync="always" until it is killed, printing one line per
acknowledged write.

    python tests/crash_child.py STORE RUN THREADS

Each thread t does, for i = 1, 2, ...: one atomic batch that sets (or
deletes, or range-deletes) one of its 64 keys ``t<t>/k<nn>`` and sets
``t<t>/last`` to ``b"<run>:<t>:<i>"``; once the batch returns (durable) it
writes ``"<run> <t> <i>\\n"`` to stdout with one ``os.write`` (atomic on a
pipe), so a line is printed only for an acknowledged write.
"""

from __future__ import annotations

import os
import sys
import threading

import kvstore


def main() -> None:
    path, run, nthreads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    db = kvstore.open(path, sync="always", segment_bytes=256 << 10, map_size=1 << 20)
    os.write(1, b"ready\n")

    def work(t: int) -> None:
        i = 0
        last = b"t%d/last" % t
        while True:
            i += 1
            key = b"t%d/k%02d" % (t, i % 64)
            val = b"%d:%d:%d" % (run, t, i)
            with db.batch() as b:
                if i % 11 == 0:
                    b.delete(key)
                elif i % 17 == 0:
                    b.delete_range(b"t%d/k%d" % (t, i % 7), b"t%d/k%d" % (t, i % 7 + 1))
                else:
                    # values of varying size, so that LMDB's map grows too
                    b.put(key, val + b"." * (i % 5 * 2500))
                b.put(last, val)
            os.write(1, b"%d %d %d\n" % (run, t, i))

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


if __name__ == "__main__":
    main()
