"""``walkv serve`` as a real subprocess, for black-box tests of the server.

:class:`ServedStore` starts ``python -m kvstore.cli serve STORE --listen
127.0.0.1:0`` (an ephemeral port), waits for the ``listening on URL`` line the
contract promises on stdout, and keeps draining stdout and stderr on threads
(so a chatty server never blocks on a full pipe, and a test can search
everything the process printed, e.g. for leaked tokens). A tokens file
(``ROLE TOKEN`` lines, :func:`write_tokens`) and TLS (certificates from
``trustme``, :class:`Tls`) are optional.

:meth:`ServedStore.stop` sends SIGTERM and waits for the exit code;
:meth:`ServedStore.kill` sends SIGKILL. :func:`raw_request` speaks HTTP/1.1 on
a plain socket, for requests no client library would send (unnormalised
paths, invalid percent-encoding, huge headers).
"""

from __future__ import annotations

import http.client
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO, Any

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTENING = re.compile(r"listening on (https?://\S+)")
START_TIMEOUT = 60.0


def new_token(role: str) -> str:
    """A fresh secret that is easy to grep for in logs (``tok-ROLE-<random>``)."""
    return f"tok-{role}-{secrets.token_urlsafe(18)}"


def write_tokens(path: str, tokens: dict[str, str], *, extra_lines: tuple[str, ...] = ()) -> str:
    """Write ``{role: token}`` as a tokens file (``ROLE TOKEN`` a line), with a
    comment and a blank line as the contract allows; return ``path``."""
    lines = ["# walkv tokens: ROLE TOKEN", ""]
    lines += [f"{role} {token}" for role, token in tokens.items()]
    lines += list(extra_lines)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o600)
    return path


@dataclass
class Tls:
    """A private CA and a server certificate for 127.0.0.1/localhost (trustme),
    written to files in ``directory``."""

    directory: str
    ca: Any = field(init=False)
    cert_file: str = field(init=False)
    key_file: str = field(init=False)
    ca_file: str = field(init=False)

    def __post_init__(self) -> None:
        import trustme

        self.ca = trustme.CA()
        cert = self.ca.issue_cert("127.0.0.1", "localhost")
        self.cert_file = os.path.join(self.directory, "server.pem")
        self.key_file = os.path.join(self.directory, "server.key")
        self.ca_file = os.path.join(self.directory, "ca.pem")
        cert.cert_chain_pems[0].write_to_path(self.cert_file)
        for pem in cert.cert_chain_pems[1:]:
            pem.write_to_path(self.cert_file, append=True)
        cert.private_key_pem.write_to_path(self.key_file)
        self.ca.cert_pem.write_to_path(self.ca_file)

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        return ctx

    def args(self) -> list[str]:
        return ["--tls-cert", self.cert_file, "--tls-key", self.key_file]


class _Drain(threading.Thread):
    """Reads a pipe to its end, keeping every line; ``wait_for`` blocks until
    a line matches (or the pipe ends)."""

    def __init__(self, pipe: IO[bytes]) -> None:
        super().__init__(daemon=True)
        self.pipe = pipe
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.done = False

    def run(self) -> None:
        for raw in iter(self.pipe.readline, b""):
            with self.cond:
                self.lines.append(raw.decode("utf-8", "replace"))
                self.cond.notify_all()
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str] | None:
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    m = pattern.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                if self.done or not self.cond.wait(timeout):
                    return None

    def text(self) -> str:
        with self.cond:
            return "".join(self.lines)


