"""Training checkpoints with orbax: array state + a JSON record of everything else.

A checkpoint at step `s` holds the state *after* `s` completed steps:
  - `state`: one pytree of arrays (actor params and optimizer state, critic params and optimizer state when
    there is a critic, the PRNG key data, counters) saved with `StandardSave` and restored onto the
    shardings of an abstract target built from the freshly initialised run;
  - `meta`: JSON (the data iterator state, the model/algorithm fingerprint, the step).
Saves are asynchronous (orbax's background thread); `wait()` blocks until the last one is on disk.

Resuming a workdir whose checkpoint was written by a different model or algorithm is refused with a message
that names the mismatching fields, instead of failing later inside orbax with a shape error. `Preemption` turns
SIGTERM and SIGINT into a save after the current step.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy

from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.sampling.multihost import any_across_processes


class IncompatibleCheckpointError(ValueError):
  """The workdir holds a checkpoint from a different model/algorithm configuration."""


class Checkpointer:
  """Thin policy layer over `ocp.CheckpointManager` for the RL trainer.

  Keeps the latest `max_to_keep` steps and, whatever `max_to_keep` is, every step in `keep_steps`: step 0 (the
  policy after warm-up, before RL) by default, which `init_from`, `evaluate`'s base-tool-call row and the paper
  tables read back after the run.
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3, async_save: bool = True,
               keep_steps: tuple[int, ...] = (0,)):
    self.directory = workdir_lib.absolute(directory)  # a local path resolved, or gs://bucket/dir as given
    keep = preservation_policy.AnyPreservationPolicy(
        [preservation_policy.LatestN(max_to_keep), preservation_policy.CustomSteps(list(keep_steps))])
    options = ocp.CheckpointManagerOptions(preservation_policy=keep, enable_async_checkpointing=async_save,
                                           create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: Any, meta: Mapping[str, Any], *, force: bool = False) -> None:
    """Starts saving `state` (array pytree) and `meta` (JSON-able) as step `step`."""
    self._manager.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))),
        force=force)

  def metadata(self, step: int) -> dict:
    """The JSON record saved with step `step` (no arrays read)."""
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore(self, step: int, abstract_state: Any, fingerprint: Mapping[str, Any]) -> tuple[Any, dict]:
    """Restores step `step` onto the shapes/shardings of `abstract_state`.

    Args:
      step: the checkpoint step to read.
      abstract_state: a pytree of `jax.ShapeDtypeStruct` (with shardings) or arrays of the target layout.
      fingerprint: the current run's model/algorithm description; it must equal the one saved.

    Returns:
      `(state, meta)`.
    """
    meta = self.metadata(step)
    saved = meta.get("fingerprint", {})
    diffs = {k: (saved.get(k), v) for k, v in fingerprint.items() if saved.get(k) != v}
    if diffs:
      lines = ", ".join(f"{k}: checkpoint has {old!r}, config has {new!r}" for k, (old, new) in diffs.items())
      raise IncompatibleCheckpointError(
          f"the checkpoint in {self.directory} (step {step}) was written by a different configuration "
          f"({lines}); use a new --workdir or restore the matching config")
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
    return restored["state"], meta

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def delete_all(self) -> None:
    """Deletes every saved step (after the last save has finished)."""
    self._manager.wait_until_finished()
    for step in self._manager.all_steps():
      self._manager.delete(step)

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


class Preemption:
  """SIGTERM (a preemption notice) and SIGINT (Ctrl-C) handler: the loop finishes the current step, saves, and
  exits cleanly. A second Ctrl-C interrupts at once (the first restores Python's own SIGINT handler)."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self.signal_name = ""
    self._previous: dict[int, Any] = {}

  def __enter__(self):
    for signum in self.SIGNALS:
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # not the main thread (e.g. a notebook worker): no handler
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    self.requested = True
    self.signal_name = signal.Signals(signum).name
    if signum == signal.SIGINT and signum in self._previous:
      signal.signal(signum, self._previous[signum])

  def agreed(self) -> bool:
    """Whether any process caught a signal: every process gets the same answer, so all of them save the same step
    (one all-gather of a flag with several processes, none with one)."""
    return any_across_processes(np.array([self.requested]))

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
