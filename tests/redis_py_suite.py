"""redis-py's own tests for the commands walkv implements, run against
``walkv serve --resp`` (not part of the suite: it needs redis-py's sdist,
which ships its tests)::

    pip download --no-binary :all: --no-deps redis==8.1.0 && tar xzf redis-8.1.0.tar.gz
    python -m tests.redis_py_suite redis-8.1.0      # prints pytest's summary

It selects, from redis-py's ``tests/test_commands.py`` and
``tests/test_pipeline.py``, the tests named after a command walkv answers
(:data:`SELECTED`), then runs ``tests/test_pubsub.py`` and
``tests/test_keyspace_notifications.py`` but for what walkv has not
(:data:`PUBSUB_EXCLUDED`: sharded channels, clusters), each with their own
fixtures (each test's client flushes the database) on a fresh store. What
fails is a difference from Redis; the report says which and why.

Last run (redis-py 8.1.0, against walkv serve --resp): commands and
pipelines 82 passed, 2 skipped (they need Redis >= 8.3), 4 failed, each on
what walkv has not: ``test_type`` and ``test_exec_error_in_response`` (LPUSH,
SADD...: lists, sets), ``test_pipeline`` (ZADD), ``test_command_count``
(it wants 100 commands or more); pub/sub and keyspace notifications 140
passed, 11 skipped (subkey notifications: Redis >= 8.7.2).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from tests.resp_fixture import served_with_resp

SELECTED = (
    "test_get_and_set or test_set_nx or test_set_xx or test_set_px or test_set_ex or test_set_exat or "
    "test_set_pxat or test_set_multipleoptions or test_set_keepttl or test_set_get or test_set_with_get or "
    "test_setex or test_psetex or test_setnx or test_getset or test_getdel or test_getex or test_mget or "
    "test_mset or test_msetnx or test_append or test_strlen or test_getrange or test_setrange or test_substr or "
    "test_incr or test_incrby or test_incrbyfloat or test_decr or test_decrby or test_delete or test_delitem or "
    "test_unlink or test_exists or test_type or test_rename or test_renamenx or test_keys or test_scan or "
    "test_dbsize or test_expire or test_pexpire or test_expiretime or test_pexpiretime or test_ttl or "
    "test_pttl or test_persist or test_ping or test_echo or test_select or test_time or test_lastsave or "
    "test_client_id or test_client_setname or test_client_getname or test_command_count or test_getitem or "
    "test_pipeline or test_exec or test_watch or test_unwatch or test_transaction or test_parse_error"
)
EXCLUDED = "increx or msetex or delex or cluster or bitfield or records or metric or retry or _ifeq or _ifne or ifdeq"
PUBSUB_EXCLUDED = ("cluster or Cluster or shard or ssubscribe or sunsubscribe or spublish or metric or Metric or "
                   "ignore_all_subscribe_messages or ignore_individual_subscribe_messages")  # (those two SSUBSCRIBE)
RUNS = (
    (("tests/test_commands.py", "tests/test_pipeline.py"), f"({SELECTED}) and not ({EXCLUDED})"),
    (("tests/test_pubsub.py", "tests/test_keyspace_notifications.py"), f"not ({PUBSUB_EXCLUDED})"),
)


def main(sdist: str) -> int:
    codes = []
    with tempfile.TemporaryDirectory() as tmp:
        served, port = served_with_resp(os.path.join(tmp, "store"))
        try:
            for files, selection in RUNS:
                done = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files, "--redis-url",
                     f"redis://127.0.0.1:{port}/0", "-k", selection, "-rfEs", "--no-header", "-W", "ignore"],
                    cwd=sdist, timeout=1800)
                codes.append(done.returncode)
        finally:
            served.stop()
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
