"""The driver's one cross-process decision: is any row, on any process, still active?

Under JAX multi-controller every process must issue the same sequence of jitted calls, so the turn loop of
every process runs until no process has an active row. A process whose own rows have all finished keeps
calling the sampler with all-zero budgets (its rows sample nothing) until then.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def any_across_processes(local_flags: np.ndarray) -> bool:
  """True when any element of any process's `local_flags` is true; no communication with one process."""
  local = bool(np.any(local_flags))
  if jax.process_count() == 1:
    return local
  gathered = multihost_utils.process_allgather(np.asarray([local], np.int32))
  return bool(np.any(np.asarray(gathered)))
