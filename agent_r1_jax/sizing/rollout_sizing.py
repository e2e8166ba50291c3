"""How a step's rollout rows map onto the mesh's batch devices (`learner.batch_split.batch_devices`): the lockstep
engine's waves and the slot engine's slots (`rollout.engine`, `rollout.max_rows_per_device`,
`rollout.slots_per_device`).

`slot_engine_options` is the one place that turns a config into `run_slot_episodes`' keyword arguments, for a
training step and for an evaluation alike."""

from __future__ import annotations

from typing import Any

from ml_collections import config_dict

from agent_r1_jax.learner.batch_split import batch_devices
from agent_r1_jax.rollout.config import RolloutConfig
from agent_r1_jax.sampling.paging import PagingConfig

ENGINES = ("lockstep", "slots")


def check_engine(c: config_dict.ConfigDict) -> None:
  """The rollout engine's fields: one ValueError naming the field to change."""
  r = c.rollout
  if r.engine not in ENGINES:
    raise ValueError(f"rollout.engine must be one of {list(ENGINES)}, got {r.engine!r}")
  for name, least in (("slots_per_device", 0), ("decode_chunk", 1), ("tool_workers", 1)):
    value = r[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
      raise ValueError(f"rollout.{name} must be an integer >= {least}, got {value!r}")
  if r.engine == "slots" and r.max_rows_per_device:
    raise ValueError("rollout.max_rows_per_device samples a step in waves, which is the lockstep engine's way to "
                     "bound the KV cache; the slot engine bounds it with rollout.slots_per_device: set "
                     "--config.rollout.max_rows_per_device=0 or --config.rollout.engine=lockstep")
  paging = PagingConfig.from_config(c)  # its own fields' errors
  if paging is not None and paging.pages_per_device:
    rows = paging.pages_per_row(RolloutConfig.from_config(r).cache_length)
    if paging.pages_per_device - 1 < rows:
      raise ValueError(f"rollout.pages_per_device={paging.pages_per_device} cannot hold one episode at the full "
                       f"context ({rows} pages of model.kv_page_size={paging.page_size} tokens, plus the null page): "
                       f"set it to at least {rows + 1}, or 0 for every slot at full length")


def slots_per_device(c: config_dict.ConfigDict, device_count: int, process_count: int) -> int:
  """The slot engine's decode slots per batch device: `rollout.slots_per_device`, or (0) enough for all of a
  process's rows at once, ceil(prompts per process x n_samples / batch devices per process)."""
  if c.rollout.slots_per_device:
    return int(c.rollout.slots_per_device)
  rows = c.trainer.batch_size // process_count * c.rollout.n_samples
  local_devices = max(batch_devices(c, device_count) // process_count, 1)
  return -(-rows // local_devices)


def slot_engine_options(c: config_dict.ConfigDict, device_count: int, process_count: int, *,
                        eval_batch_size: int | None = None) -> dict[str, Any]:
  """`run_slot_episodes`' keyword arguments from `c.rollout`: slots_per_device, decode_chunk, tool_workers, and the
  KV cache's paging (`sampling.paging.PagingConfig.from_config`: `model.kv_cache` and its fields; None: dense).

  A training step (`eval_batch_size` None): `slots_per_device(c, ...)`, all of the step's rows at once unless
  `rollout.slots_per_device` bounds them.

  An evaluation of `eval_batch_size` prompts per rollout over all processes (`trainer.eval_batch_size` or the
  evaluate CLI's --batch_size): ceil(eval_batch_size / batch devices) slots per device, at most
  `rollout.slots_per_device` when that is set. Why: an evaluation streams its examples through the slots (many
  per slot, `rollout.evaluation.evaluate_examples`), so the slot count bounds only the KV cache and the decode
  width, not what is played; a device then holds the rows of one evaluation batch, the memory an evaluation
  rollout always took (the lockstep driver plays whole batches), and a cap that bounds the training cache bounds
  this one too. The step's slot count would tie evaluation memory to the training batch instead (640 rows at the
  paper's settings against 128 evaluation prompts). The trajectories do not depend on it (sampling is keyed by
  episode and position)."""
  if eval_batch_size is None:
    slots = slots_per_device(c, device_count, process_count)
  else:
    if not isinstance(eval_batch_size, int) or eval_batch_size < 1:
      raise ValueError(f"the evaluation batch size must be a positive integer, got {eval_batch_size!r}")
    slots = -(-eval_batch_size // max(batch_devices(c, device_count), 1))
    if c.rollout.slots_per_device:
      slots = min(slots, int(c.rollout.slots_per_device))
  return {"slots_per_device": slots, "decode_chunk": int(c.rollout.decode_chunk),
          "tool_workers": int(c.rollout.tool_workers), "paging": PagingConfig.from_config(c)}


def evaluation_slot_options(c: config_dict.ConfigDict, device_count: int, process_count: int,
                            eval_batch_size: int) -> dict[str, Any] | None:
  """What `rollout.evaluation.evaluate_examples` takes as `slot_options` for an evaluation of `eval_batch_size`
  prompts per rollout: `slot_engine_options` when `rollout.engine` is "slots", None (the lockstep driver) when it is
  "lockstep"."""
  if c.rollout.engine == "lockstep":
    return None
  return slot_engine_options(c, device_count, process_count, eval_batch_size=eval_batch_size)


def prompts_per_wave(c: config_dict.ConfigDict, device_count: int, process_count: int) -> int:
  """Prompts one process samples per rollout wave: `rollout.max_rows_per_device` rows on each of the batch
  devices, in whole groups of `rollout.n_samples`, split over the processes (0: one wave of every prompt)."""
  per_device = c.rollout.max_rows_per_device
  if not isinstance(per_device, int) or per_device < 0:
    raise ValueError(f"rollout.max_rows_per_device must be an integer >= 0 (0: every row at once), got {per_device!r}")
  if not per_device:
    return 0
  rows = per_device * batch_devices(c, device_count)
  if rows % (c.rollout.n_samples * process_count):
    raise ValueError(f"rollout.max_rows_per_device = {per_device} on {batch_devices(c, device_count)} batch devices "
                     f"makes waves of {rows} rows, which must hold whole groups of rollout.n_samples = "
                     f"{c.rollout.n_samples} on each of {process_count} process(es): choose max_rows_per_device so "
                     f"that waves are a multiple of {c.rollout.n_samples * process_count} rows")
  return rows // c.rollout.n_samples // process_count