def serve_command(store: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "kvstore.cli", "serve", store, *args]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_serve(store: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``walkv serve`` expected to refuse to start: run it to its exit."""
    return subprocess.run(serve_command(store, *args), capture_output=True, text=True, timeout=timeout,
                          env=child_env(), cwd=ROOT, stdin=subprocess.DEVNULL)


class ServedStore:
    """One ``walkv serve`` process (see the module docstring)."""

    def __init__(self, store: str, *, tokens: dict[str, str] | None = None, tokens_file: str | None = None,
                 tls: Tls | None = None, listen: str = "127.0.0.1:0", args: tuple[str, ...] = ()) -> None:
        self.store = store
        self.tokens = dict(tokens or {})
        self.tls = tls
        cmd = ["--listen", listen]
        if tokens is not None:
            tokens_file = tokens_file or os.path.join(os.path.dirname(os.path.abspath(store)),
                                                      f"tokens-{secrets.token_hex(4)}")
            write_tokens(tokens_file, tokens)
        if tokens_file is not None:
            cmd += ["--tokens", tokens_file]
        if tls is not None:
            cmd += tls.args()
        self.argv = serve_command(store, *cmd, *args)
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=child_env(), cwd=ROOT)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.stdout = _Drain(self.proc.stdout)
        self.stderr = _Drain(self.proc.stderr)
        self.stdout.start()
        self.stderr.start()
        m = self.stdout.wait_for(LISTENING, START_TIMEOUT)
        if m is None:
            self.proc.kill()
            self.proc.wait()
            self.stdout.join(5)
            self.stderr.join(5)
            raise AssertionError(f"walkv serve did not print 'listening on': exit {self.proc.returncode}\n"
                                 f"stdout:\n{self.stdout.text()}\nstderr:\n{self.stderr.text()}")
        self.url = m.group(1).rstrip("/")
        self._sessions: dict[str | None, httpx.Client] = {}
        parts = httpx.URL(self.url)
        self.host = parts.host
        self.port = int(parts.port or (443 if parts.scheme == "https" else 80))

    # -- clients -------------------------------------------------------------------------------

    def client(self, role: str | None = None, *, token: str | None = None, **kwargs: Any) -> httpx.Client:
        """An httpx client for this server carrying ``role``'s token (or ``token``)."""
        if token is None and role is not None:
            token = self.tokens[role]
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        if self.tls is not None:
            kwargs.setdefault("verify", self.tls.client_context())
        kwargs.setdefault("timeout", 30.0)
        kwargs.setdefault("base_url", self.url)
        return httpx.Client(headers=headers, **kwargs)

    def session(self, role: str | None = None) -> httpx.Client:
        """One shared client per role (``None``: no token) for this server's
        lifetime: cheaper than a client per request (each makes an SSL
        context); closed when the server stops."""
        if role not in self._sessions:
            self._sessions[role] = self.client(role)
        return self._sessions[role]

    def async_client(self, role: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role is not None else {}
        if self.tls is not None:
            kwargs.setdefault("verify", self.tls.client_context())
        kwargs.setdefault("timeout", 30.0)
        return httpx.AsyncClient(base_url=self.url, headers=headers, **kwargs)

    def output(self) -> str:
        """Everything the process printed so far, stdout then stderr."""
        return self.stdout.text() + self.stderr.text()

    # -- ending --------------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _close_sessions(self) -> None:
        for client in self._sessions.values():
            client.close()
        self._sessions.clear()

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code (SIGKILL and fail if it does not exit in ``timeout``)."""
        self._close_sessions()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"walkv serve did not exit within {timeout}s of SIGTERM\n{self.output()}") from None
        self.stdout.join(10)
        self.stderr.join(10)
        return code

    def kill(self) -> None:
        self._close_sessions()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.stdout.join(10)
        self.stderr.join(10)

    def __enter__(self) -> ServedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()


# -- raw HTTP ---------------------------------------------------------------------------------


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def raw_request(host: str, port: int, method: str, target: str, *, headers: dict[str, str] | None = None,
                body: bytes = b"", timeout: float = 30.0) -> RawResponse:
    """Send one HTTP/1.1 request exactly as given (``target`` unnormalised,
    any bytes in header values that HTTP allows) on a new connection, and read
    the answer with the standard library's response parser."""
    head = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close",
            f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (e.g. 431) and closed before reading it all: read that answer
        resp = http.client.HTTPResponse(sock, method=method)
        resp.begin()
        payload = resp.read()
        return RawResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload)


# -- the store behind the server --------------------------------------------------------------

SUBSCRIPTION = "audit"


def seed_store(path: str, keys: int = 20) -> None:
    """A store with ``keys`` keys (``k00``..), one more write after a snapshot
    (so a snapshot file and log entries both exist), and a subscription."""
    import kvstore

    with kvstore.open(path) as db:
        for i in range(keys):
            db.put(b"k%02d" % i, b"value %d" % i)
        db.snapshot()
        db.put(b"after-snapshot", b"x")
        with db.subscribe(SUBSCRIPTION, prefix=b"k", from_lsn=1) as sub:
            sub.ack(next(sub).lsn)  # the first change (LSN 1) acknowledged


def fingerprint(path: str) -> dict[str, Any]:
    """What a request must not change, read directly from the store (the
    server stopped): every key and value, the last LSN, the snapshots and the
    subscriptions with their positions."""
    import kvstore

    with kvstore.open(path) as db:
        return {
            "items": list(db.scan()),
            "last_lsn": db.last_lsn,
            "snapshots": [s.lsn for s in db.list_snapshots()],
            "subscriptions": [(s.name, s.acked_lsn, s.invalidated) for s in db.subscriptions()],
        }
