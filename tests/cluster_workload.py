"""The clients of a cluster test, and what they saw.

While faults are injected, threads of the test process write and read, and
record every operation with its invocation and completion time (one
monotonic clock), its outcome (ok; fail: surely not applied; info: unknown)
and what the answer said (node, epoch, LSN):

* raw writers: ``PUT /v1/kv/w/<writer>/<n>`` through httpx, each key
  written once with a unique value, to the node they believe leads (its own
  port); a 421 NotLeader answer points them to the leader. Each
  acknowledgement's ``Walkv-Epoch`` and ``Walkv-Node`` headers and LSN are
  kept: the checks need them.
* a client writer: ``kvstore.connect([every node's URL])`` (the client that
  follows the leader), alternately ``put`` and ``compare_and_set(key,
  None, value)`` on keys of its own; ``OutcomeUnknownError`` (or any error
  but a bad argument) is an unknown outcome.
* register workers, on a few registers: reads from any node with ``min_lsn``
  = the highest LSN any client saw before the read began, acknowledged or
  read at (so a read must see every write acknowledged and every state read
  before it, as linearizability wants: replicas serve reads, but only from
  the history that every node will keep), writes of unique values, and
  compare-and-sets (``POST /v1/txn``,
  expecting the value the worker last saw; 409 ConditionFailed is a
  completed cas that returned False). Their history goes to the
  linearizability checker (tests/linearizability.py); each read's node and
  ``Walkv-Lsn`` to the forked-read check.

What is surely not applied: a 421 answer and a refused connection. Anything
else that is not a 2xx (a timeout, a broken connection, a 5xx) is unknown.
"""

from __future__ import annotations

import base64
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from tests.cluster_nodes import Cluster, Node
from tests.linearizability import CAS, FAIL, INFO, OK, READ, WRITE, History, Op

REGISTERS = (b"reg/0", b"reg/1", b"reg/2")
BULK_PREFIX = b"w/"
PAUSE = 0.005  # between a worker's operations: leaves the 2 shared cores to the nodes
BACKOFF = 0.05  # after an operation that found no leader


@dataclass
class Write:
    """One write of a key nobody else writes."""

    key: bytes
    value: bytes
    via: str  # "raw", "client", "client-cas"
    status: str = INFO
    node: str | None = None  # the Walkv-Node header of the acknowledgement (a URL)
    epoch: int | None = None
    lsn: int | None = None
    sent_to: str | None = None  # the node the request went to (raw)
    invoked: float = 0.0
    completed: float | None = None
    error: str = ""


@dataclass
class Fault:
    """One injected fault: what, when, and the leader and epoch before it."""

    name: str
    at: float
    old_leader: str
    old_epoch: int
    healed: float | None = None


