"""What a command sees of its connection (:class:`Session`; the connection,
:class:`kvstore.server.resp.connection.RespConnection`, is one), so that the
command groups need not import the connection that calls them.

A command answers through its session, in the order commands arrived:
``answer`` (a value, encoded for the connection's protocol) or ``reply``
(bytes already encoded) at once; ``put`` for puts that read nothing (they
join the connection's batch: one log entry per pipeline); ``later`` when
its answer waits for its write; ``decide`` for a write the writer decides in log order (its view
function runs on the group's leader, against the state at its place in the
log), ``decide_entry`` for a whole MULTI/EXEC block. A command
that reads the state first asks ``must_wait``: when the connection has writes
not yet answered it returns True and the command runs again once they are (so
that a pipelined GET sees the SET before it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kvstore.entry.conditions import GroupSoFar
from kvstore.server.resp.keyview import KeyView, StateView
from kvstore.server.resp.notify import Span
from kvstore.server.resp.served import Served
from wal.segment import Payload

Format = bytes | Callable[["asyncio.Future[int]"], bytes]
"""How a write's answer is made once its future is done: the reply on
success (an error reply is made from the future's exception), or a function
of the future."""
Compute = Callable[[GroupSoFar], tuple[list, Any]]
ViewFn = Callable[[KeyView, list[bytes]], Any]
"""A command as a view function: its answer, from (and its writes to) a key view."""


class Session(Protocol):
    served: Served
    id: int
    db: int
    view: StateView
    resp3: bool
    role: int
    name: bytes | None
    lib: dict[str, bytes]
    multi: Any
    watching: Any
    last_lsn: int
    channels: dict[bytes, None]
    patterns: dict[bytes, None]

    def answer(self, value: Any) -> None: ...
    def reply(self, data: bytes) -> None: ...
    def later(self, future: "asyncio.Future[int]", fmt: Format, commands: int = 1) -> None: ...
    def put(self, ops: list[list], answer: bytes, plain: bool) -> None: ...
    def must_wait(self) -> bool: ...
    def submit(self, payload: Payload, ops: list) -> "asyncio.Future[int]": ...
    def decide(self, fn: ViewFn, cmd: list[bytes]) -> None: ...
    def decide_entry(self, compute: Compute, spans: Sequence[Span]) -> None: ...
    def select(self, db: int) -> None: ...
    def watch(self) -> Any: ...
    def unwatch(self) -> None: ...
    def quit(self) -> None: ...
    def describe(self) -> str: ...
    def push(self, frame: bytes) -> None: ...
    def recheck(self) -> None: ...
