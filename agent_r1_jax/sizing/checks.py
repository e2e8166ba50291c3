"""The sizing sections of a config, each checked with one ValueError naming the field to change: the dry run's own
fields (`dry_run_topology`, `dry_run_report`), the rollout engine's (`rollout.engine`, slots, waves), and how a
step's rows split over the devices it runs on: this host's, or with `dry_run_topology` the slice's
(`check_topology_mesh`, once the dry run has the slice's devices)."""

from __future__ import annotations

import math

import jax
from ml_collections import config_dict

from agent_r1_jax.learner.batch_split import batch_devices, check_batch_split
from agent_r1_jax.sizing.rollout_sizing import check_engine, prompts_per_wave


def check_sizing_fields(c: config_dict.ConfigDict) -> None:
  """The dry run's fields, the rollout engine's, and (without a topology) the batch's split over this host's
  devices and processes."""
  _check_dry_run_fields(c)
  if not c.dry_run_topology:  # else the dry run checks the split over the slice's devices (check_topology_mesh)
    check_batch_split(c, batch_devices(c, jax.device_count()), jax.process_count())
    prompts_per_wave(c, jax.device_count(), jax.process_count())
  check_engine(c)


def _check_dry_run_fields(c: config_dict.ConfigDict) -> None:
  """`dry_run_topology` and `dry_run_report` are strings that only a dry run reads (the topology's name is
  checked by libtpu when the dry run starts: `sizing.tpu.topology_devices`)."""
  for name in ("dry_run_topology", "dry_run_report"):
    if not isinstance(c[name], str):
      raise ValueError(f"{name} must be a string, got {c[name]!r}")
    if c[name] and not c.dry_run:
      raise ValueError(f"{name}={c[name]!r} is read by the dry run only: add --config.dry_run=True (or unset it)")


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
