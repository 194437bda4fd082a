"""Spark on a cluster reading the archive from the bucket: executors in their
own processes (``local-cluster``, tests/spark_cluster_child.py), which can
reach the archive only through the S3 server, read ``state`` and ``changes``
as the local store gives them.

The cluster is its own SparkSession in a child process (the session-scoped
``local[2]`` one of conftest.py is untouched); the test is skipped, saying
why, when that cluster cannot start here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from kvstore.archive import Archiver, ArchiveReader
from tests.test_spark_helpers import build_store

pytestmark = pytest.mark.spark

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_cluster_child.py")


def _cluster_read(tmp_path, uris: list[str]) -> dict:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17+")
    out = tmp_path / "out.json"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    try:
        proc = subprocess.run([sys.executable, CHILD, str(out), *uris], env=env, capture_output=True,
                              timeout=240)
        error = proc.stderr.decode(errors="replace")[-3000:] if proc.returncode else ""
    except subprocess.TimeoutExpired as e:
        error = f"timed out; stderr: {(e.stderr or b'').decode(errors='replace')[-3000:]}"
    result = json.loads(out.read_text()) if out.exists() else {}
    up = result.get("up")
    if up is None:
        pytest.skip(f"a local-cluster Spark session did not start here: {error[-1500:]}")
    if up["executors"] < 2:
        pytest.skip(f"only {up['executors']} of 2 local-cluster executors registered in 60 s")
    assert not error, error
    return result


def test_cluster_reads_the_s3_archive_like_the_store(s3server, tmp_path):
    built = build_store(str(tmp_path / "store"), seed=23, n_batches=60, trim=False)
    uri = s3server.uri(f"cluster-{uuid.uuid4().hex[:8]}")
    Archiver(built.path, uri).ship_once()
    n_objects = len(ArchiveReader(uri).segments())

    got = _cluster_read(tmp_path, [uri, built.path])
    assert got["up"]["master"].startswith("local-cluster")
    archive, store = got[uri], got[built.path]

    state = {bytes.fromhex(k): bytes.fromhex(v) for k, v, _ in archive["state"]}
    assert state == built.model
    assert sorted(map(tuple, archive["state"])) == sorted(map(tuple, store["state"]))

    def change(r: list) -> tuple:
        return (*(None if x is None else bytes.fromhex(x) for x in r[:3]), *r[3:])

    assert sorted(map(change, archive["changes"]), key=repr) == sorted(built.change_rows(1), key=repr)
    assert sorted(map(tuple, archive["changes"]), key=repr) == sorted(map(tuple, store["changes"]), key=repr)
    # One partition per archived log object, read by the executors.
    assert archive["partitions"] == n_objects
