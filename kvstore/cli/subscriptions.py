"""``walkv subscriptions``: list a store's named subscriptions, or drop one.

It reads and writes ``STORE/subscriptions/`` only (:mod:`kvstore.watch.consumers`),
so it is safe beside a running writer: a dropped subscription's log is
trimmed at the writer's next snapshot.
"""

from __future__ import annotations

import argparse
import json

import wal
from kvstore.cli.common import EXIT_OK, EXIT_PROBLEM, AddCommand, CliError, require_store
from kvstore.cli.progress import Reporter
from kvstore.watch import consumers


def add_commands(add: AddCommand) -> None:
    p = add("subscriptions", "list a store's durable subscriptions (position, lag, invalidated), or drop one",
            cmd_subscriptions)
    p.add_argument("store", metavar="STORE")
    p.add_argument("--drop", metavar="NAME", help="drop this subscription (its log is trimmed at the next snapshot)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_subscriptions(args: argparse.Namespace, rep: Reporter) -> int:
    layout = require_store(args.store)
    if args.drop is not None:
        try:
            dropped = consumers.drop(layout.root, args.drop)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        if not dropped:
            raise CliError(f"{layout.display()} has no subscription named {args.drop!r}")
        print(f"dropped the subscription {args.drop!r} of {layout.display()}")
        return EXIT_OK
    infos = consumers.infos(layout.root, wal.read_durable_lsn(layout.wal_dir) or 0)
    if args.json:
        print(json.dumps([i._asdict() for i in infos], indent=2))
    elif not infos:
        print(f"{layout.display()} has no subscriptions")
    else:
        print(f"{'name':<24} {'acked LSN':>10} {'lag LSNs':>10} {'lag bytes':>12}  invalidated")
        for i in infos:
            print(f"{i.name:<24} {i.acked_lsn:>10} {i.lag_lsns:>10} {i.lag_bytes:>12}  {i.invalidated or '-'}")
    return EXIT_PROBLEM if any(i.invalidated for i in infos) else EXIT_OK
