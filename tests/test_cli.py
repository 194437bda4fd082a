"""The ``walkv`` command line, each command run as a real subprocess on real
stores: help, exit codes, put/get/delete/scan (text and hex), load (JSON
lines, CSV, bad lines), stats, missing stores, a store locked by another
process, snapshot/restore/export/bench, and progress output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import kvstore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ["demo", "put", "get", "delete", "scan", "load", "watch", "stats", "keyspaces", "inspect", "verify", "repair",
            "snapshot", "restore", "export", "bench", "replica", "subscriptions", "serve"]


def walkv(*args: str, input: str | bytes | None = None, timeout: float = 120,
          env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m kvstore.cli ARGS`` with pipes (so: no progress bars)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    text = not isinstance(input, bytes)
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *args], input=input, capture_output=True,
                          text=text, timeout=timeout, env=full_env, cwd=REPO,
                          stdin=subprocess.DEVNULL if input is None else None)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The process failed with exactly one ``walkv: error:`` line and no traceback."""
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode()
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("walkv: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        for i in range(20):
            db.put(b"key%02d" % i, b"value %d" % i)
    return path


# -- help, usage, exit codes ------------------------------------------------------------


def test_help_lists_every_command_and_each_has_help(capsys):
    top = walkv("--help")
    assert top.returncode == 0
    for name in COMMANDS:
        assert re.search(rf"^    {name}(\s|$)", top.stdout, re.MULTILINE), name  # a long name wraps its help
    from kvstore.cli import main

    for name in COMMANDS:  # in this process: fifteen interpreters would only be slower
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        assert exit_.value.code == 0, name
        assert capsys.readouterr().out.startswith("usage: walkv " + name), name


def test_installed_console_script_runs():
    script = os.path.join(os.path.dirname(sys.executable), "walkv")
    if not os.path.exists(script):
        pytest.skip("the walkv console script is not installed in this environment")
    proc = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("walkv ")


@pytest.mark.parametrize("args", [["nosuchcommand"], ["put", "only-a-store"], ["scan"],
                                  ["scan", "x", "--limit", "many"]])
def test_usage_errors_exit_2(args):
    proc = walkv(*args)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_hex_is_a_usage_error(store):
    proc = walkv("get", store, "zz", "--hex")
    assert proc.returncode == 2
    assert "not valid hex" in one_line_error(proc)


# -- put / get / delete / scan ------------------------------------------------------------


def test_put_get_delete_text(tmp_path):
    s = str(tmp_path / "new")
    proc = walkv("put", s, "greeting", "hello, wörld")
    assert proc.returncode == 0, proc.stderr
    assert "LSN 1" in proc.stderr
    got = walkv("get", s, "greeting")
    assert (got.returncode, got.stdout) == (0, "hello, wörld\n")
    assert walkv("delete", s, "greeting").returncode == 0
    missing = walkv("get", s, "greeting")
    assert missing.returncode == 1 and missing.stdout == ""
    assert "not found" in one_line_error(missing)
    with kvstore.open(s) as db:
        assert db.get(b"greeting") is None and db.last_lsn == 2


def test_put_get_hex_binary(tmp_path):
    s = str(tmp_path / "bin")
    key, value = b"\x00\xffk\n", bytes(range(256))
    assert walkv("put", s, key.hex(), value.hex(), "--hex").returncode == 0
    got = walkv("get", s, key.hex(), "--hex")
    assert got.returncode == 0 and bytes.fromhex(got.stdout.strip()) == value
    raw = walkv("get", s, key.hex(), "--hex")  # hex output is always one line
    assert raw.stdout.count("\n") == 1
    with kvstore.open(s) as db:
        assert db.get(key) == value


def test_get_raw_value_bytes(store):
    proc = walkv("get", store, "key03", "--raw", input=b"")
    assert proc.returncode == 0 and proc.stdout == b"value 3"


def test_delete_many_atomically_and_range(store):
    assert walkv("delete", store, "key00", "key01", "key02").returncode == 0
    assert walkv("delete", store, "--range", "key10", "key15").returncode == 0
    with kvstore.open(store) as db:
        keys = [k for k, _ in db.scan()]
        # 20 puts, then one batch of three deletes (one LSN), then one range delete.
        assert db.last_lsn == 22
    assert keys == [b"key%02d" % i for i in list(range(3, 10)) + list(range(15, 20))]
    bad = walkv("delete", store, "--range", "a")
    assert bad.returncode == 2 and "exactly two keys" in one_line_error(bad)


def test_scan_options(store):
    out = walkv("scan", store, "--prefix", "key1", "--limit", "3").stdout.splitlines()
    assert out == ["key10\tvalue 10", "key11\tvalue 11", "key12\tvalue 12"]
    out = walkv("scan", store, "--start", "key05", "--stop", "key08", "--keys-only").stdout.split()
    assert out == ["key05", "key06", "key07"]
    out = walkv("scan", store, "--reverse", "--limit", "2", "--keys-only").stdout.split()
    assert out == ["key19", "key18"]
    rows = [json.loads(ln) for ln in walkv("scan", store, "--json").stdout.splitlines()]
    assert len(rows) == 20 and rows[0] == {"key": "key00", "value": "value 0"}
    counted = walkv("scan", store, "--count", "--keys-only")
    assert "20 keys" in counted.stderr


def test_scan_escapes_tabs_and_newlines(tmp_path):
    s = str(tmp_path / "esc")
    with kvstore.open(s) as db:
        db.put(b"a\tb", b"line1\nline2")
        db.put(b"bin", b"\xff\xfe")
    out = walkv("scan", s).stdout.splitlines()
    assert out == ["a\\tb\tline1\\nline2", "bin\t\\xff\\xfe"]


def test_scan_json_round_trips_through_load_hex(tmp_path):
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    pairs = {bytes([i, 255 - i]) * 3: bytes(range(i)) for i in range(1, 60)}
    with kvstore.open(src) as db:
        for k, v in pairs.items():
            db.put(k, v)
    dump = walkv("scan", src, "--json", "--hex")
    assert dump.returncode == 0
    load = walkv("load", dst, "-", "--hex", "--format", "jsonl", input=dump.stdout)
    assert load.returncode == 0, load.stderr
    with kvstore.open(dst) as db:
        assert dict(db.scan()) == pairs


# -- missing store ---------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", [["get", "{s}", "k"], ["scan", "{s}"], ["delete", "{s}", "k"], ["stats", "{s}"],
                                 ["verify", "{s}"], ["repair", "{s}", "--yes"], ["snapshot", "{s}"],
                                 ["restore", "{s}", "{s}-copy"], ["export", "{s}", "{s}-out"]])
