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

from agent_r1_jax.trainer.rollout_sizing import batch_devices, prompts_per_wave


def check_topology_mesh(c: config_dict.ConfigDict, device_count: int) -> None:
  """With `dry_run_topology`: `c.mesh` spans the slice's `device_count` devices (a -1 size fills them, fixed
  sizes must multiply to it) and the batch splits over them as on the hardware. One ValueError naming the fix."""
  sizes = dict(c.mesh)
  product = math.prod(sizes.values())
  if -1 not in sizes.values() and product != device_count:
    fsdp = max(device_count // (sizes["data"] * sizes["tensor"]), 1)  # what fsdp=-1 fills
    hint = _micro_batch_hint(c, sizes["data"] * fsdp)
    raise ValueError(f"mesh {sizes} spans {product} device(s), dry_run_topology={c.dry_run_topology!r} has "
                     f"{device_count}: set --config.mesh.fsdp=-1 (fills the slice){hint}")
  check_batch_split(c, batch_devices(c, device_count), 1)
  prompts_per_wave(c, device_count, 1)


def _micro_batch_hint(c: config_dict.ConfigDict, devices: int) -> str:
  """" and --config.actor.micro_batch_size_per_device=N": the largest size <= the configured one whose
  micro-batches divide the mini-batch over `devices` batch devices, for each section that needs a change."""
  mini = c.trainer.batch_size * c.rollout.n_samples // c.actor.num_mini_batches
  hints = []
  for section in ("actor", "critic") if c.algorithm.use_critic else ("actor",):
    per_device = c[section].micro_batch_size_per_device
    if mini % (per_device * devices) == 0:
      continue
    fits = [p for p in range(per_device, 0, -1) if mini % (p * devices) == 0]
    hints.append(f"--config.{section}.micro_batch_size_per_device={fits[0]}" if fits else
                 f"a mini-batch of {mini} rows that splits over {devices} devices (trainer.batch_size)")
  return "".join(f" and {h}" for h in hints)


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


__all__ = ["check_batch_split", "check_topology_mesh", "micro_batches"]
