"""Values that process 0 alone reads, handed to every process of a multi-host run.

A multi-host evaluation or table writes its files on process 0 only; a decision taken from files (reuse a
finished run or evaluation?) or a figure read back from them must be the same on every process, or the
processes would step through different collectives. `from_process_0` gives every process process 0's value:
the others never touch the files, which they may not see (a local disk) or see half-written.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import multihost_utils


def from_process_0(read: Callable[[], Any]) -> Any:
  """`read()` as process 0 returns it, on every process (a collective; only process 0 calls `read`).

  The value goes through JSON (two `broadcast_one_to_all`s: its length, then its bytes), so it must be
  JSON-serialisable and comes back as JSON makes it (tuples as lists, keys as strings) on every process,
  process 0 included; with one process it is `read()` itself.
  """
  if jax.process_count() == 1:
    return read()
  payload = json.dumps(read()).encode() if jax.process_index() == 0 else b""
  size = int(multihost_utils.broadcast_one_to_all(np.asarray(len(payload), np.int64)))
  buffer = np.zeros(size, np.uint8)
  buffer[:len(payload)] = np.frombuffer(payload, np.uint8)
  return json.loads(np.asarray(multihost_utils.broadcast_one_to_all(buffer)).tobytes())