def test_missing_store_is_a_clear_error(tmp_path, cmd):
    s = str(tmp_path / "nope")
    proc = walkv(*[c.format(s=s) for c in cmd])
    assert proc.returncode == 1, proc.stderr
    line = one_line_error(proc)
    assert "nope" in line
    assert not os.path.exists(s), "a read command must not create a store"


def test_directory_that_is_not_a_store(tmp_path):
    (tmp_path / "plain").mkdir()
    proc = walkv("stats", str(tmp_path / "plain"))
    assert proc.returncode == 1 and "not a walkv store" in one_line_error(proc)


# -- load --------------------------------------------------------------------------------------


def test_load_jsonl_and_csv(tmp_path):
    s = str(tmp_path / "s")
    jl = tmp_path / "in.jsonl"
    jl.write_text("".join(json.dumps({"key": f"j{i:03d}", "value": f"v{i}"}) + "\n" for i in range(250)))
    proc = walkv("load", s, str(jl), "--batch-size", "100")
    assert proc.returncode == 0, proc.stderr
    assert "loaded 250 rows in 3 batches" in proc.stderr
    csvf = tmp_path / "in.csv"
    csvf.write_text('key,value\nc1,plain\nc2,"with, comma"\n"c3","quoted ""x"""\n')
    assert walkv("load", s, str(csvf)).returncode == 0
    with kvstore.open(s) as db:
        assert len(db) == 253
        assert db.get(b"j007") == b"v7"
        assert db.get(b"c2") == b"with, comma" and db.get(b"c3") == b'quoted "x"'
        assert db.last_lsn == 4  # 3 batches + 1: one log entry per batch


