"""Which LSNs a batch read of ``changes`` covers, said where people look: the
demo's Spark step (checked against what Spark reads), the README's Spark
section and the options' docs; and the README's mapping of walkv's change
types to ``changeVocabulary=delta``; and a warning when a snapshot just
emptied the default range."""

from __future__ import annotations

import logging
import os

import pytest

import kvstore
from kvstore.spark.files import StoreFiles
from tests.test_cli import REPO
from tests.test_spark_unit import read_all, reader


@pytest.mark.spark
def test_the_demo_prints_the_lsns_changes_covers(walkv_spark, tmp_path, capsys, monkeypatch):
    from kvstore.cli import demo
    from kvstore.cli.demo_report import DemoReport
    from kvstore.cli.progress import Reporter

    monkeypatch.setattr(demo, "spark_env", lambda master: None)  # the suite's session, and its environment

    def spark_step(out: str) -> str:
        demo._spark_export(path, str(tmp_path / out), "local[2]", DemoReport(6), Reporter(False))
        return capsys.readouterr().out

    def lsns(**options) -> list[int]:
        df = walkv_spark.read.format("walkv").options(**options).load(path)
        return sorted(r._commit_version for r in df.collect())

    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        for i in range(30):
            db.put(b"k%02d" % i, b"v")
        assert db.snapshot().lsn == 30
        db.put(b"k30", b"v")
        db.delete(b"k00")
        assert db.delete_range(b"k10", b"k15") == 33
    printed = spark_step("out1")
    assert ("      changes: 3 rows, LSNs 31..33 (after the snapshot at LSN 30; startingLsn=earliest for the whole "
            "log: LSNs 1..33) (keyspaces: '' 3)\n") in printed
    assert "      snapshot: 30 rows, at LSN 30 (keyspaces: '' 30)\n" in printed
    assert "      state: 25 rows, the store at LSN 33 (keyspaces: '' 25)\n" in printed
    # What the line says is what Spark reads.
    assert lsns() == [31, 32, 33]
    assert lsns(startingLsn="earliest") == list(range(1, 34))

    # Right after a snapshot (as at the end of `make demo`): 0 rows, and the line says why.
    with kvstore.open(path) as db:
        assert db.snapshot().lsn == 33
    first = StoreFiles(path).first_held(33)
    printed = spark_step("out2")
    assert ("      changes: 0 rows: no LSNs after the snapshot at LSN 33 up to the durable LSN 33 (startingLsn="
            f"earliest for the whole log: LSNs {first}..33)\n") in printed
    assert lsns() == []
    assert lsns(startingLsn="earliest") == list(range(first, 34))


def _flat(text: str) -> str:
    return " ".join(text.split())


def _readme_spark_section() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    return text[text.index("Spark (`pip install"):text.index("## Watch and conditional writes")]


def test_the_readme_and_the_options_say_which_lsns_a_batch_read_covers():
    from kvstore.spark import options

    readme = _flat(_readme_spark_section())
    assert ("A batch read of `changes` covers the LSNs after the newest snapshot, up to the durable LSN when the "
            "query is planned") in readme
    assert "right after a snapshot `changes` has 0 rows" in readme
    assert '`.option("startingLsn", "earliest")` reads every LSN the log still holds' in readme
    assert "A stream starts at `earliest`" in readme
    doc = _flat(options.__doc__ or "")
    assert "Which LSNs a batch read of ``changes`` covers: by default ``S+1 .. E``" in doc
    assert "Why the batch default is not ``earliest``" in doc


def test_the_readme_maps_walkvs_change_types_to_deltas():
    from kvstore.spark import delta_cdf

    table = {}
    for line in _readme_spark_section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and line.startswith("| ") and not cells[0].startswith("-"):
            table[cells[0]] = cells[1]
    assert table.pop("walkv (`changeVocabulary=walkv`, the default)") == "`changeVocabulary=delta`"
    assert table == {
        "`upsert` of a key that did not exist": "`insert`, value: the new value",
        "`upsert` of a key that existed": "`update_preimage` (value: the old value), then `update_postimage` (the "
                                          "new value), same `_commit_version` and `_op_index`",
        "`delete` of a key that existed": "`delete`, value: the value it deleted",
        "`delete` of a key that did not exist": "no row",
        "`delete_range` [key, end_key)": "one `delete` per key it deleted, in key order, with its value",
        "a conditional write that failed": "no row (none in walkv's types either)",
        "the snapshot's rows (`startingFrom=snapshot`)": "`insert` at the snapshot's LSN, `_op_index` -1",
    }
    named = {word for cell in table.values() for word in delta_cdf.CHANGE_TYPES if f"`{word}`" in cell}
    assert named == set(delta_cdf.CHANGE_TYPES)


def test_a_default_changes_range_emptied_by_a_snapshot_is_said(tmp_path, caplog):
    path = str(tmp_path / "store")
    with kvstore.open(path) as db:
        for i in range(5):
            db.put(b"k%d" % i, b"v")
        db.snapshot()  # as an automatic one would, just before the scheduled job
    with caplog.at_level(logging.WARNING, logger="walkv.spark"):
        r = reader(path, table="changes")
    assert read_all(r) is None
    assert "snapshot (at LSN 5)" in caplog.text and "LSNs 1..5" in caplog.text and "startingLsn" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="walkv.spark"):
        reader(path, table="changes", startingLsn="earliest")
        reader(path, table="snapshot")
    assert caplog.text == ""
