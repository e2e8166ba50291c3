"""What the sampler and the episode driver need to run the same programs on every process of a multi-controller
JAX job.

Under multi-controller JAX every process must issue the same jitted calls with the same static shapes, while
each process holds only its own (local) rows. So:

  * static sizes (prompt bucket, extension bucket, segment width) come from numbers every process agrees on:
    `agreed_max` is one small `process_allgather` of a few ints (no communication with one process);
  * a local `[b, ...]` host array becomes one global `[b * processes, ...]` device array whose rows
    `[i * b, (i + 1) * b)` are process i's (`global_rows`); replicated inputs are identical everywhere;
  * results come back to the host from this process's addressable shards only (`local_rows`);
  * the driver's turn loop runs until no row of any process is active (`any_across_processes`): a process
    whose own rows have all finished keeps calling the sampler with all-zero budgets until then;
  * values each process must know of every other (the slot engine's episode ranges and slot settings) are one
    `gather_across_processes`.

Each helper that communicates is a collective: every process must call it, in the same order as the jitted
programs, with the same number of values.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agent_r1_jax.models.sharding import LOGICAL_RULES, logical_to_spec


def agreed_max(values: Sequence[int]) -> np.ndarray:
  """int64 `[n]`: the element-wise max of `values` over all processes (the values themselves with one)."""
  local = np.asarray(values, np.int64).reshape(-1)
  if jax.process_count() == 1:
    return local
  gathered = np.asarray(multihost_utils.process_allgather(local))  # [processes, n]
  return gathered.reshape(-1, local.size).max(axis=0)


def gather_across_processes(values: Sequence[int]) -> np.ndarray:
  """int64 `[processes, n]`: row i holds process i's `values` (one `process_allgather`; none with one process)."""
  local = np.asarray(values, np.int64).reshape(-1)
  if jax.process_count() == 1:
    return local[None]
  return np.asarray(multihost_utils.process_allgather(local)).reshape(-1, local.size)


def any_across_processes(local_flags: np.ndarray) -> bool:
  """True when any element of any process's `local_flags` is true (no communication with one process)."""
  local = bool(np.any(local_flags))
  if jax.process_count() == 1:
    return local
  return bool(np.any(np.asarray(multihost_utils.process_allgather(np.asarray([local], np.int32)))))


def global_rows(x: np.ndarray, mesh: Mesh) -> jax.Array:
  """Local rows `[b, ...]` -> the global `[b * processes, ...]` array, batch over (data, fsdp).

  Raises:
    ValueError: the mesh does not give each process its own block of rows (e.g. a tensor axis that spans
      processes while the batch axes do not), so local rows could not stay local.
  """
  processes = jax.process_count()
  global_shape = (x.shape[0] * processes,) + x.shape[1:]
  names = ("batch",) + (None,) * (x.ndim - 1)
  sharding = NamedSharding(mesh, logical_to_spec(global_shape, names, mesh, LOGICAL_RULES))
  if processes > 1:
    rows = {(d.process_index, idx[0].indices(global_shape[0])[:2])
            for d, idx in sharding.devices_indices_map(global_shape).items()}
    for p in range(processes):
      spans = sorted(span for q, span in rows if q == p)
      if sum(stop - start for start, stop in spans) != x.shape[0] or any(
          (q != p and span in spans) for q, span in rows):
        raise ValueError(
            f"the mesh {dict(mesh.shape)} does not split the batch axis over processes (each process must own "
            f"{x.shape[0]} rows of {global_shape[0]}); put the processes along the data/fsdp axes")
  return jax.make_array_from_process_local_data(sharding, x, global_shape)


def replicated(x: np.ndarray, mesh: Mesh) -> jax.Array:
  """A host array that is identical on every process -> one replicated global array."""
  return jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec()), x, x.shape)


def local_rows(x: jax.Array) -> np.ndarray:
  """This process's rows of a global array whose leading axis is the batch, in global order (numpy)."""
  if x.is_fully_addressable:
    return np.asarray(x)
  blocks = {}
  for shard in x.addressable_shards:
    start = shard.index[0].indices(x.shape[0])[0]
    if start not in blocks:  # replicas along other mesh axes hold the same rows
      blocks[start] = np.asarray(shard.data)
  return np.concatenate([blocks[s] for s in sorted(blocks)], axis=0)
