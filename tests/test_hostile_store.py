"""Hostile input to the store: batch payloads, snapshot files, a damaged log
under a store, files with wrong permissions, and the modes of the files the
store creates.

* kvstore.entry.codec.decode: random bytes, random msgpack values, near-valid
  batches and length fields claiming gigabytes give CorruptionError or a
  well-formed batch, with memory bounded;
* a log entry that is valid msgpack but not a batch makes kvstore.open
  refuse with CorruptionError naming its LSN (never a TypeError from deep in
  the apply path, never silently skipped);
* random mutations of a real snapshot's MANIFEST and chunk files, and chunk
  names with ``../`` or absolute paths, fed to snapshot.open/verify/iteration
  and to the store's rebuild: only walkv's errors, nothing misread;
* a segment, chunk or manifest the process may not read or write: a clear
  walkv error naming the file (tests run as root, where chmod does not stop
  reads, so these run in a child process without CAP_DAC_OVERRIDE);
* every file the store creates is mode 0o600 and every directory 0o700, even
  under umask 0.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import tracemalloc

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvstore
import kvstore.store.recovery
import snapshot
import wal
from kvstore.entry.codec import MAX_KEY_BYTES, decode
from kvstore.entry.limits import MAX_BOUND_BYTES
from snapshot.manifest import decode_manifest, encode_manifest
from tests.test_kvstore import abandon
from wal.errors import CorruptionError, WalkvError

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
OPTIONS = {"segment_bytes": 4096, "map_size": 1 << 20}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))





def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


# -- batch payloads ------------------------------------------------------------------


def _check_decoded(ops) -> None:
    assert type(ops) is list
    for op in ops:
        assert type(op) is list and type(op[0]) is int
        if op[0] == 1:
            assert len(op) == 3 and type(op[1]) is bytes and type(op[2]) is bytes
            assert 0 < len(op[1]) <= MAX_KEY_BYTES
        elif op[0] == 2:
            assert len(op) == 2 and type(op[1]) is bytes and 0 < len(op[1]) <= MAX_KEY_BYTES
        else:
            assert op[0] == 3 and len(op) == 3
            assert all(type(b) is bytes and len(b) <= MAX_BOUND_BYTES for b in op[1:])


def _decode_or_corrupt(payload: bytes) -> None:
    try:
        ops = decode(payload, lsn=7)
    except CorruptionError as e:
        assert e.lsn == 7 and "walkv repair" in str(e)
        return
    _check_decoded(ops)


@SETTINGS
@given(st.binary(max_size=2000))
def test_batch_decode_random_bytes(payload):
    _decode_or_corrupt(payload)


MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)
_INTS = st.integers(-(2**63), 2**64 - 1)
NEAR_OPS = st.one_of(
    st.tuples(st.sampled_from([0, 1, 2, 3, 4, -1, 1.0, True, "1", b"\x01", None]),
              st.binary(max_size=600) | st.text(max_size=5) | st.none() | _INTS),
    st.tuples(st.sampled_from([1, 3]), st.binary(max_size=600) | st.text(max_size=3),
              st.binary(max_size=600) | st.text(max_size=3) | _INTS),
    st.tuples(st.sampled_from([1, 2, 3]), st.binary(max_size=8), st.binary(max_size=8), st.binary(max_size=8)),
    st.just(()),
).map(list)


@SETTINGS
@given(st.one_of(MSGPACK_VALUES, st.lists(NEAR_OPS, max_size=6), st.lists(MSGPACK_VALUES, max_size=4)))
def test_batch_decode_valid_msgpack_that_is_not_a_batch(obj):
    _decode_or_corrupt(msgpack.packb(obj, use_bin_type=True))


@pytest.mark.parametrize("payload", [
    b"\xdd\xff\xff\xff\xff",                      # array32 of 4 billion elements, then nothing
    b"\x91\xdd\xff\xff\xff\xff",                  # inside an array
    b"\x91\x93\x01\xc6\xff\xff\xff\xff",          # a put whose key is a bin32 of 4 GiB
    b"\x91\x93\x01\xa1k\xc6\xff\xff\xff\xf0abc",  # str key, then a 4 GiB value
    b"\xdf\xff\xff\xff\xff",                      # map32 of 4 billion pairs
    b"\xc9\xff\xff\xff\xff\x01",                  # ext32 of 4 GiB
    b"\x91" * 100000 + b"\x90",                   # arrays nested 100000 deep
], ids=["array32", "nested-array32", "bin32-key", "bin32-value", "map32", "ext32", "deep"])
def test_batch_length_fields_claiming_gigabytes(payload):
    peak = _peak(lambda: pytest.raises(CorruptionError, decode, payload, 3))
    assert peak < 16 << 20, f"decoding {len(payload)} hostile bytes peaked at {peak} bytes"


def _append_raw_to_store_log(path: str, payload: bytes) -> int:
    with wal.open(os.path.join(path, "wal"), segment_bytes=OPTIONS["segment_bytes"]) as log:
        return log.append(payload)


@pytest.mark.parametrize("bad", [
    msgpack.packb([[1, "text key", b"v"]]),
    msgpack.packb({"ops": []}),
    msgpack.packb([[9, b"k"]], use_bin_type=True),
    msgpack.packb([[1, b"", b"v"]], use_bin_type=True),
    msgpack.packb([[3, b"a"]], use_bin_type=True),
    b"\xc1",
], ids=["str-key", "map", "unknown-op", "empty-key", "short-range", "not-msgpack"])
@pytest.mark.parametrize("rebuild", [False, True], ids=["replay", "rebuild"])
def test_store_refuses_a_log_entry_that_is_not_a_batch(tmp_path, reboot, bad, rebuild):
    path = str(tmp_path / "s")
    with kvstore.open(path, **OPTIONS) as db:
        for i in range(10):
            db.put(b"k%d" % i, b"v%d" % i)
        if not rebuild:
            # leave LMDB behind the log so that the open replays
            abandon(db)
    lsn = _append_raw_to_store_log(path, bad)
    if rebuild:
        reboot()
        shutil.rmtree(os.path.join(path, "lmdb"))
    with pytest.raises(CorruptionError) as e:
        kvstore.open(path, **OPTIONS)
    assert e.value.lsn == lsn and "repair" in str(e.value)


def test_store_write_of_a_hostile_payload_is_refused(tmp_path):
    with kvstore.open(str(tmp_path / "s"), **OPTIONS) as db:
        for bad in (b"\xc1", msgpack.packb([[1, "k", "v"]]), msgpack.packb([[2]])):
            with pytest.raises((CorruptionError, ValueError, TypeError)):
                db.write(bad)
        assert db.last_lsn == 0


# -- snapshot files --------------------------------------------------------------------------


_SNAP: dict = {}


def _snapshot_template() -> dict:
    """A real store with a snapshot of several chunks (built once; not a
    fixture, so that hypothesis does not print it)."""
    if not _SNAP:
        import tempfile

        path = os.path.join(tempfile.mkdtemp(prefix="walkv-hostile-"), "s")
        with kvstore.open(path, **OPTIONS) as db:
            for i in range(300):
                db.put(b"key%04d" % i, bytes([i % 251]) * (i % 50))
            info = db.snapshot(chunk_bytes=2048)
        files = {n: open(os.path.join(info.path, n), "rb").read() for n in sorted(os.listdir(info.path))}
        _SNAP.update(store=path, snap=info.path, files=files, state={b"key%04d" % i: bytes([i % 251]) * (i % 50)
                                                                     for i in range(300)})
    return _SNAP


@pytest.fixture(scope="module", autouse=True)
def _cleanup_snapshot_template():
    yield
    if _SNAP:
        shutil.rmtree(os.path.dirname(_SNAP["store"]), ignore_errors=True)
        _SNAP.clear()


@st.composite
def edits(draw, size: int):
    out = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "overwrite", "truncate", "insert"]))
        off = draw(st.integers(0, max(0, size - 1)))
        out.append((kind, off, draw(st.integers(0, 7)) if kind == "flip" else draw(st.binary(min_size=1, max_size=32))))
    return out


def _apply(data: bytes, eds) -> bytes:
    b = bytearray(data)
    for kind, off, arg in eds:
        off = min(off, max(0, len(b) - 1))
        if kind == "flip" and b:
            b[off] ^= 1 << arg
        elif kind == "overwrite":
            b[off : off + len(arg)] = arg
        elif kind == "truncate":
            del b[off:]
        elif kind == "insert":
            b[off:off] = arg
    return bytes(b)


@SETTINGS
@given(data=st.data())
def test_mutated_snapshot_files_every_reader(tmp_path_factory, data):
    t = _snapshot_template()
    name = data.draw(st.sampled_from(sorted(t["files"])))
    parent = str(tmp_path_factory.mktemp("snaps"))
    snap_dir = os.path.join(parent, os.path.basename(t["snap"]))
    shutil.copytree(t["snap"], snap_dir)
    with open(os.path.join(snap_dir, name), "wb") as f:
        f.write(_apply(t["files"][name], data.draw(edits(len(t["files"][name])))))
    try:
        listed = snapshot.list_snapshots(parent)
        assert all(i.path == snap_dir for i in listed)
        snap = snapshot.open(snap_dir)
        pairs = dict(snap)
    except WalkvError:
        pairs = None
    try:
        snapshot.verify(snap_dir)
        verified = True
    except WalkvError:
        verified = False
    if pairs is not None:
        # Whatever was read back was written (CRCs), in full when it verifies.
        for k, v in pairs.items():
            assert t["state"][k] == v
        if verified:
            assert pairs == t["state"]
    try:
        found = snapshot.newest(parent, verify=True)
    except WalkvError:
        found = None
    assert found is None or verified


@pytest.mark.parametrize("name", ["../escape.wkc", "/etc/passwd", "sub/chunk.wkc", "..", "", "MANIFEST",
                                  "chunk\x00.wkc", "." * 300])
def test_manifest_chunk_names_outside_the_snapshot(tmp_path, name):
    t = _snapshot_template()
    snap_dir = str(tmp_path / os.path.basename(t["snap"]))
    shutil.copytree(t["snap"], snap_dir)
    (tmp_path / "escape.wkc").write_bytes(t["files"][sorted(n for n in t["files"] if n != "MANIFEST")[0]])
    m = decode_manifest(t["files"]["MANIFEST"], os.path.join(snap_dir, "MANIFEST"))
    chunk0 = m.chunks[0]
    forged = m.__class__(m.lsn, m.store_id, m.created_us, m.count, m.bytes,
                         (chunk0.__class__(**{**_fields(chunk0), "name": name}),) + tuple(m.chunks[1:]))
    with open(os.path.join(snap_dir, "MANIFEST"), "wb") as f:
        f.write(encode_manifest(forged))
    with pytest.raises(CorruptionError):
        snapshot.open(snap_dir)
    assert snapshot.list_snapshots(str(tmp_path)) == [] or all(
        i.path != snap_dir for i in snapshot.list_snapshots(str(tmp_path)))


def _fields(obj) -> dict:
    return {f: getattr(obj, f) for f in obj.__slots__} if hasattr(obj, "__slots__") else dict(vars(obj))


def test_store_rebuild_with_a_damaged_newest_snapshot(tmp_path, reboot):
    """A rebuild (machine crash) skips a snapshot that does not verify and
    uses an older one plus the log, or refuses with CorruptionError; it never
    loads damaged data."""
    path = str(tmp_path / "s")
    state = {}
    with kvstore.open(path, **OPTIONS) as db:
        for round_ in range(3):
            for i in range(100):
                k, v = b"k%03d" % i, b"%d-%d" % (round_, i)
                db.put(k, v)
                state[k] = v
            db.snapshot(chunk_bytes=1024, keep=3)
    newest = snapshot.list_snapshots(os.path.join(path, "snapshots"))[-1]
    chunk = os.path.join(newest.path, sorted(n for n in os.listdir(newest.path) if n.endswith(".wkc"))[-1])
    data = bytearray(open(chunk, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(chunk, "wb").write(bytes(data))
    reboot()
    try:
        with kvstore.open(path, **OPTIONS) as db:
            assert dict(db.scan()) == state
    except CorruptionError as e:
        assert "snapshot" in str(e)


# -- permissions -------------------------------------------------------------------------------------


def _run_unprivileged(code: str, cwd: str) -> tuple[str, str]:
    """Run ``code`` in a child Python that file permissions apply to (as
    root: without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH). The code sets
    ``result``; returns (result, stderr)."""
    body = textwrap.indent(textwrap.dedent(code).strip(), "    ")
    prog = "\n".join([
        "import sys, traceback",
        f"sys.path.insert(0, {ROOT!r})",
        "from wal.errors import WalkvError",
        "result = 'ok'",
        "try:",
        body,
        "except WalkvError as e:",
        "    result = 'walkv: ' + type(e).__name__ + ': ' + str(e)",
        "except BaseException as e:",
        "    traceback.print_exc()",
        "    result = 'raw: ' + type(e).__name__ + ': ' + str(e)",
        "print(result.replace('\\n', ' '))",
    ])
    argv = [sys.executable, "-c", prog]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: chmod cannot be enforced")
        argv = [setpriv, "--bounding-set", "-dac_override,-dac_read_search", *argv]
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    lines = p.stdout.strip().splitlines()
    return (lines[-1] if lines else f"no output (exit {p.returncode})"), p.stderr


def _perm_check(result: str, stderr: str, path: str) -> None:
    assert result.startswith("walkv:"), f"not a walkv error: {result}\n{stderr[-2000:]}"
    assert path in result, f"the error does not name {path}: {result}"


def _store_with_segments(tmp_path) -> str:
    path = str(tmp_path / "s")
    with kvstore.open(path, **OPTIONS) as db:
        for i in range(200):
            db.put(b"k%03d" % i, b"v" * 100)
    return path


def test_unreadable_sealed_segment_is_a_clear_error(tmp_path):
    path = _store_with_segments(tmp_path)
    seg = wal.segment.list_segments(os.path.join(path, "wal"))[1].path
    os.unlink(wal.segment.index_path(seg))  # so that open has to read the segment itself
    os.chmod(seg, 0)
    result, err = _run_unprivileged(f"import wal; wal.open({os.path.join(path, 'wal')!r}).close()", str(tmp_path))
    _perm_check(result, err, seg)


def test_read_only_active_segment_is_a_clear_error(tmp_path):
    path = _store_with_segments(tmp_path)
    seg = wal.segment.list_segments(os.path.join(path, "wal"))[-1].path
    os.chmod(seg, 0o400)
    result, err = _run_unprivileged(
        f"import kvstore; kvstore.open({path!r}, segment_bytes=4096).close()", str(tmp_path))
    _perm_check(result, err, seg)


def test_read_only_sealed_segment_is_fine(tmp_path):
    """A sealed segment is never written again: read-only is enough."""
    path = _store_with_segments(tmp_path)
    for seg in wal.segment.list_segments(os.path.join(path, "wal"))[:-1]:
        os.chmod(seg.path, 0o400)
    result, err = _run_unprivileged(textwrap.dedent(f"""
        import kvstore
        with kvstore.open({path!r}, segment_bytes=4096) as db:
            assert db.get(b"k000") == b"v" * 100 and len(db) == 200
            db.put(b"new", b"x")
    """), str(tmp_path))
    assert result == "ok", f"{result}\n{err[-2000:]}"


def test_unreadable_snapshot_chunk_is_a_clear_error(tmp_path):
    path = str(tmp_path / "s")
    with kvstore.open(path, **OPTIONS) as db:
        for i in range(200):
            db.put(b"k%03d" % i, b"v" * 100)
        info = db.snapshot(chunk_bytes=2048)
    chunk = os.path.join(info.path, sorted(n for n in os.listdir(info.path) if n.endswith(".wkc"))[0])
    os.chmod(chunk, 0)
    result, err = _run_unprivileged(f"import snapshot; snapshot.open({info.path!r}).verify()", str(tmp_path))
    _perm_check(result, err, chunk)


# -- modes of the files the store creates ---------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_store_files_are_private_to_their_owner(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = str(tmp_path / "store")
        with kvstore.open(path, **OPTIONS) as db:
            for i in range(300):
                db.put(b"k%03d" % i, b"v" * 100)
            db.snapshot(chunk_bytes=2048)
            db.delete(b"k000")
    finally:
        os.umask(old)
    wrong = []
    for root, dirs, files in os.walk(path):
        for d in dirs + ([""] if root == path else []):
            p = os.path.join(root, d)
            if stat.S_IMODE(os.stat(p).st_mode) != 0o700:
                wrong.append(f"{p}: {oct(stat.S_IMODE(os.stat(p).st_mode))}")
        for f in files:
            p = os.path.join(root, f)
            if stat.S_IMODE(os.stat(p).st_mode) != 0o600:
                wrong.append(f"{p}: {oct(stat.S_IMODE(os.stat(p).st_mode))}")
    assert not wrong, "files or directories not private to their owner:\n" + "\n".join(wrong)
