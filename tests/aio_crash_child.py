"""Child process of tests/test_aio_crash.py: durable puts from many coroutines
on one event loop (``kvstore.open_async``, sync="always") until it is killed,
printing one line per acknowledged put.

    python tests/aio_crash_child.py STORE RUN COROUTINES

Coroutine c puts, for i = 1, 2, ...: ``c<c>/<i % 32>`` = ``b"<run>:<c>:<i>"``
(a value of varying size, so that groups and LMDB's map vary), and once the
put's future resolved (durable and applied) writes ``"<run> <c> <i> <lsn>\\n"``
to stdout with one ``os.write`` (atomic on a pipe): a line is printed only
for an acknowledged put, with the LSN it was acknowledged at.
"""

from __future__ import annotations

import asyncio
import os
import sys

import kvstore


async def main() -> None:
    path, run, coroutines = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    async with kvstore.open_async(path, sync="always", segment_bytes=256 << 10, map_size=1 << 20) as adb:
        os.write(1, b"ready\n")

        async def work(c: int) -> None:
            i = 0
            while True:
                i += 1
                lsn = await adb.put(b"c%d/%02d" % (c, i % 32), b"%d:%d:%d" % (run, c, i) + b"." * (i % 7 * 300))
                os.write(1, b"%d %d %d %d\n" % (run, c, i, lsn))

        await asyncio.gather(*(work(c) for c in range(coroutines)))


if __name__ == "__main__":
    asyncio.run(main())
