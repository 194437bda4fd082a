"""The floor of a RESP face in Python on this machine: a server that parses
commands with hiredis on uvloop, as :mod:`kvstore.server.resp` does, and only
answers (``+OK`` to a write, a 3-byte value to GET/MGET, ``:1`` to INCR),
touching no store. What it reaches is the most any Python RESP server can,
here; walkv's rate over it says what the store and durability cost.

``python -m benchmarks.resp_floor PORT`` (prints ``listening`` once it accepts).
"""

from __future__ import annotations

import asyncio
import sys

import hiredis

_VALUE = b"$3\r\nxxx\r\n"


class Floor(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.reader = hiredis.Reader()

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        out = []
        while (cmd := reader.gets()) is not False:
            name = cmd[0].upper()
            if name == b"PING":
                out.append(b"+PONG\r\n")
            elif name == b"GET":
                out.append(_VALUE)
            elif name == b"INCR":
                out.append(b":1\r\n")
            elif name in (b"CONFIG", b"MGET"):
                out.append(b"*0\r\n")
            else:
                out.append(b"+OK\r\n")
        self.transport.write(b"".join(out))


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Floor, "127.0.0.1", port, backlog=1024)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main(int(sys.argv[1])))
    except ImportError:
        asyncio.run(main(int(sys.argv[1])))
