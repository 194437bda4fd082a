"""``walkv serve STORE``: serve a store over HTTP (:mod:`kvstore.server`; the API
is docs/http-api.md)."""

from __future__ import annotations

import argparse
from typing import Any

from kvstore.cli.common import EXIT_OK, EXIT_USAGE, AddCommand, CliError
from kvstore.cli.progress import Reporter

DESCRIPTION = """\
Serve a store over HTTP (the /v1 API of docs/http-api.md: keys, keyspaces, TTLs and
leases, scans, batches, transactions, watch, subscriptions, the log for replicas,
metrics).

Once it accepts requests it prints one line on stdout, "walkv: listening on
http://HOST:PORT" (https with TLS; the real port with --listen HOST:0), and serves
until SIGTERM or SIGINT: then it stops accepting, ends watch streams and long polls,
finishes the requests in flight (at most --shutdown-timeout seconds) and closes the
store cleanly. It listens on 127.0.0.1 unless --listen says otherwise, and refuses a
non-loopback address without --tokens unless --insecure (exit code 2, a usage error).
--resp HOST:PORT also speaks the Redis protocol there, on the same store (the same
tokens, loopback rule and TLS), and prints "walkv: RESP listening on redis://HOST:PORT"
once it accepts. --cluster NAME --coordinator etcd://H:P --advertise URL makes it one
node of a cluster whose writer is elected through etcd (docs/cluster.md).
Needs the server extra: pip install 'walkv[server]'."""


def add_commands(add: AddCommand) -> None:
    p = add("serve", "serve a store over HTTP (the /v1 API: kv, scan, batch, txn, watch, log, metrics)", cmd_serve,
            description=DESCRIPTION)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("store", metavar="STORE", help="the store directory (created if missing)")
    p.add_argument("--listen", default="127.0.0.1:7379", metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:7379; PORT 0: any free port)")
    p.add_argument("--resp", metavar="HOST:PORT",
                   help="also speak the Redis protocol (RESP2/3) on this address, e.g. 127.0.0.1:6379")
    p.add_argument("--tokens", metavar="FILE", help="tokens file: `ROLE TOKEN` a line (read, write, admin)")
    p.add_argument("--tls-cert", metavar="FILE", help="TLS certificate (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="TLS private key (PEM)")
    p.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback address without --tokens")
    p.add_argument("--sync", default="always", choices=["always", "batch", "none"], help="the store's sync mode")
    p.add_argument("--max-body-bytes", type=int, help="largest request body (default: the store's largest record)")
    p.add_argument("--max-json-bytes", type=int, default=8 << 20,
                   help="largest JSON request body: get_many, batch, txn, ... (default 8 MiB)")
    p.add_argument("--max-json-items", type=int, default=250_000,
                   help="most elements of one JSON request body (default 250,000)")
    p.add_argument("--max-answer-bytes", type=int, default=8 << 20,
                   help="key and value bytes of one scan page, get_many or log answer (default 8 MiB)")
    p.add_argument("--max-streams", type=int, default=256, help="open watch streams at most (default 256)")
    p.add_argument("--max-streams-per-token", type=int,
                   help="open watch streams one token may hold (default: an equal share of --max-streams)")
    p.add_argument("--max-connections", type=int, default=1024, help="open connections at most (default 1024)")
    p.add_argument("--idle-timeout", type=float, default=15.0,
                   help="seconds a connection may idle or take to send its headers (default 15)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds SIGTERM gives requests in flight (default 10)")
    p.add_argument("--sync-replicas", type=int, default=0, metavar="K",
                   help="acknowledge a write only once K replicas hold it durably (default 0)")
    p.add_argument("--sync-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a write waits for its replicas before it fails (default 10)")
    cluster = p.add_argument_group("cluster (a writer elected through etcd; docs/cluster.md)")
    cluster.add_argument("--cluster", metavar="NAME", help="join the cluster NAME")
    cluster.add_argument("--coordinator", metavar="etcd://H:P", help="etcd's client URL")
    cluster.add_argument("--advertise", metavar="URL", help="the URL other nodes and clients reach this node at")
    cluster.add_argument("--lease-seconds", type=float, default=5.0, metavar="S",
                         help="the leader's etcd lease (default 5): a dead leader is replaced after about S s")
    cluster.add_argument("--follow-token", metavar="TOKEN",
                         help="the admin token this node follows its leader with (when the nodes have --tokens): "
                              "its reports count toward acknowledgements")


def _listen(text: str, option: str = "--listen") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise CliError(f"{option} must be HOST:PORT, not {text!r}", code=2)
    return host.strip("[]") or "127.0.0.1", int(port)


def cmd_serve(args: argparse.Namespace, rep: Reporter) -> int:
    try:
        from kvstore.server import Limits, ServeError, Tokens, serve, tls_context
    except ImportError as exc:  # aiohttp (or another of the extra) is missing
        raise CliError(f"walkv serve needs the server extra ({exc.name or exc} is not installed): "
                       f"pip install 'walkv[server]'", code=EXIT_USAGE) from None

    host, port = _listen(args.listen)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CliError("--tls-cert and --tls-key go together", code=2)
    tokens = Tokens.from_file(args.tokens) if args.tokens else None
    tls = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    limits = Limits(max_body_bytes=args.max_body_bytes, max_streams=args.max_streams,
                    max_streams_per_token=args.max_streams_per_token, max_connections=args.max_connections,
                    idle_timeout=args.idle_timeout, shutdown_timeout=args.shutdown_timeout,
                    max_json_bytes=args.max_json_bytes, max_json_items=args.max_json_items,
                    max_answer_bytes=args.max_answer_bytes)
    announce = lambda url: print(f"walkv: listening on {url}", flush=True)  # noqa: E731
    resp: dict[str, Any] = {} if not args.resp else {
        "resp": _listen(args.resp, "--resp"),
        "on_resp_listening": lambda url: print(f"walkv: RESP listening on {url}", flush=True)}
    if args.cluster is not None:
        if args.coordinator is None or args.advertise is None:
            raise CliError("--cluster needs --coordinator etcd://HOST:PORT and --advertise URL", code=EXIT_USAGE)
        if port == 0:
            raise CliError("--cluster needs a fixed port in --listen (other nodes reach it at --advertise)",
                           code=EXIT_USAGE)
        from kvstore.server.cluster import serve_cluster
        from kvstore.server.run import run_loop

        try:
            run_loop(serve_cluster(args.store, host, port, cluster=args.cluster, coordinator=args.coordinator,
                                   advertise=args.advertise, sync_replicas=args.sync_replicas,
                                   sync_timeout=args.sync_timeout, lease_seconds=args.lease_seconds,
                                   follow_token=args.follow_token, store_options={"sync": args.sync},
                                   on_listening=announce, tokens=tokens, tls=tls, insecure=args.insecure,
                                   limits=limits, **resp))
        except ServeError as exc:
            raise CliError(str(exc), code=EXIT_USAGE) from None
        return EXIT_OK
    try:
        serve(args.store, host, port, tokens=tokens, tls=tls, insecure=args.insecure, limits=limits,
              store_options={"sync": args.sync, "sync_replicas": args.sync_replicas,
                             "sync_timeout": args.sync_timeout},
              on_listening=announce, **resp)
    except ServeError as exc:  # the command line as given is refused: a usage error
        raise CliError(str(exc), code=EXIT_USAGE) from None
    return EXIT_OK