def test_load_bad_jsonl_line_stops_without_half_writing_its_batch(tmp_path):
    s = str(tmp_path / "s")
    lines = [json.dumps({"key": f"k{i}", "value": f"v{i}"}) for i in range(1, 10)]
    lines[6] = '{"key": "k7", "value": '  # line 7 is cut short
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    proc = walkv("load", s, str(f), "--batch-size", "3")
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "line 7" in line and "bad.jsonl" in line
    assert "6 rows in 2 batches" in line
    with kvstore.open(s) as db:
        # Lines 1-6 (two whole batches) are in; the third batch (lines 7-9) is not.
        assert sorted(db.keys()) == [b"k%d" % i for i in range(1, 7)]


def test_load_bad_csv_line_mid_batch(tmp_path):
    s = str(tmp_path / "s")
    f = tmp_path / "bad.csv"
    f.write_text("a,1\nb,2\nc,3\nd,4,extra\ne,5\n")
    proc = walkv("load", s, str(f), "--batch-size", "2")
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "line 4" in line and "expected 2 fields" in line
    with kvstore.open(s) as db:
        assert sorted(db.keys()) == [b"a", b"b"]  # c (batched with d) was not written


def test_load_rejects_an_oversize_key_with_its_line(tmp_path):
    s = str(tmp_path / "s")
    f = tmp_path / "big.jsonl"
    f.write_text(json.dumps({"key": "ok", "value": "1"}) + "\n" + json.dumps({"key": "x" * 600, "value": "v"}) + "\n")
    proc = walkv("load", s, str(f))
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "line 2" in line and "511" in line
    with kvstore.open(s) as db:
        assert len(db) == 0


def test_load_missing_file(tmp_path):
    proc = walkv("load", str(tmp_path / "s"), str(tmp_path / "nothere.csv"))
    assert proc.returncode == 1 and "nothere.csv" in one_line_error(proc)


# -- stats ----------------------------------------------------------------------------------------


def test_stats_json(store):
    proc = walkv("stats", store, "--json")
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["durable_lsn"] == 20 and st["applied_lsn"] == 20 and st["lmdb_entries"] == 20
    assert st["segments"] == 1 and st["first_lsn"] == 1 and st["writer_pid"] is None
    assert st["closed_cleanly"] is True and st["snapshots"] == []
    assert st["build"].startswith(("compiled (mypyc ", "pure Python ("))
    text = walkv("stats", store)
    assert text.returncode == 0 and "durable LSN" in text.stdout and "20" in text.stdout
    assert text.stdout.splitlines()[0] == f"walkv: {st['build']}"  # which twin runs, first


# -- a store locked by another process --------------------------------------------------------------


HOLDER = textwrap.dedent("""
    import sys, kvstore
    db = kvstore.open(sys.argv[1])
    db.put(b"held", b"yes")
    print("ready", flush=True)
    sys.stdin.read()
    db.close()
""")


@pytest.fixture
def held_store(store):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, store], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield store, proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_locked_store(held_store):
    store, pid = held_store
    for cmd in (["put", store, "k", "v"], ["delete", store, "key01"], ["repair", store, "--yes"],
                ["snapshot", store]):
        proc = walkv(*cmd)
        assert proc.returncode == 3, (cmd, proc.stderr)
        line = one_line_error(proc)
        assert str(pid) in line and "open for writing by another process" in line
    # Readers work beside the writer.
    got = walkv("get", store, "held")
    assert (got.returncode, got.stdout) == (0, "yes\n")
    assert walkv("scan", store, "--keys-only").stdout.split()[:2] == ["held", "key00"]
    st = json.loads(walkv("stats", store, "--json").stdout)
    assert st["writer_pid"] == pid
    assert walkv("verify", store).returncode == 0


def test_exit_codes_follow_the_error_type():
    from kvstore.cli.main import error_code
    from wal.errors import (
        CorruptionError,
        LockedError,
        LogGapError,
        ReadOnlyError,
        WalkvError,
    )

    # The code comes from the type alone: a message that names another kind changes nothing.
    assert error_code(LockedError("corrupt")) == 3
    assert error_code(CorruptionError("locked", path="x", offset=0)) == 4
    assert error_code(LogGapError("locked", first_missing=1, last_missing=9, first_available=10)) == 1
    assert error_code(ReadOnlyError("corrupt")) == 1
    assert error_code(WalkvError("locked")) == 1
    assert error_code(ValueError("corrupt")) == 2


