"""The entry format: what one log entry's payload means, below everything that
reads or writes one (the state machine, watch, the archive, Spark, the store).

* :mod:`kvstore.entry.codec`: the op codes, encode/decode;
* :mod:`kvstore.entry.limits`: what keys, bounds, values and keyspace names
  may be, and the argument checks every write path shares;
* :mod:`kvstore.entry.conditions`: deciding a group's conditional batches in
  log order, and the decision as it is written into the log;
* :mod:`kvstore.entry.groups`: a staged group (an atomic write over several
  entries) as readers of the log see it, whole at its commit.

It imports only :mod:`wal` (errors).
"""

from kvstore.entry.codec import (
    DEFAULT_MAX_VALUE_BYTES,
    ENTRY_OVERHEAD,
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_PUT,
    decode,
    encode,
)
from kvstore.entry.conditions import Outcome, decide_group, writes_of
from kvstore.entry.limits import MAX_KEY_BYTES

__all__ = ["DEFAULT_MAX_VALUE_BYTES", "ENTRY_OVERHEAD", "MAX_KEY_BYTES", "OP_DELETE", "OP_DELETE_RANGE", "OP_PUT",
           "Outcome", "decide_group", "decode", "encode", "writes_of"]