class Router:
    """Where a raw write goes: the node believed to lead, corrected by 421
    answers (their ``leader``) and by refused connections (the next node)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._guess = cluster.nodes[0]
        self._lock = threading.Lock()

    def leader(self) -> Node:
        with self._lock:
            return self._guess

    def follow(self, url: str | None, failed: Node) -> None:
        node = self.cluster.node(url)
        with self._lock:
            if node is not None:
                self._guess = node
            elif self._guess is failed:
                nodes = self.cluster.nodes
                self._guess = nodes[(nodes.index(failed) + 1) % len(nodes)]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Workload:
    """The client threads (module docstring); a context manager that starts
    them and stops them (joined) at the end."""

    def __init__(self, cluster: Cluster, *, raw_writers: int = 2, client_writer: bool = True,
                 register_workers: int = 3, timeout: float | None = None, seed: int = 34) -> None:
        self.cluster = cluster
        self.timeout = timeout if timeout is not None else cluster.lease_seconds + 4.0
        self.history = History()
        self.clock = self.history.clock
        self.writes: list[Write] = []
        self.faults: list[Fault] = []
        self.observed_lsn = 0  # the newest LSN any client saw acknowledged or read at
        self.router = Router(cluster)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seed = seed
        self._threads = [threading.Thread(target=self._guard, args=(self._raw_writer, i), name=f"raw-{i}", daemon=True)
                         for i in range(raw_writers)]
        if client_writer:
            self._threads.append(threading.Thread(target=self._guard, args=(self._client_writer, 0),
                                                  name="client-0", daemon=True))
        self._threads += [threading.Thread(target=self._guard, args=(self._register_worker, i), name=f"reg-{i}",
                                           daemon=True) for i in range(register_workers)]
        self.crashes: list[str] = []  # a worker that raised: a bug of the test, reported

    # -- running --------------------------------------------------------------------------------

    def start(self) -> Workload:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 30)

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _guard(self, body: Callable[[int], None], index: int) -> None:
        try:
            body(index)
        except Exception as exc:  # noqa: BLE001 - reported by the test, never swallowed
            self.crashes.append(f"{threading.current_thread().name}: {type(exc).__name__}: {exc}")

    def _observed(self, lsn: int | None) -> None:
        """A write acknowledged at ``lsn``, or a read served at it."""
        if lsn is not None:
            with self._lock:
                self.observed_lsn = max(self.observed_lsn, lsn)

    # -- what the tests wait for ------------------------------------------------------------------

    def acknowledged(self, since: float = 0.0, newer_than_epoch: int = 0) -> list[Write | Op]:
        """Raw writes (bulk and register) acknowledged after ``since`` in an
        epoch above ``newer_than_epoch`` (0: in any epoch, or none named)."""
        def newer(epoch: int | None) -> bool:
            return newer_than_epoch == 0 or (epoch or 0) > newer_than_epoch

        out: list[Write | Op] = [w for w in list(self.writes) if w.status == OK and w.via == "raw"
                                 and (w.completed or 0) > since and newer(w.epoch)]
        out += [op for op in self.history.ops() if op.status == OK and op.kind != READ
                and (op.completed or 0) > since and newer(op.meta[1])]
        return out

    def wait_progress(self, count: int = 20, timeout: float = 60.0, newer_than_epoch: int = 0) -> None:
        """Until ``count`` more writes are acknowledged (the cluster serves again)."""
        since, deadline = self.clock(), time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.crashes:
                raise AssertionError(f"a client thread failed: {self.crashes}")
            if len(self.acknowledged(since, newer_than_epoch)) >= count:
                return
            time.sleep(0.05)
        raise AssertionError(f"fewer than {count} writes acknowledged in {timeout:.0f} s (epoch above "
                             f"{newer_than_epoch}): {self.cluster.statuses()}\n{self.cluster.logs()}")

    def fault(self, name: str, old_leader: Node, old_epoch: int) -> Fault:
        fault = Fault(name, self.clock(), old_leader.name, old_epoch)
        self.faults.append(fault)
        return fault

    def failover_seconds(self, fault: Fault) -> float | None:
        """From the fault to the first write acknowledged in a newer epoch."""
        times = [w.completed or 0.0 for w in self.acknowledged(fault.at, fault.old_epoch)]
        return min(times) - fault.at if times else None

    # -- raw HTTP ---------------------------------------------------------------------------------

    def _raw_write(self, http: httpx.Client, path: str, **request: Any) -> tuple[str, httpx.Response | None, Node,
                                                                              str]:
        """POST/PUT to the believed leader: (outcome, answer, node, error)."""
        node = self.router.leader()
        try:
            resp = http.request(url=node.direct + path, **request)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never sent
            self.router.follow(None, node)
            return FAIL, None, node, f"{type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:
            self.router.follow(None, node)
            return INFO, None, node, f"{type(exc).__name__}: {exc}"
        if resp.status_code == 421:
            error = _error(resp)
            self.router.follow(error.get("leader"), node)
            return FAIL, resp, node, f"421 {error.get('type')}"
        if resp.is_success or resp.status_code == 409:
            return OK, resp, node, ""
        if 400 <= resp.status_code < 500:
            return FAIL, resp, node, f"{resp.status_code} {resp.text[:200]}"
        return INFO, resp, node, f"{resp.status_code} {resp.text[:200]}"

    def _raw_writer(self, index: int) -> None:
        with httpx.Client(timeout=self.timeout) as http:
            n = 0
            while not self._stop.is_set():
                n += 1
                key, value = b"w/%d/%d" % (index, n), b"raw-%d-%d" % (index, n)
                write = Write(key, value, "raw", invoked=self.clock())
                outcome, resp, node, write.error = self._raw_write(http, "/v1/kv/" + quote(key, safe=""),
                                                                   method="PUT", content=value)
                write.completed = self.clock() if outcome != INFO else None
                write.status, write.sent_to = outcome, node.advertise
                if outcome == OK and resp is not None:
                    write.node, write.epoch, write.lsn = _acknowledgement(resp)
                    self._observed(write.lsn)
                self.writes.append(write)
                time.sleep(PAUSE if outcome == OK else BACKOFF)

    def probe(self, node: Node, count: int = 4) -> Callable[[], None]:
        """``count`` writes sent at once straight to ``node`` (a deposed or
        paused leader: they are the first thing it answers when it runs again),
        recorded as raw writes; returns a function that waits for them."""
        def one(i: int) -> None:
            key = b"w/probe-%s-%d/%d" % (node.name.encode(), len(self.faults), i)
            write = Write(key, b"probe-" + key, "raw", invoked=self.clock(), sent_to=node.advertise)
            with httpx.Client(timeout=self.timeout + 30) as http:
                try:
                    resp = http.put(node.direct + "/v1/kv/" + quote(key, safe=""), content=write.value)
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    write.status, write.error = FAIL, str(exc)
                except httpx.HTTPError as exc:
                    write.status, write.error = INFO, str(exc)
                else:
                    write.status = OK if resp.is_success else FAIL if resp.status_code == 421 else INFO
                    write.error = "" if resp.is_success else f"{resp.status_code} {resp.text[:200]}"
                    if resp.is_success:
                        write.node, write.epoch, write.lsn = _acknowledgement(resp)
            write.completed = self.clock() if write.status != INFO else None
            self.writes.append(write)

        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
        for t in threads:
            t.start()
        time.sleep(0.2)  # sent (into the socket's buffer, when the node is stopped)
        return lambda: [t.join(self.timeout + 60) for t in threads] and None

    # -- the client that follows the leader -----------------------------------------------------------

    def _client_writer(self, index: int) -> None:
        import kvstore

        with kvstore.connect([n.advertise for n in self.cluster.nodes], timeout=self.timeout) as db:
            n = 0
            while not self._stop.is_set():
                n += 1
                key, value = b"w/c%d/%d" % (index, n), b"client-%d-%d" % (index, n)
                cas = n % 2 == 0
                write = Write(key, value, "client-cas" if cas else "client", invoked=self.clock())
                try:
                    if cas:
                        done = db.compare_and_set(key, None, value)
                        write.status = OK if done else FAIL
                        write.error = "" if done else "compare_and_set returned False"
                    else:
                        write.lsn = db.put(key, value)
                        write.status = OK
                        self._observed(write.lsn)
                    write.completed = self.clock()
                except (TypeError, ValueError):
                    raise
                except Exception as exc:  # OutcomeUnknownError, or the cluster unreachable: unknown
                    write.status, write.error = INFO, f"{type(exc).__name__}: {exc}"
                self.writes.append(write)
                time.sleep(PAUSE if write.status == OK else BACKOFF)

    # -- registers -------------------------------------------------------------------------------

    def _register_worker(self, index: int) -> None:
        rng = random.Random(self._seed * 1000 + index)
        last: dict[bytes, bytes | None] = dict.fromkeys(REGISTERS)
        process = f"reg-{index}"
        with httpx.Client(timeout=self.timeout) as http:
            n = 0
            while not self._stop.is_set():
                n += 1
                key = rng.choice(REGISTERS)
                dice = rng.random()
                if dice < 0.4:
                    op = self._read(http, rng.choice(self.cluster.nodes), process, key)
                    if op.status == OK:
                        last[key] = op.result
                elif dice < 0.7:
                    op = self._write(http, process, key, b"%s-%d" % (process.encode(), n))
                    if op.status == OK:
                        last[key] = op.value
                else:
                    op = self._cas(http, process, key, last[key], b"%s-%d" % (process.encode(), n))
                    if op.status == OK and op.result:
                        last[key] = op.value[1]
                time.sleep(PAUSE if op.status == OK else BACKOFF)

    def _read(self, http: httpx.Client, node: Node, process: str, key: bytes) -> Op:
        """A read from ``node`` that must see every write acknowledged, and
        everything read, before it began."""
        min_lsn = self.observed_lsn
        pending = self.history.invoke(process, READ, key)
        try:
            resp = http.get(f"{node.direct}/v1/kv/{quote(key, safe='')}",
                            params={"min_lsn": min_lsn, "min_lsn_timeout": 2})
        except httpx.HTTPError:
            return pending.fail(node.name)  # a read that did not answer changed nothing
        if resp.status_code not in (200, 404):
            return pending.fail(node.name)
        served = int(resp.headers["Walkv-Lsn"]) if "Walkv-Lsn" in resp.headers else None
        self._observed(served)
        return pending.ok(resp.content if resp.status_code == 200 else None, node.name, served, min_lsn)

    def _write(self, http: httpx.Client, process: str, key: bytes, value: bytes) -> Op:
        pending = self.history.invoke(process, WRITE, key, value)
        outcome, resp, node, _ = self._raw_write(http, "/v1/kv/" + quote(key, safe=""), method="PUT",
                                                 content=value)
        return self._end(pending, outcome, resp, node, None)

    def _cas(self, http: httpx.Client, process: str, key: bytes, expected: bytes | None, new: bytes) -> Op:
        condition = {"key": _b64(key), "absent": True} if expected is None else \
            {"key": _b64(key), "equals": _b64(expected)}
        body = {"conditions": [condition], "ops": [{"op": "put", "key": _b64(key), "value": _b64(new)}]}
        pending = self.history.invoke(process, CAS, key, (expected, new))
        outcome, resp, node, _ = self._raw_write(http, "/v1/txn", method="POST", json=body)
        result = None if resp is None else resp.status_code != 409
        return self._end(pending, outcome, resp, node, result)

    def _end(self, pending: Any, outcome: str, resp: httpx.Response | None, node: Node, result: bool | None) -> Op:
        """An operation's end: meta = (acknowledging node URL, epoch, LSN, the node it was sent to)."""
        if outcome == FAIL:
            return pending.fail(None, None, None, node.advertise)
        if outcome == INFO or resp is None:
            return pending.info(None, None, None, node.advertise)
        acked_by, epoch, lsn = _acknowledgement(resp)
        self._observed(lsn)
        return pending.ok(result, acked_by, epoch, lsn, node.advertise)

    # -- after the faults ----------------------------------------------------------------------------

    def final_reads(self, timeout: float = 120.0) -> tuple[Node, dict[bytes, bytes]]:
        """Once every client stopped: the registers read on the leader (added
        to the history, after everything) and every bulk key with its value;
        the leader they were read on. A read the leader refuses (its lease
        lapsed on a loaded machine: an election) is made again on whoever
        leads next."""
        deadline = time.monotonic() + timeout
        while True:
            leader, _ = self.cluster.wait_followed()
            try:
                return leader, self._final_reads(leader)
            except _Refused as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"the final reads failed for {timeout:.0f} s: {exc}") from None

    def _final_reads(self, leader: Node) -> dict[bytes, bytes]:
        with httpx.Client(timeout=30) as http:
            for key in REGISTERS:
                op = self._read(http, leader, "final", key)
                if op.status != OK:
                    raise _Refused(f"the final read of {key!r} on {leader.name}: {op.status}")
            found: dict[bytes, bytes] = {}
            after = None
            while True:
                params: dict[str, Any] = {"prefix": BULK_PREFIX.decode(), "limit": 10000}
                if after is not None:
                    params["after"] = after
                page = http.get(leader.direct + "/v1/scan", params=params)
                if page.status_code != 200:
                    raise _Refused(f"scan on {leader.name}: {page.status_code} {page.text[:200]}")
                body = page.json()
                found.update((base64.b64decode(k), base64.b64decode(v)) for k, v in body["items"])
                after = body.get("after")
                if after is None:
                    return found


class _Refused(Exception):
    """A final read the leader did not answer (Workload.final_reads)."""


def _error(resp: httpx.Response) -> dict[str, Any]:
    try:
        return dict(resp.json().get("error") or {})
    except ValueError:
        return {}


def _acknowledgement(resp: httpx.Response) -> tuple[str | None, int | None, int | None]:
    """(Walkv-Node, Walkv-Epoch, LSN) of a write's answer (409: the error's LSN)."""
    epoch = resp.headers.get("Walkv-Epoch")
    try:
        body = resp.json()
    except ValueError:
        body = {}
    lsn = body.get("lsn") if resp.is_success else (body.get("error") or {}).get("lsn")
    return resp.headers.get("Walkv-Node"), int(epoch) if epoch else None, lsn
