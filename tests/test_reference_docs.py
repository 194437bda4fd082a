"""The API reference's tables are what the code takes: the Spark source's
options table (``kvstore/spark/options.py``'s docstring) is a well-formed
reStructuredText table, so Sphinx renders it (``make docs``), with one row
for each option :func:`kvstore.spark.options.parse` knows."""

from __future__ import annotations

import io
import re

import pytest

docutils_core = pytest.importorskip("docutils.core")
from docutils import nodes  # noqa: E402

from kvstore.spark import options  # noqa: E402


def _doctree(text: str) -> nodes.document:
    """``text`` parsed by plain docutils (Sphinx's roles read as plain interpreted text);
    any warning is a failure."""
    warnings = io.StringIO()
    tree = docutils_core.publish_doctree(re.sub(r":[a-z]+:`", "`", text),
                                         settings_overrides={"warning_stream": warnings, "report_level": 2})
    assert warnings.getvalue() == ""
    return tree


def test_the_spark_options_table_lists_every_option() -> None:
    assert options.__doc__ is not None
    tables = list(_doctree(options.__doc__).findall(nodes.table))
    assert len(tables) == 1
    rows = list(tables[0].findall(nodes.row))
    names = [row.children[0].astext() for row in rows]
    assert names[0] == "option"  # the header
    assert sorted(names[1:]) == sorted(set(options.KNOWN.values()))