def test_stats_does_not_block_a_writer_opening(store):
    # stats looks at the lock without taking it: a writer opening meanwhile must not fail.
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time,kvstore\n"
                               "for _ in range(15):\n"
                               "    kvstore.open(sys.argv[1]).close()\n", store],
                              env={**os.environ, "PYTHONPATH": REPO}, stderr=subprocess.PIPE, text=True)
    for _ in range(4):
        assert walkv("stats", store, "--json").returncode == 0
    _, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err


# -- snapshot, restore, export, bench ------------------------------------------------------------


def test_snapshot_and_point_in_time_restore(tmp_path):
    s = str(tmp_path / "s")
    with kvstore.open(s, segment_bytes=4096) as db:
        for i in range(300):
            db.put(b"k%04d" % i, b"x" * 50)
        mid = db.last_lsn
        db.delete_range(b"k0100", b"k0200")
    snap = walkv("snapshot", s)
    assert snap.returncode == 0, snap.stderr
    assert f"snapshot at LSN {mid + 1}" in snap.stdout
    st = json.loads(walkv("stats", s, "--json").stdout)
    assert [x["lsn"] for x in st["snapshots"]] == [mid + 1]
    whole = walkv("restore", s, str(tmp_path / "now"))
    assert whole.returncode == 0, whole.stderr
    with kvstore.open(str(tmp_path / "now")) as db:
        assert len(db) == 200
    # Point in time, before the range delete: needs the log from a snapshot at or before it.
    early = str(tmp_path / "early")
    pit = walkv("restore", s, early, "--to-lsn", str(mid))
    if pit.returncode == 0:
        with kvstore.open(early) as db:
            assert len(db) == 300
    else:  # the log before the snapshot was trimmed: a clear error, not a wrong store
        assert pit.returncode in (1, 2) and "LSN" in one_line_error(pit)
    exists = walkv("restore", s, str(tmp_path / "now"))
    assert exists.returncode == 1 and "not empty" in one_line_error(exists)


def test_verify_reports_a_damaged_snapshot_chunk(tmp_path):
    s = str(tmp_path / "s")
    with kvstore.open(s) as db:
        for i in range(200):
            db.put(b"k%04d" % i, b"y" * 100)
    assert walkv("snapshot", s).returncode == 0
    assert walkv("verify", s).returncode == 0
    snaps = os.path.join(s, "snapshots")
    snapdir = os.path.join(snaps, sorted(n for n in os.listdir(snaps) if n.startswith("snap-"))[-1])
    chunk = os.path.join(snapdir, sorted(n for n in os.listdir(snapdir) if n.endswith(".wkc"))[0])
    with open(chunk, "r+b") as f:
        f.seek(os.path.getsize(chunk) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x55]))
    proc = walkv("verify", s)
    assert proc.returncode == 4
    assert os.path.basename(chunk) in proc.stdout and "CORRUPT" in proc.stdout


