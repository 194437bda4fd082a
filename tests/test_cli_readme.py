"""The README stays true: each of its Python blocks runs as written, on its
own (a fresh namespace for each, in order, in one fresh directory: a block may
use the files an earlier one made, never its names); every Python example is
in a ```python block, so none escapes these tests; its CLI table names
exactly the commands ``walkv --help`` lists, and the make targets it names
exist."""

from __future__ import annotations

import contextlib
import io
import os
import re
from typing import NamedTuple

import pytest

import kvstore
from tests.test_cli import COMMANDS, REPO, walkv

README = os.path.join(REPO, "README.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


class Block(NamedTuple):
    line: int  # of the block's first line of code in README.md
    code: str

    @property
    def spark(self) -> bool:
        return "pyspark" in self.code or "spark." in self.code


class Ran(NamedTuple):
    block: Block
    ns: dict
    printed: str


def _readme() -> str:
    with open(README, encoding="utf-8") as fh:
        return fh.read()


def _python_blocks() -> list[Block]:
    text = _readme()
    return [Block(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text)
            if m.group(1) == "python"]


def _run_blocks(tmp_path, monkeypatch, blocks: list[Block]) -> list[Ran]:
    """Each block in a namespace of its own, in order, in ``tmp_path``;
    tracebacks name the README's lines. A process a block starts (``walkv
    serve``) runs this checkout too."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ran = []
    for block in blocks:
        ns: dict = {"__name__": "__readme__"}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile("\n" * (block.line - 1) + block.code, README, "exec"), ns)  # noqa: S102 - our README
        ran.append(Ran(block, ns, out.getvalue()))
    return ran


def _printed_by(ran: list[Ran], marker: str) -> list[str]:
    """The lines printed by the one block whose code contains ``marker``."""
    found = [r for r in ran if marker in r.block.code]
    assert len(found) == 1, (marker, [r.block.line for r in found])
    return found[0].printed.splitlines()


def test_every_python_example_is_a_python_block():
    """A fenced block that is Python but not marked ```python would escape
    the tests below: there is none."""
    for m in FENCE.finditer(_readme()):
        lang, code = m.group(1), m.group(2)
        if lang != "python":
            assert not re.search(r"^\s*(import |from \w+ import |with kvstore\.)|kvstore\.\w+\(", code,
                                 re.MULTILINE), f"README.md line {_readme().count(chr(10), 0, m.start()) + 1}: " \
                                                f"a Python example in a ```{lang} block\n{code}"


def test_readme_python_blocks_run_each_on_its_own(tmp_path, monkeypatch):
    blocks = [b for b in _python_blocks() if not b.spark]
    assert len(blocks) >= 10
    ran = _run_blocks(tmp_path, monkeypatch, blocks)
    tour = _printed_by(ran, 'lsn = db.put(b"user:1"')
    assert tour[:2] == ["1 b'{\"name\": \"Ada\"}'", "True 2"]
    assert _printed_by(ran, "tour-store-restored") == ["[b'order:0001', b'order:0002', b'order:0003']"]
    auto = _printed_by(ran, "snapshot_every_bytes=")
    assert re.fullmatch(r"[1-9]\d* snapshots taken, [1-9]\d* bytes of log deleted", auto[0]), auto
    assert _printed_by(ran, "open_async")[-1] == "b'x'"
    assert _printed_by(ran, "ArchiveReader") == ["2", "0", "1 3 []", "b'paid'"]
    replica = _printed_by(ran, 'open_replica("orders"')
    assert replica[0].startswith("b'paid' 1 Lag(lsns=0, "), replica
    assert replica[1:] == ["[(b'order:1', b'paid')]", "2"]
    assert _printed_by(ran, "kvstore.connect(url") == ["b'Grace' [(b'user:2', b'Grace')]", "b'Grace' 3"]
    assert _printed_by(ran, "redis.Redis(port") == ["[True, 1]", "b'2' -1 always", "b'__keyspace@0__:stock:42' b'incrby'"]
    with kvstore.open(str(tmp_path / "tour-store"), readonly=True) as db:
        assert list(db.scan(prefix=b"order:")) == []  # the "oops" stays in the original
        assert db.get(b"user:2") is None and db.get(b"user:1:orders") == b"2"


@pytest.mark.spark
def test_readme_spark_blocks_run(tmp_path, monkeypatch, spark):
    blocks = _python_blocks()
    assert any(b.spark for b in blocks)
    ran = _run_blocks(tmp_path, monkeypatch, blocks)  # all of them: the Spark ones read the tour's store
    ns = next(r.ns for r in ran if "state = " in r.block.code and r.block.spark)
    state = {r["key"]: r["value"] for r in ns["state"].collect()}
    with kvstore.open(str(tmp_path / "tour-store"), readonly=True) as db:
        assert state == {k.decode(): v.decode() for k, v in db.scan()}
    assert "_change_type" in "".join(r.printed for r in ran if r.block.spark)


def test_readme_cli_table_matches_the_commands():
    table = set(re.findall(r"^\| `walkv (\w+)", _readme(), re.MULTILINE))
    assert table == set(COMMANDS)
    listed = walkv("--help").stdout
    for name in COMMANDS:
        assert re.search(rf"^    {name}(\s|$)", listed, re.MULTILINE), name


def test_readme_make_targets_exist():
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as fh:
        makefile = fh.read()
    for target in set(re.findall(r"make ([\w-]+)", _readme())):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target


def test_readme_says_its_examples_want_an_empty_directory():
    """Issue 33: the examples failed when run twice in one directory; the
    README says where to run them, and what a second run there does."""
    tour = _readme().split("## A five-minute tour", 1)[1].split("```", 1)[0]
    assert "run them in" in tour and "new, empty directory" in tour and "second time" in tour
