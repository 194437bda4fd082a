"""``kill -9`` of ``walkv serve --resp`` under 16 clients that pipeline
SETs (16 a round trip): every SET the server acknowledged is in the store
after the restart, with its value. The figures (acknowledged, present) go to
the test's output."""

from __future__ import annotations

import threading
import time

import pytest

import kvstore
from tests.resp_fixture import served_with_resp

redis = pytest.importorskip("redis")

WRITERS = 16
PIPELINE = 16


@pytest.mark.crash
def test_every_acknowledged_set_survives_kill_9(tmp_path, capsys):
    store = str(tmp_path / "store")
    served, port = served_with_resp(store)
    acked: list[list[tuple[bytes, bytes]]] = [[] for _ in range(WRITERS)]
    stop = threading.Event()

    def writer(n: int) -> None:
        c = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=30)
        i = 0
        try:
            while not stop.is_set():
                batch = [(b"w%02d:%06d" % (n, i + j), b"v%d" % (i + j)) for j in range(PIPELINE)]
                with c.pipeline(transaction=False) as p:
                    for key, value in batch:
                        p.set(key, value)
                    answers = p.execute()
                assert all(a is True for a in answers)
                acked[n].extend(batch)  # acknowledged: durable per the contract
                i += PIPELINE
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            pass  # the server died mid-round: that round was not acknowledged
        finally:
            c.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(map(len, acked)) < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    served.kill()  # SIGKILL, writers mid-pipeline
    stop.set()
    for t in threads:
        t.join(30)
    every = [kv for w in acked for kv in w]
    assert len(every) >= 2000, "the writers made too little progress to mean anything"
    with kvstore.open(store) as db:
        missing = [k for k, v in every if db.get(k) != v]
        present = len(db)
    with capsys.disabled():
        print(f"\nkill -9 under {WRITERS} pipelining writers: {len(every)} SETs acknowledged, "
              f"{len(every) - len(missing)} present after restart ({present} keys in the store)")
    assert not missing, f"{len(missing)} acknowledged SETs lost, e.g. {missing[:5]}"