def test_bench_one_quick_workload_with_plot_and_json(tmp_path):
    png, js = tmp_path / "ratios.png", tmp_path / "bench.json"
    proc = walkv("bench", "--quick", "--only", "log.append.durable.1t", "--plot", str(png), "--json", str(js),
                 "--dir", str(tmp_path / "data"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(js.read_text())
    assert [w["name"] for w in report["workloads"]] == ["log.append.durable.1t"]
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_an_unknown_workload():
    proc = walkv("bench", "--quick", "--only", "no.such.workload")
    assert proc.returncode == 2
    assert "matches no workload" in one_line_error(proc)


@pytest.mark.spark
def test_export_with_spark(tmp_path, spark, capsys):
    """``walkv export`` through ``main()`` in this process, so that it uses the
    suite's one SparkSession (a new JVM per test is too slow for CI); the
    subprocess path is what ``make demo`` runs."""
    from kvstore.cli import main

    s, out = str(tmp_path / "s"), str(tmp_path / "out")
    with kvstore.open(s) as db:
        for i in range(50):
            db.put(b"k%02d" % i, b"v")
        db.delete(b"k00")
        db.delete_range(b"k40", b"k45")
    assert main(["export", s, out, "--table", "state"]) == 0  # one table: each costs a Spark job
    printed = capsys.readouterr().out
    assert "state: 44 rows" in printed and "snapshot:" not in printed
    rows = spark.read.parquet(os.path.join(out, "state")).collect()
    assert sorted(bytes(r["key"]) for r in rows) == [b"k%02d" % i for i in range(1, 50) if not 40 <= i < 45]


# -- progress: bars in a terminal, nothing in a pipe ------------------------------------------------


def _jsonl(path, n):
    path.write_text("".join(json.dumps({"key": f"k{i:05d}", "value": "v" * 50}) + "\n" for i in range(n)))


def test_no_progress_output_in_a_pipe(tmp_path):
    f = tmp_path / "in.jsonl"
    _jsonl(f, 3000)
    proc = walkv("load", str(tmp_path / "s"), str(f), "--batch-size", "10")
    assert proc.returncode == 0
    assert "\x1b[" not in proc.stderr and "━" not in proc.stderr
    assert proc.stderr.strip().startswith("loaded 3000 rows")


def test_progress_bar_in_a_terminal(tmp_path):
    pty = pytest.importorskip("pty")
    f = tmp_path / "in.jsonl"
    _jsonl(f, 3000)
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": REPO, "TERM": "xterm", "COLUMNS": "120"}
    env.pop("WALKV_NO_PROGRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "kvstore.cli", "load", str(tmp_path / "s"), str(f),
                             "--batch-size", "5"], stdout=subprocess.PIPE, stderr=slave, env=env, cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    err = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert "loading in.jsonl" in err


def test_stdout_stays_data_when_stderr_is_a_terminal(tmp_path, store):
    # `walkv scan STORE > file` from a terminal: the bars go to the terminal,
    # the data to the file, whole.
    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": REPO, "TERM": "xterm"}
    env.pop("WALKV_NO_PROGRESS", None)
    proc = subprocess.run([sys.executable, "-m", "kvstore.cli", "scan", store, "--keys-only"],
                          stdout=subprocess.PIPE, stderr=slave, env=env, cwd=REPO, timeout=120)
    os.close(slave)
    os.close(master)
    assert proc.returncode == 0
    assert proc.stdout.decode().split() == ["key%02d" % i for i in range(20)]


def test_verbose_shows_the_traceback(tmp_path):
    quiet = walkv("get", str(tmp_path / "nope"), "k")
    loud = walkv("-v", "get", str(tmp_path / "nope"), "k")
    assert quiet.returncode == loud.returncode == 1
    assert "Traceback" not in quiet.stderr and "Traceback" in loud.stderr
    after = walkv("get", str(tmp_path / "nope"), "k", "--verbose")  # also after the command
    assert "Traceback" in after.stderr


def test_scan_limit_below_zero_is_a_usage_error(store):
    """Issue 33: ``scan --limit -1`` printed nothing and exited 0."""
    proc = walkv("scan", store, "--limit", "-1")
    assert proc.returncode == 2 and "--limit" in proc.stderr and proc.stdout == ""
    assert walkv("scan", store, "--limit", "0").stdout == ""


def test_replica_help_says_source_may_be_a_server_url(capsys):
    from kvstore.cli import main

    with pytest.raises(SystemExit):
        main(["replica", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "http:// or https:// URL of `walkv serve`" in text and "$WALKV_TOKEN" in text


def test_archive_once_says_what_archived_holds_back(store, tmp_path):
    """Issue 33: ``archive --once`` left ``STORE/ARCHIVED`` holding back the
    writer's local retention without saying so."""
    proc = walkv("archive", store, str(tmp_path / "archive"), "--once")
    assert proc.returncode == 0, proc.stderr
    marker = os.path.join(store, "ARCHIVED")
    assert os.path.exists(marker)
    said = " ".join(proc.stderr.split())
    assert f"{marker} says LSN 20" in said and "keeps every log segment past it" in said
    assert f"delete {marker} when you stop archiving" in said
