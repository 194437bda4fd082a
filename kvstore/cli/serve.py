"""``walkv serve STORE``: serve a store over HTTP (:mod:`kvstore.server`; the API
is docs/http-api.md).

It prints one line, ``walkv: listening on http://HOST:PORT`` (``https`` with
TLS; the real port when ``--listen HOST:0``), on stdout once it accepts
requests, and serves until SIGTERM or SIGINT: then it stops accepting,
finishes the requests in flight (at most ``--shutdown-timeout`` seconds) and
closes the store cleanly. It listens on 127.0.0.1 unless ``--listen`` says
otherwise, and refuses a non-loopback address without ``--tokens`` unless
``--insecure`` (exit code 2, a usage error).

``--resp HOST:PORT`` also speaks the Redis protocol there, on the same
store (:mod:`kvstore.server.resp`; the same tokens, loopback rule and TLS),
and prints ``walkv: RESP listening on redis://HOST:PORT`` once it accepts.
"""

from __future__ import annotations

import argparse

from kvstore.cli.common import EXIT_OK, EXIT_USAGE, AddCommand, CliError
from kvstore.cli.progress import Reporter


def add_commands(add: AddCommand) -> None:
    p = add("serve", "serve a store over HTTP (the /v1 API: kv, scan, batch, txn, watch, log, metrics)", cmd_serve,
            description=__doc__)
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
    p.add_argument("--max-streams", type=int, default=256, help="open watch streams at most (default 256)")
    p.add_argument("--max-connections", type=int, default=1024, help="open connections at most (default 1024)")
    p.add_argument("--idle-timeout", type=float, default=15.0,
                   help="seconds a connection may idle or take to send its headers (default 15)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds SIGTERM gives requests in flight (default 10)")


def _listen(text: str, option: str = "--listen") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise CliError(f"{option} must be HOST:PORT, not {text!r}", code=2)
    return host.strip("[]") or "127.0.0.1", int(port)


def cmd_serve(args: argparse.Namespace, rep: Reporter) -> int:
    from kvstore.server import Limits, ServeError, Tokens, serve, tls_context

    host, port = _listen(args.listen)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CliError("--tls-cert and --tls-key go together", code=2)
    tokens = Tokens.from_file(args.tokens) if args.tokens else None
    tls = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    limits = Limits(max_body_bytes=args.max_body_bytes, max_streams=args.max_streams,
                    max_connections=args.max_connections, idle_timeout=args.idle_timeout,
                    shutdown_timeout=args.shutdown_timeout)
    try:
        serve(args.store, host, port, tokens=tokens, tls=tls, insecure=args.insecure, limits=limits,
              store_options={"sync": args.sync},
              on_listening=lambda url: print(f"walkv: listening on {url}", flush=True),
              resp=_listen(args.resp, "--resp") if args.resp else None,
              on_resp_listening=lambda url: print(f"walkv: RESP listening on {url}", flush=True))
    except ServeError as exc:  # the command line as given is refused: a usage error
        raise CliError(str(exc), code=EXIT_USAGE) from None
    return EXIT_OK
