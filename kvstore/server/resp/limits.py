"""The limits of the RESP face (each bounds what one client can make the
server hold or do)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RespLimits:
    """The RESP listener's limits. ``None`` sizes follow the store's log record limit."""

    max_connections: int = 1024
    """Open connections; one more gets ``-ERR max number of clients reached`` and is closed (as Redis does)."""
    max_request_bytes: int | None = None
    """Bytes one request (a command and its arguments) may take while it
    arrives (None: the store's largest log record plus 64 KiB); over it: an
    error, and the connection is closed."""
    max_unauthenticated_bytes: int = 16 * 1024
    """The same, before AUTH, when the server has tokens (Redis: 16 KiB before AUTH)."""
    max_args: int = 1024 * 1024
    """Arguments of one command, its name too (MSET's pairs, DEL's keys
    ...); one more: an error, and the connection is closed (Redis's
    multibulk limit, also 1024 * 1024)."""
    max_multi_commands: int = 10_000
    """Commands one MULTI may queue; past it the transaction is discarded (EXECABORT)."""
    max_reply_bytes: int = 64 * 1024 * 1024
    """Bytes of one reply that lists keys (KEYS, MGET); past it an error that says to use SCAN."""
    max_pending_replies: int = 4096
    """Replies one connection may have waiting for their writes; past it the
    server reads no more of its commands until they are answered."""
    max_pubsub_output_bytes: int = 32 * 1024 * 1024
    """Bytes of pub/sub messages a subscriber may leave unread in its
    connection's buffer; past it the connection is dropped (Redis's
    ``client-output-buffer-limit pubsub`` hard limit, 32 MiB)."""
    max_cursors: int = 10_000
    """SCAN cursors kept (the least recently used is forgotten; a forgotten cursor is an error)."""
    shutdown_timeout: float = 10.0
    """Seconds a stopping server gives commands in flight to be answered."""
