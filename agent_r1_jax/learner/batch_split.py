"""How a step's rows split over processes, mini-batches and micro-batches on the mesh's batch devices, and the
checks that they do (one ValueError naming the field to change).

With P processes, D batch devices (mesh data x fsdp), B = trainer.batch_size prompts and n = rollout.n_samples:
each process samples B / P prompts; the B n rows split into actor.num_mini_batches mini-batches of M rows; a
learner pass walks a mini-batch in micro-batches of micro_batch_size_per_device x D rows, which must divide M.
Example: B = 8, n = 5, one mini-batch (M = 40) on D = 4 devices: 5 rows per device divide it, 8 do not (32).
"""

from __future__ import annotations

import math

from ml_collections import config_dict


def batch_devices(c: config_dict.ConfigDict, device_count: int) -> int:
  """Devices the batch rows are split over (`mesh.data * mesh.fsdp`, a -1 size filled from `device_count`)."""
  sizes = dict(c.mesh)
  product = math.prod(v for v in sizes.values() if v != -1)
  filled = {k: (max(device_count // product, 1) if v == -1 else v) for k, v in sizes.items()}
  return filled["data"] * filled["fsdp"]


def check_batch_split(c: config_dict.ConfigDict, devices: int, processes: int) -> None:
  """Prompts split over processes, rows into mini-batches, mini-batches into whole micro-batches."""
  if c.trainer.batch_size % processes:
    raise ValueError(f"trainer.batch_size = {c.trainer.batch_size} prompts per step must split evenly over the "
                     f"{processes} processes")
  rows = c.trainer.batch_size * c.rollout.n_samples
  if rows % c.actor.num_mini_batches:
    raise ValueError(f"trainer.batch_size * rollout.n_samples = {rows} rows must split into "
                     f"actor.num_mini_batches = {c.actor.num_mini_batches} equal mini-batches")
  mini = rows // c.actor.num_mini_batches
  for section in ("actor", "critic") if c.algorithm.use_critic else ("actor",):
    per_device = c[section].micro_batch_size_per_device
    if not isinstance(per_device, int) or per_device < 1 or mini % (per_device * devices):
      raise ValueError(
          f"{section}.micro_batch_size_per_device = {per_device} on {devices} batch devices (mesh.data * "
          f"mesh.fsdp) makes micro-batches of {per_device} x {devices} rows, which must divide the mini-batch of "
          f"{mini} rows (trainer.batch_size * rollout.n_samples / actor.num_mini_batches)")


def micro_batches(c: config_dict.ConfigDict, section: str, rows: int, device_count: int) -> int:
  """How many micro-batches of `section`'s size (`actor` or `critic`) `rows` rows make."""
  return rows // (c[section].micro_batch_size_per_device * batch_devices(c, device_count))


__all__ = ["batch_devices", "check_batch_split", "micro_batches"]
