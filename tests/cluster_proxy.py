"""The network the cluster tests control: TCP proxies on 127.0.0.1 in front
of each node and of etcd, and a mode for every link between them.

A node advertises its proxy's URL, so every connection to it (from the
other nodes and from clients) passes through its proxy; a node's
``--coordinator`` points at etcd's proxy. A link is ``(source, destination)``:
the destination is the proxy a connection arrived at; the source is the
process that opened it, found when the connection is accepted (the client
socket's inode in ``/proc/net/tcp``, then which registered process holds it
in ``/proc/PID/fd``; Linux only). A connection from any unregistered process
(the test itself) comes from :data:`CLIENT`. So a test can cut one node off
from etcd and from the other nodes, both ways, while its own clients still
reach that node (through the node's own port, which no proxy fronts).

Modes of a link, applied to new connections and at once to open ones:

* :data:`PASS`: bytes flow.
* :data:`REFUSE`: connections are accepted then reset at once, open ones
  reset (a crashed machine's port: a fast error).
* :data:`BLACKHOLE`: connections are accepted and whatever arrives is
  swallowed, nothing is answered (a dropped network: only timeouts). A
  connection that lost bytes is reset once its link passes again, as a TCP
  connection that timed out would be (never a stream with a hole in it).
* :data:`STALL`: bytes are held, in both directions, until the link passes
  again, then delivered in order (a network that stops, then resumes).

The proxies run on one asyncio loop in a daemon thread; :meth:`Network.close`
(or leaving the ``with`` block) closes every listener and connection and
stops the thread, so nothing outlives the test.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

PASS, REFUSE, BLACKHOLE, STALL = "pass", "refuse", "blackhole", "stall"
MODES = (PASS, REFUSE, BLACKHOLE, STALL)
CLIENT = "client"
ANY = "*"
CHUNK = 65536
T = TypeVar("T")


def _socket_inode(local_port: int, remote_port: int) -> str | None:
    """The inode of the IPv4 loopback socket ``127.0.0.1:local_port ->
    127.0.0.1:remote_port`` (``/proc/net/tcp``), or None."""
    local, remote = f"0100007F:{local_port:04X}", f"0100007F:{remote_port:04X}"
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1] == local and fields[2] == remote:
                    return fields[9]
    except OSError:
        return None
    return None


def _holds_socket(pid: int, inode: str) -> bool:
    target = f"socket:[{inode}]"
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


@dataclass(eq=False)
class _Connection:
    source: str
    destination: str
    downstream: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    pumps: list[asyncio.Task] = field(default_factory=list)
    broken: bool = False  # bytes of it were swallowed: reset when its link passes again
    dropped: bool = False

    def abort(self) -> None:
        """Reset both ends and stop the pumps (never the task that accepted
        it: asyncio's server logs a cancelled one as an error)."""
        self.dropped = True
        for writer in (self.downstream, self.upstream):
            if writer is not None:
                writer.transport.abort()
        for task in self.pumps:
            task.cancel()


class Network:
    """Proxies and link modes (module docstring)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cluster-proxy", daemon=True)
        self._thread.start()
        self._servers: dict[str, tuple[asyncio.AbstractServer, int]] = {}
        self._sources: dict[str, int] = {}  # name -> pid
        self._links: dict[tuple[str, str], str] = {}
        self._connections: set[_Connection] = set()
        # Done (and replaced) at every change of a mode. Awaited through asyncio.shield: a waiter
        # cancelled (its connection dropped) would otherwise cancel it under every other waiter.
        self._changed: asyncio.Future[None] = self._run(self._new_future())
        self.accepted: dict[tuple[str, str], int] = {}  # connections accepted per link, for the tests' reports

    async def _new_future(self) -> asyncio.Future[None]:
        return self._loop.create_future()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    # -- set-up ---------------------------------------------------------------------------------

    def proxy(self, destination: str, target_port: int) -> int:
        """A proxy named ``destination`` in front of ``127.0.0.1:target_port``;
        its port (chosen by the OS)."""
        async def start() -> tuple[asyncio.AbstractServer, int]:
            server = await asyncio.start_server(
                lambda r, w: self._accept(destination, target_port, r, w), "127.0.0.1", 0)
            return server, server.sockets[0].getsockname()[1]

        self._servers[destination] = self._run(start())
        return self._servers[destination][1]

    def register(self, source: str, pid: int) -> None:
        """Connections opened by process ``pid`` come from ``source`` (again
        after a restart, with the new pid)."""
        self._sources[source] = pid

    # -- modes ----------------------------------------------------------------------------------

    def mode(self, source: str, destination: str) -> str:
        """A link's mode: its own, else its source's, else its destination's, else PASS."""
        links = self._links
        return (links.get((source, destination)) or links.get((source, ANY)) or links.get((ANY, destination))
                or PASS)

    def set(self, source: str, destination: str, mode: str) -> None:
        """Set the mode of ``source -> destination`` (either may be :data:`ANY`)."""
        if mode not in MODES:
            raise ValueError(f"unknown link mode {mode!r}: one of {MODES}")
        self._run(self._set({(source, destination): mode}))

    def isolate(self, name: str, mode: str, *, keep: tuple[str, ...] = (CLIENT,)) -> None:
        """Cut ``name`` off from every other node and from etcd, both ways,
        except from the sources in ``keep`` (the test's clients, by default)."""
        changes = {(name, ANY): mode}
        changes.update(((src, name), mode) for src in [*self._sources, CLIENT] if src != name and src not in keep)
        changes.update(((src, name), PASS) for src in keep)
        self._run(self._set(changes))

    def heal(self) -> None:
        """Every link passes again (stalled bytes are delivered)."""
        self._run(self._set(None))

    async def _set(self, changes: dict[tuple[str, str], str] | None) -> None:
        if changes is None:
            self._links.clear()
        else:
            self._links.update(changes)
        for conn in list(self._connections):
            mode = self.mode(conn.source, conn.destination)
            if mode == REFUSE or (conn.broken and mode != BLACKHOLE):
                self._drop(conn)
        changed, self._changed = self._changed, self._loop.create_future()
        changed.set_result(None)

    # -- connections ----------------------------------------------------------------------------

    def _source_of(self, writer: asyncio.StreamWriter) -> str:
        peer_port = writer.get_extra_info("peername")[1]
        own_port = writer.get_extra_info("sockname")[1]
        inode = _socket_inode(peer_port, own_port)
        if inode is not None:
            for name, pid in self._sources.items():
                if _holds_socket(pid, inode):
                    return name
        return CLIENT

    async def _accept(self, destination: str, target_port: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        source = self._source_of(writer)
        link = (source, destination)
        self.accepted[link] = self.accepted.get(link, 0) + 1
        conn = _Connection(source, destination, writer)
        if self.mode(source, destination) == REFUSE:
            writer.transport.abort()
            return
        self._connections.add(conn)
        try:
            upstream_reader: asyncio.StreamReader | None = None
            while self.mode(source, destination) == STALL and not conn.dropped:
                await asyncio.shield(self._changed)
            if self.mode(source, destination) == PASS and not conn.dropped:
                try:
                    upstream_reader, conn.upstream = await asyncio.open_connection("127.0.0.1", target_port)
                except OSError:
                    return
            if conn.dropped:
                return
            pumps = [self._pump(conn, reader, lambda: conn.upstream)]
            if upstream_reader is not None:
                pumps.append(self._pump(conn, upstream_reader, lambda: conn.downstream))
            conn.pumps = list(map(asyncio.ensure_future, pumps))
            await asyncio.gather(*conn.pumps, return_exceptions=True)
        finally:
            self._drop(conn)

    async def _pump(self, conn: _Connection, reader: asyncio.StreamReader, out: Any) -> None:
        """Copy one direction, each chunk under the link's mode at the time."""
        try:
            while chunk := await reader.read(CHUNK):
                while (mode := self.mode(conn.source, conn.destination)) == STALL:
                    await asyncio.shield(self._changed)
                if mode == BLACKHOLE:
                    conn.broken = True
                    continue
                if mode == REFUSE or conn.broken or out() is None:  # refused, lost bytes, or never connected
                    break
                writer: asyncio.StreamWriter = out()
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        if not conn.dropped:
            conn.abort()

    def open_connections(self, destination: str | None = None) -> int:
        return sum(1 for c in list(self._connections) if destination in (None, c.destination))

    def report(self) -> str:
        """The links' modes, and the connections accepted on each link, for a failure's message."""
        modes = ", ".join(f"{s}->{d}: {m}" for (s, d), m in sorted(self._links.items())) or "all pass"
        accepted = ", ".join(f"{s}->{d}: {n}" for (s, d), n in sorted(self.accepted.items()))
        return f"links: {modes}; connections accepted: {accepted}; open: {self.open_connections()}"

    # -- the end --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every listener and connection and stop the loop's thread."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            self._links.clear()  # nothing waits on a stalled link any more
            for server, _ in self._servers.values():
                server.close()
            for conn in list(self._connections):
                self._drop(conn)
            self._changed.set_result(None)
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if others:  # they end by themselves now; cancel what does not within a second
                _, late = await asyncio.wait(others, timeout=1.0)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)

        self._run(shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
