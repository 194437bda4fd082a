"""``walkv replica SOURCE DIR``: run a read replica (:mod:`kvstore.replica.replica`)
until SIGINT or SIGTERM, showing its lag on stderr when it changes.

SOURCE is a store directory (its writer may be another process) or an
archive (a URI or a local archive directory); DIR is the replica's own
directory (created, or reopened: it goes on from what it applied).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from kvstore.cli.common import EXIT_OK, AddCommand
from kvstore.cli.progress import Reporter
from kvstore.replica.replica import Replica, open_replica


def add_commands(add: AddCommand) -> None:
    p = add("replica", "run a read replica of a store or an archive, showing its lag, until SIGINT",
            cmd_replica,
            description="Follow SOURCE (a store directory, or an archive URI or directory) into DIR, a read "
                        "replica with its own LMDB state, until SIGINT/SIGTERM; its lag goes to stderr when it "
                        "changes. Open DIR from Python with kvstore.open_replica(SOURCE, DIR).")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between lag lines (default 1)")
    p.add_argument("--poll", type=float, default=None, metavar="S",
                   help="seconds between looks at an idle source (default: 0.002 for a store, 1 for an archive)")


def _lag_line(rep: Replica) -> str:
    lag = rep.lag
    text = f"applied LSN {rep.applied_lsn} (lag {lag.lsns} entries, {lag.seconds:.1f} s"
    if rep.rebuilds:
        text += f"; {rep.rebuilds} rebuilds from a snapshot"
    text += ")"
    if rep.last_error is not None:
        text += f"; failing: {rep.last_error}"
    return text


def cmd_replica(args: argparse.Namespace, rep_: Reporter) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with open_replica(args.source, args.dir, poll_interval=args.poll) as rep:
            print(f"walkv: replica {rep.path} of {rep.source.name} (SIGINT or SIGTERM stops)", file=sys.stderr,
                  flush=True)
            shown = ""
            while True:
                line = _lag_line(rep)
                if line != shown and not args.quiet:
                    print(f"walkv: {line}", file=sys.stderr, flush=True)
                    shown = line
                if stop.wait(max(args.interval, 0.05)):
                    break
            final = _lag_line(rep)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if not args.quiet:
        print(f"walkv: stopped; {final}", file=sys.stderr)
    return EXIT_OK
