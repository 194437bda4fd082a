"""The B-tree's own cost of size, beside the scale benchmark
(:mod:`benchmarks.scale`): py-lmdb alone on the scale benchmark's keys and
values, what walkv's state machine does at each size without walkv.

``python -m benchmarks.scale_lmdb 1M,10M,50M [--writemap] [--seconds S]``

At each size N: keys 0..N-1 loaded in key order (``putmulti(append=True)``,
untimed) and synced; then random overwrites of existing keys in write
transactions of 5,000 (about the size of walkv's overlay flush at 100k
non-durable puts/s), no sync; then random gets in one read transaction.
One line per size; the store is deleted before the next. ``--writemap``
opens LMDB as walkv does; its map is then a sparse file (walkv gives its
map real blocks), so each first write of a page allocates one.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time

import lmdb

from benchmarks import data, default_bench_dir
from benchmarks.scale_metrics import parse_sizes

TXN_PUTS = 5_000
_LOAD_TXN = 100_000


def measure(path: str, n: int, seconds: float, writemap: bool) -> tuple[float, float]:
    """(random overwrites/s, random gets/s) of py-lmdb holding ``n`` keys at ``path``."""
    env = lmdb.open(path, map_size=n * 400 + (64 << 20), writemap=writemap, sync=False, metasync=False)
    try:
        for start in range(0, n, _LOAD_TXN):
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(((data.key(i), data.value(i)) for i in range(start, min(n, start + _LOAD_TXN))),
                                      append=True)
        env.sync(True)
        pick, key, value = random.Random(1).randrange, data.key, data.value
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            with env.begin(write=True) as txn:
                put = txn.put
                for _ in range(TXN_PUTS):
                    i = pick(n)
                    put(key(i), value(i))
            done += TXN_PUTS
        puts = done / (time.perf_counter() - t0)
        with env.begin() as txn:
            get = txn.get
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                for _ in range(10_000):
                    get(key(pick(n)))
                done += 10_000
            gets = done / (time.perf_counter() - t0)
    finally:
        env.close()
    return puts, gets


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_lmdb", description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", help="store sizes, e.g. 1M,10M,50M")
    parser.add_argument("--writemap", action="store_true", help="open LMDB with writemap, as walkv does")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement (default 5)")
    args = parser.parse_args()
    for n in parse_sizes(args.sizes):
        path = tempfile.mkdtemp(prefix="walkv-scale-lmdb-", dir=default_bench_dir())
        try:
            puts, gets = measure(path, n, args.seconds, args.writemap)
        finally:
            shutil.rmtree(path, ignore_errors=True)
        print(f"py-lmdb{' (writemap)' if args.writemap else ''}, {n:,} keys: {puts:,.0f} random overwrites/s "
              f"(write txns of {TXN_PUTS:,}), {gets:,.0f} random gets/s (one read txn)", flush=True)


if __name__ == "__main__":
    main()
