"""One RESP connection: an asyncio protocol that parses commands with
hiredis's ``Reader``, runs them from the command table and answers them in
order.

Ordering and pipelining. Commands run in the order they arrive. A write is
handed to the store's asyncio front at once (so that the writes of a
pipeline, and of every connection, share one group commit) and its answer
waits, in this connection's queue of answers, until the write is durable;
answers that are ready meanwhile queue behind it. A command that reads the
state (GET after a SET in the same pipeline) waits until every earlier write
of its connection is answered, and the commands after it wait with it: so a
pipeline reads its own writes, as in Redis. One wake-up of a connection
answers every write of it that finished, in one ``write`` to the socket.

Bad input. A frame hiredis cannot parse, a command that is not an array of
strings, a request larger than :attr:`RespLimits.max_request_bytes` (16
KiB before AUTH when the server has tokens) or of more than
:attr:`RespLimits.max_args` arguments gets ``-ERR Protocol error: ...``
and the connection is closed; nothing of it ran (the commands before it in
the same pipeline did, as in Redis).

Slow clients. A client that does not read its answers fills the socket's
buffer; the transport then pauses this protocol's writing and the connection
stops reading its commands until the buffer drains, so one slow reader
holds only its own buffer, never the loop. A connection with more than
:attr:`RespLimits.max_pending_replies` answers waiting for writes is paused
the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

import hiredis

from kvstore.entry.codec import MAX_KEY_BYTES, OP_KEYSPACE, OP_PUT, PlainPuts, pack_ops
from kvstore.entry.conditions import Decided, GroupSoFar
from kvstore.server.auth import OPEN, READ, ROLE_NAMES, WRITE
from kvstore.server.resp.keyspace_feed import EVERY_OP
from kvstore.server.resp.keyview import EntryView, StateView
from kvstore.server.resp.notify import Span
from kvstore.server.resp.replies import OK, RespError, bulk_or_null, encode, error
from kvstore.server.resp.served import Served
from kvstore.server.resp.session import Compute, Format, ViewFn
from kvstore.server.resp.table import LOOKUP, Command
from kvstore.server.resp.transactions import Watching, queue
from wal.errors import ClosedError, ReadOnlyError, ReplicaError, WalkvError
from wal.segment import Payload

logger = logging.getLogger("kvstore.server.resp")

_EMPTY: Final = pack_ops([])
_IN_MULTI: Final = frozenset(("exec", "discard", "multi", "watch", "quit", "reset"))
"""Commands that run at once inside MULTI (the others are queued)."""
_IN_SUBSCRIBED: Final = frozenset(("subscribe", "psubscribe", "unsubscribe", "punsubscribe", "ping", "quit", "reset"))
"""Commands a RESP2 connection with subscriptions may run (Redis's rule)."""
_SUBCOMMANDS: Final = frozenset(("client", "command", "config", "pubsub"))
_BATCH_SPANS: Final[tuple[Span, ...]] = ((None, EVERY_OP),)
READONLY: Final = "READONLY You can't write against a read only replica."


def error_for(exc: BaseException) -> bytes:
    """The error reply for an exception a command or its write raised."""
    if isinstance(exc, RespError):
        return error(exc.message)
    if isinstance(exc, ReadOnlyError):
        return error(READONLY)
    if isinstance(exc, ReplicaError):  # a replica that may not answer reads yet: Redis's word for it
        return error(f"MASTERDOWN {exc}")
    if isinstance(exc, ClosedError):
        return error("ERR the store is closed (the server is stopping); retry on another connection")
    if isinstance(exc, (WalkvError, ValueError, TypeError)):
        return error(f"ERR {exc}")
    logger.error("walkv RESP: internal error", exc_info=exc)
    return error("ERR internal error in the walkv server (logged); this is a bug")


class RespConnection(asyncio.Protocol):
    """One client's connection (module docstring); a :class:`~kvstore.server.resp.session.Session`."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.id = served.next_id()
        self.db = 0
        self.view: StateView = served.view(0)
        self.resp3 = False
        self.role = served.open_role
        self.name: bytes | None = None
        self.lib: dict[str, bytes] = {}
        self._multi: Any = None
        self.channels: dict[bytes, None] = {}
        self.patterns: dict[bytes, None] = {}
        self._ordinary = True  # no MULTI open, not in RESP2's subscribed mode: the fast path of _dispatch
        self._plain_puts = self.role >= WRITE  # ordinary, and SET may run: _process's own path for it
        self._plain_reads = self.role >= READ and served.read_check is None  # the same for GET (unchecked reads)
        self.watching: Watching | None = None
        self.last_lsn = 0
        self.created = time.time()
        self.peer = "?"
        self._reader = hiredis.Reader()
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # answers ready while no write's answer waits before them
        self._pending: deque[Any] = deque()  # from the first answer that waits: bytes, or (future, Format, n)
        self._batch: list[list] = []  # puts not yet logged (put), their answers, database, size
        self._batch_answers: list[bytes] = []
        self._batch_db = 0
        self._batch_plain = True
        self._batch_bytes = 0
        self._batch_limit = served.max_payload - 64 * 1024
        self._command: Command | None = None  # the command running, and its arguments
        self._cmd: list[bytes] = []
        self._held: tuple[Command | None, list[bytes]] | None = None  # the command waiting for this connection's writes
        self._paused = 0  # why reading is paused: bits of _SLOW_READER, _TOO_MANY
        self._quitting = False
        self._submit = served.front.submit
        self._pubsub = served.pubsub
        self._max_args = served.limits.max_args

    @property
    def multi(self) -> Any:
        """The open MULTI (:class:`~kvstore.server.resp.transactions.Multi`), or None."""
        return self._multi

    @multi.setter
    def multi(self, block: Any) -> None:
        self._multi = block
        self.recheck()

    def recheck(self) -> None:
        """The connection's mode changed (MULTI, subscriptions, protocol, role)."""
        self._ordinary = self._multi is None and (self.resp3 or not (self.channels or self.patterns))
        self._plain_puts = self._ordinary and self.role >= WRITE
        self._plain_reads = self._ordinary and self.role >= READ and self.served.read_check is None

    # -- asyncio -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        served = self.served
        served.connections_received += 1
        if len(served.clients) >= served.limits.max_connections or served.stopping:
            served.connections_rejected += 1
            self._transport.write(error("ERR max number of clients reached"))
            self._transport.close()
            return
        served.clients[self.id] = self

    def connection_lost(self, exc: Exception | None) -> None:
        self.served.clients.pop(self.id, None)
        self._transport = None
        if self.channels or self.patterns:
            self._pubsub.drop(self)

    def pause_writing(self) -> None:
        self._pause(_SLOW_READER)

    def resume_writing(self) -> None:
        self._resume(_SLOW_READER)

    def data_received(self, data: bytes) -> None:
        if b"\r\n\r\n" in data or data[:1] in (b"\r", b"\n"):
            self._feed_with_blank_lines(data)
            return
        self._reader.feed(data)
        if self._held is None:
            self._process()
        elif self._reader.len() > self.served.max_request:
            self._pause(_TOO_MANY)

    # -- running commands ------------------------------------------------------------

    def _process(self) -> None:
        reader = self._reader
        batch, answers, max_value = self._batch, self._batch_answers, self.served.max_value
        commands = 0
        try:
            while self._held is None and self._transport is not None and not self._quitting:
                cmd = reader.gets()
                if cmd is False:
                    break
                commands += 1
                if type(cmd) is not list:
                    self._dispatch(cmd)
                    continue
                n = len(cmd)
                # The hottest commands inline: GET key with no write of the connection before it
                # (run_get's case that waits for nothing); SET key value (put()'s case of one plain put)
                if (n == 2 and self._plain_reads and ((name := cmd[0]) == b"GET" or name == b"get")
                        and type(key := cmd[1]) is bytes and not batch and not self._pending):
                    self._out.append(bulk_or_null(self.view.get(key), self.resp3))
                    continue
                if (n == 3 and self._plain_puts and ((name := cmd[0]) == b"SET" or name == b"set")
                        and type(key := cmd[1]) is bytes and type(value := cmd[2]) is bytes
                        and 0 < len(key) <= MAX_KEY_BYTES and len(value) <= max_value):
                    size = len(value) + 600
                    if batch and self.db == self._batch_db and self._batch_bytes + size <= self._batch_limit:
                        self._batch_bytes += size  # (_room's common case)
                    else:
                        self._room(size)
                        batch, answers = self._batch, self._batch_answers
                    batch.append([OP_PUT, key, value])
                    answers.append(OK)
                    continue
                self._dispatch(cmd)
                batch, answers = self._batch, self._batch_answers
        except hiredis.ProtocolError as exc:
            self.served.commands += commands
            self._fail(f"ERR Protocol error: {exc}")
            return
        except MemoryError:
            self.served.commands += commands
            self._fail("ERR Protocol error: a request larger than this server takes")
            return
        self.served.commands += commands
        if self._batch:
            self._flush_batch()
        out = self._out
        if out and self._transport is not None:
            self._transport.write(b"".join(out))
            out.clear()
        if self._held is None and reader.len() > (self.served.max_request if self.role > OPEN
                                                  else self.served.limits.max_unauthenticated_bytes):
            self._fail(f"ERR Protocol error: a request of more than {reader.len()} bytes, over this server's limit")

    def _feed_with_blank_lines(self, data: bytes) -> None:
        """Feed ``data``, skipping the empty lines that stand between two
        commands, as Redis does (``redis-cli --pipe`` sends one): fed piece by
        piece, so that whether a CRLF stands at a command's boundary is
        known (the reader holds nothing unread) rather than guessed."""
        pieces = data.split(b"\r\n\r\n")
        for n, piece in enumerate(pieces):
            if n:
                piece = b"\r\n" + piece
            if n + 1 < len(pieces):
                piece += b"\r\n"
            if self._held is None and not self._reader.has_data():
                piece = piece.lstrip(b"\r\n")
            self._reader.feed(piece)
            if self._held is None:
                self._process()
            if self._transport is None or self._quitting:
                return

    def _dispatch(self, cmd: Any) -> None:
        if type(cmd) is not list or not cmd:
            raise hiredis.ProtocolError(f"expected an array of bulk strings, got {_kind(cmd)}")
        for arg in cmd:
            if type(arg) is not bytes:
                raise hiredis.ProtocolError(f"expected bulk strings as a command's arguments, got {_kind(arg)}")
        command = LOOKUP.get(cmd[0]) or LOOKUP.get(cmd[0].lower())
        n = len(cmd)
        if command is not None and self._ordinary and command.role <= self.role:
            arity = command.arity
            if n == arity or (arity < 0 and -arity <= n <= self._max_args):  # the common case, run at once
                self._run(command, cmd)
                return
        if n > self._max_args:
            raise hiredis.ProtocolError(f"a command of {n} arguments, over this server's limit of {self._max_args}")
        try:
            if command is None:
                raise RespError(_unknown(cmd))
            if not command.arity_ok(len(cmd)):
                raise RespError(f"ERR wrong number of arguments for '{command.name}' command")
            if command.role > self.role:
                if self.role == OPEN:
                    raise RespError("NOAUTH Authentication required.")
                raise RespError(f"NOPERM this token (role {ROLE_NAMES.get(self.role, '?')}) has no permissions "
                                f"to run the '{command.name}' command")
            if not self._ordinary and self.multi is None and command.name not in _IN_SUBSCRIBED:
                name = command.name + (f"|{cmd[1].decode('utf-8', 'replace').lower()}"
                                       if command.name in _SUBCOMMANDS and len(cmd) > 1 else "")
                raise RespError(f"ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / "
                                f"QUIT / RESET are allowed in this context")
            if self.multi is not None and command.name not in _IN_MULTI:
                queue(self, command.name, command.view, cmd)
                return
            self._run(command, cmd)
        except RespError as exc:
            if self.multi is not None and (command is None or command.name not in _IN_MULTI):
                self.multi.failed = True
            self.reply(error(exc.message))

    def _run(self, command: Command, cmd: list[bytes]) -> None:
        self._command, self._cmd = command, cmd
        try:
            check = self.served.read_check
            if check is not None and "readonly" in command.flags:  # (EXEC is a write: refused on a replica)
                check()
            command.run(self, cmd)
        except RespError as exc:
            self.reply(error(exc.message))
        except Exception as exc:
            self.reply(error_for(exc))

    def must_wait(self) -> bool:
        """Whether the command running must wait for this connection's
        earlier writes (then it runs again once they are answered)."""
        if self._batch:
            self._flush_batch()
        if not self._pending:
            return False
        self._held = (self._command, self._cmd)
        return True

    def _go_on(self) -> None:
        """This connection's writes are answered: run the command that waited, and the rest."""
        held, self._held = self._held, None
        if held is not None and held[0] is not None:
            self._run(held[0], held[1])
        self._process()

    # -- answering -------------------------------------------------------------------

    def reply(self, data: bytes) -> None:
        if self._batch:
            self._flush_batch()
        if self._pending:
            self._pending.append(data)
        else:
            self._out.append(data)

    def put(self, ops: list[list], answer: bytes, plain: bool) -> None:
        """A write that reads nothing (puts of the session's database: SET,
        SETEX, MSET): its ops join the connection's batch, which goes to the
        log as ONE entry, answered ``answer`` each once durable, when the
        commands read from the socket so far are run, or sooner when another
        command's answer must follow them (:meth:`_flush_batch`). So a
        pipeline's writes cost one entry, one future and one apply, as a
        batch of the embedded API does; its entry is atomic. ``plain``: the
        ops are puts without expiry."""
        self._room(len(ops[0][2]) + 600 if len(ops) == 1 else sum(len(op[2]) + 600 for op in ops))
        if len(ops) == 1:
            self._batch.append(ops[0])
        else:
            self._batch.extend(ops)
        self._batch_answers.append(answer)
        if not plain:
            self._batch_plain = False

    def _room(self, size: int) -> None:
        """Make room in the batch for one command's puts of ``size`` bytes:
        a batch of another database, or one they would take over the record
        limit, is logged first (a command's puts are never split)."""
        if self._batch:
            if self.db == self._batch_db and self._batch_bytes + size <= self._batch_limit:
                self._batch_bytes += size
                return
            self._flush_batch()
        self._batch_db = self.db
        self._batch_plain = True
        self._batch_bytes = size

    def _flush_batch(self) -> None:
        """Log the batch of puts as one entry (:meth:`put`)."""
        ops, answers = self._batch, self._batch_answers
        self._batch, self._batch_answers = [], []
        try:
            if self._batch_db:
                ops = [[OP_KEYSPACE, self.served.writable(self._batch_db)], *ops]
            elif self._batch_plain:
                ops = PlainPuts(ops)
            future = self._submit(pack_ops(ops), ops)
        except Exception as exc:  # refused at once (read-only, closed, no keyspace left): each command answers it
            self.reply(error_for(exc) * len(answers))
            return
        feed = self._pubsub.feed
        if feed is not None:
            feed.track(future, ops, _BATCH_SPANS)
        self.later(future, b"".join(answers), len(answers))

    def answer(self, value: Any) -> None:
        self.reply(encode(value, self.resp3))

    def submit(self, payload: Payload, ops: list) -> "asyncio.Future[int]":
        """Log one entry, after the connection's batch (so in command order)."""
        if self._batch:
            self._flush_batch()
        return self._submit(payload, ops)

    def later(self, future: "asyncio.Future[int]", fmt: Format, commands: int = 1) -> None:
        """Answer ``fmt`` once ``future`` (a write of ``commands`` commands,
        resolving to its LSN; 0: one command's answer that is no write, WAIT's,
        SAVE's) is done, in order."""
        if self._batch:
            self._flush_batch()
        pending = self._pending
        if self._out and self._transport is not None:
            self._transport.write(b"".join(self._out))
            self._out.clear()
        pending.append((future, fmt, commands))
        if len(pending) == 1:
            future.add_done_callback(self._on_done)
        elif len(pending) > self.served.limits.max_pending_replies:
            self._pause(_TOO_MANY)

    def _on_done(self, _future: object) -> None:
        pending = self._pending
        parts = []
        while pending:
            head = pending[0]
            if type(head) is bytes:
                parts.append(head)
                pending.popleft()
                continue
            future, fmt, commands = head
            if not future.done():
                future.add_done_callback(self._on_done)
                break
            pending.popleft()
            parts.append(self._finish(future, fmt, commands))
        transport = self._transport
        if parts and transport is not None:
            transport.write(b"".join(parts))
        if pending:
            return
        if self._quitting:
            if transport is not None:
                transport.close()
            return
        self._resume(_TOO_MANY)
        if self._held is not None:
            self._go_on()

    def _finish(self, future: "asyncio.Future[int]", fmt: Format, commands: int) -> bytes:
        if future.cancelled():
            return error("ERR the write was cancelled") * max(commands, 1)
        exc = future.exception()
        if exc is not None:
            return error_for(exc) * max(commands, 1)
        if commands:
            self.last_lsn = future.result()
        return fmt if type(fmt) is bytes else cast(Callable[[Any], bytes], fmt)(future)

    def decide(self, fn: ViewFn, cmd: list[bytes]) -> None:
        """Run ``fn`` as a write the writer decides (:class:`Decided`)."""
        db, served = self.db, self.served

        def compute(so_far: GroupSoFar) -> tuple[list, Any]:
            view = EntryView(so_far, db, served.now_us, served.max_value)
            return view.ops, fn(view, cmd)

        self.decide_entry(compute, ((cmd, EVERY_OP),))

    def decide_entry(self, compute: Compute, spans: Sequence[Span]) -> None:
        served = self.served
        if served.store.readonly:  # nothing is logged: run against the state now, refuse a write
            self._decide_now(compute)
            return
        if self.db:
            served.writable(self.db)
        decided = Decided(compute, served.max_payload)
        resp3 = self.resp3

        def fmt(future: object) -> bytes:
            if decided.error is not None:
                return error_for(decided.error)
            if decided.failed is not None:
                return error("ERR a lease this write needed is not alive (it expired or was revoked); "
                             "nothing was written")
            return encode(decided.result, resp3)

        future = self.submit(_EMPTY, decided)
        feed = self._pubsub.feed
        if feed is not None:
            feed.track(future, decided, spans)
        self.later(future, fmt)

    def _decide_now(self, compute: Compute) -> None:
        if self.must_wait():
            return
        store = self.served.store
        ops, result = compute(GroupSoFar(store._state.read, store._expiring.key_meta))
        if ops:
            raise RespError(READONLY)
        self.answer(result)

    # -- the connection's state ---------------------------------------------------------

    def select(self, db: int) -> None:
        if self._batch:
            self._flush_batch()
        self.db = db
        self.view = self.served.view(db)
        if self.watching is not None:
            self.view = _WatchingView(self.view, self.watching)

    def watch(self) -> Watching:
        if self.watching is None:
            self.watching = Watching()
            self.select(self.db)
        return self.watching

    def unwatch(self) -> None:
        if self.watching is not None:
            self.watching = None
            self.select(self.db)

    def quit(self) -> None:
        """Close once every answer before this one is written."""
        self._quitting = True
        if not self._pending:
            if self._out and self._transport is not None:
                self._transport.write(b"".join(self._out))
                self._out.clear()
            self.close()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def push(self, frame: bytes) -> None:
        """A pub/sub message (:mod:`kvstore.server.resp.pubsub`): written
        after the answers before it, never waited for; past the output
        limit the connection is dropped."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._pending:
            self._pending.append(frame)
        else:
            transport.write(frame)
        limit = self.served.limits.max_pubsub_output_bytes
        if transport.get_write_buffer_size() > limit:
            self.served.output_limit_disconnections += 1
            logger.warning("walkv RESP: client %s (%s) dropped: over %d bytes of pub/sub messages not read",
                           self.id, self.peer, limit)
            transport.abort()

    def in_flight(self) -> int:
        """Answers waiting for their writes."""
        return len(self._pending)

    def describe(self) -> str:
        """CLIENT INFO's line."""
        lib = self.lib
        return (f"id={self.id} addr={self.peer} name={(self.name or b'').decode('ascii', 'replace')} "
                f"age={int(time.time() - self.created)} db={self.db} "
                f"sub={len(self.channels)} psub={len(self.patterns)} "
                f"multi={-1 if self.multi is None else len(self.multi.queued)} "
                f"resp={3 if self.resp3 else 2} role={ROLE_NAMES.get(self.role, 'none')} "
                f"lib-name={lib.get('lib-name', b'').decode('ascii', 'replace')} "
                f"lib-ver={lib.get('lib-ver', b'').decode('ascii', 'replace')}")

    def _fail(self, message: str) -> None:
        """A protocol error: answer it after what came before, then close."""
        self._reader = hiredis.Reader()
        self._held = None
        self.reply(error(message))
        self.quit()

    def _pause(self, why: int) -> None:
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
        self._paused |= why

    def _resume(self, why: int) -> None:
        if not self._paused & why:
            return
        self._paused &= ~why
        if not self._paused and self._transport is not None:
            self._transport.resume_reading()


_SLOW_READER: Final = 1
_TOO_MANY: Final = 2


class _WatchingView(StateView):
    """A view that tells a connection's :class:`Watching` what its reads found."""

    def __init__(self, base: StateView, watching: Watching) -> None:
        super().__init__(base.db, base.reads, base.now_us)
        self._watching = watching

    def get(self, key: bytes) -> bytes | None:
        value = super().get(key)
        self._watching.saw(self.db, key, value)
        return value


def _kind(x: object) -> str:
    return "null" if x is None else type(x).__name__


def _unknown(cmd: list[bytes]) -> str:
    name = cmd[0].decode("utf-8", "replace")[:128]
    args = "".join(f"'{a.decode('utf-8', 'replace')[:128]}' " for a in cmd[1:4])
    return f"ERR unknown command '{name}', with args beginning with: {args}"
