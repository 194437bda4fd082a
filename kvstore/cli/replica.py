"""``walkv replica SOURCE DIR``: run a read replica (:mod:`kvstore.replica.replica`)
until SIGINT or SIGTERM, showing its lag on stderr when it changes.

SOURCE is a store directory (its writer may be another process), an
archive (a URI or a local archive directory) or a served store (an
``http://`` or ``https://`` URL of ``walkv serve``; the bearer token comes
from the environment variable ``WALKV_TOKEN``, never the command line, where
other users could see it in the process list; ``--tls-ca`` names the CA
bundle that signed the server's certificate); DIR is the replica's own
directory (created, or reopened: it goes on from what it applied).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from kvstore.cli.common import EXIT_OK, AddCommand, CliError
from kvstore.cli.progress import Reporter
from kvstore.replica.replica import Replica, open_replica

TOKEN_VARIABLE = "WALKV_TOKEN"


def add_commands(add: AddCommand) -> None:
    p = add("replica", "run a read replica of a store, an archive or a server, showing its lag, until SIGINT",
            cmd_replica,
            description="Follow SOURCE (a store directory, an archive URI or directory, or the http:// or "
                        "https:// URL of `walkv serve`, its token in $WALKV_TOKEN) into DIR, a read "
                        "replica with its own LMDB state, until SIGINT/SIGTERM; its lag goes to stderr when it "
                        "changes. Open DIR from Python with kvstore.open_replica(SOURCE, DIR).")
    p.add_argument("source", metavar="SOURCE",
                   help="a store directory, an archive (s3://..., file://..., a directory), or a server's URL "
                        "(http://HOST:PORT, https://...; the bearer token in $WALKV_TOKEN)")
    p.add_argument("dir", metavar="DIR", help="the replica's directory (created, or reopened: it goes on)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S",
                   help="seconds between lag lines (default 1)")
    p.add_argument("--poll", type=float, default=None, metavar="S",
                   help="seconds between looks at an idle source (default: 0.002 for a store, 0.01 for a server, "
                        "1 for an archive)")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="for an https:// SOURCE: the CA bundle that signed its certificate (the token: $WALKV_TOKEN)")


def _lag_line(rep: Replica) -> str:
    lag = rep.lag
    text = f"applied LSN {rep.applied_lsn} (lag {lag.lsns} entries, {lag.seconds:.1f} s"
    if rep.rebuilds:
        text += f"; {rep.rebuilds} rebuilds from a snapshot"
    text += ")"
    if rep.last_error is not None:
        text += f"; failing: {rep.last_error}"
    return text


def server_options(source: str, tls_ca: str | None = None) -> dict[str, Any]:
    """``token`` (from ``$WALKV_TOKEN``) and ``verify`` for a served SOURCE (an
    http(s) URL); nothing for a store or an archive."""
    if not source.lower().startswith(("http://", "https://")):
        if tls_ca is not None:
            raise CliError(f"--tls-ca is for an https:// SOURCE, not {source}", code=2)
        return {}
    return {"token": os.environ.get(TOKEN_VARIABLE) or None, "verify": tls_ca if tls_ca is not None else True}


def cmd_replica(args: argparse.Namespace, rep_: Reporter) -> int:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with open_replica(args.source, args.dir, poll_interval=args.poll, **server_options(args.source, args.tls_ca)
                          ) as rep:
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
