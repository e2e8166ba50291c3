"""Checkpoints of the supervised warm-up, so a preemption, a Colab disconnect or Ctrl-C during it loses nothing.

The warm-up (`warmup.run.warm_up`) numbers its optimizer steps across its phases (the stages, then each extra
read-check round). `WarmupCheckpoints` is its `warmup.sft.Progress`: it saves the actor's parameters and the
phase's AdamW state under `DIR/warmup_checkpoints/<step>` every `sft.save_every` steps and at the end of each
phase, with the read checks recorded so far, and resumes a phase from the latest save. When `Preemption` has
caught SIGTERM or SIGINT (on any process), the step just taken is saved and `WarmupInterrupted` raised: the loop
prints one line saying how to resume. A resumed warm-up replays the batch draws of the steps it skips, so it
ends with exactly the parameters of an uninterrupted one (tested). The saves are dropped once RL's step 0 is
saved: from then on the run resumes from its RL checkpoints.

What must match for a save to be resumed is the model and algorithm fingerprint and every `sft.*` field, the run
seed and the synthetic world's settings (they decide the warm-up's data and batches).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from ml_collections import config_dict

from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.trainer.checkpointing import Checkpointer, Preemption

DIRECTORY = "warmup_checkpoints"


class WarmupInterrupted(Exception):
  """SIGTERM or SIGINT during the warm-up: `step` is saved."""

  def __init__(self, step: int, directory: Any):
    super().__init__(f"warm-up step {step} saved to {directory}")
    self.step, self.directory = step, directory


def warmup_fingerprint(c: config_dict.ConfigDict, model_fingerprint: dict[str, Any]) -> dict[str, Any]:
  """The run's fingerprint and everything that decides the warm-up's data and batches, as JSON values."""
  out = dict(model_fingerprint, seed=int(c.seed))
  out.update({f"sft.{k}": v for k, v in c.sft.to_dict().items()})
  out.update({f"data.synthetic.{k}": v for k, v in c.data.synthetic.to_dict().items()})
  return json.loads(json.dumps(out))  # as the saved record reads back: tuples become lists


class WarmupCheckpoints:
  """The warm-up's saves in `workdir / DIRECTORY` (module docstring); a `warmup.sft.Progress`.

  Args:
    workdir: the run's directory.
    save_every: optimizer steps between saves (0: only at phase ends and on a signal).
    fingerprint: `warmup_fingerprint` of the run.
    preemption: the active `Preemption`, polled after every step.
    on_mesh: places a restored or saved tree as the run's global arrays (`RLTrainer._on_mesh`).
  """

  def __init__(self, workdir: Any, *, save_every: int, fingerprint: dict[str, Any], preemption: Preemption,
               on_mesh: Callable[[Any], Any]):
    self.directory = workdir_lib.workdir_path(workdir) / DIRECTORY
    self.save_every, self.fingerprint, self.preemption, self.on_mesh = save_every, fingerprint, preemption, on_mesh
    self._checkpointer = Checkpointer(self.directory, max_to_keep=2, keep_steps=())
    self.latest = self._checkpointer.latest_step()
    self._restored: tuple[Any, dict] | None = None
    self.checks: list[dict[str, Any]] = []
    if self.latest is not None:
      self.checks = list(self._meta()["read_checks"])

  def _meta(self) -> dict[str, Any]:
    return self._checkpointer.metadata(self.latest)

  def resume(self, first_step: int, steps: int, params: Any, opt_state: Any) -> tuple[Any, Any, int]:
    """The phase `first_step + 1 .. first_step + steps` from the latest save: not reached yet (0 done), inside
    it, or finished before it (all done, the saved parameters; a finished phase's AdamW state is not needed)."""
    if self.latest is None or self.latest <= first_step:
      return params, opt_state, 0
    done = min(self.latest - first_step, steps)
    if self._restored is None:
      state, meta = self._checkpointer.restore(self.latest, self.on_mesh({"params": params,
                                                                        "opt_state": opt_state}),
                                               self.fingerprint)
      self._restored = state, meta
    state, _ = self._restored
    if done < steps or self.latest == first_step + steps:  # the save holds this phase's own AdamW state
      return state["params"], state["opt_state"], done
    return state["params"], opt_state, done

  def after_step(self, step: int, params: Any, opt_state: Any, *, phase_end: bool) -> None:
    """Saves at every `save_every`-th step and a phase's end; on a signal saves and raises `WarmupInterrupted`."""
    interrupted = self.preemption.agreed()
    if interrupted or phase_end or (self.save_every and step % self.save_every == 0):
      meta = {"fingerprint": self.fingerprint, "step": step, "read_checks": list(self.checks)}
      self._checkpointer.save(step, self.on_mesh({"params": params, "opt_state": opt_state}), meta,
                              force=True)
    if interrupted:
      self._checkpointer.wait()
      raise WarmupInterrupted(step, self.directory)

  def discard(self) -> None:
    """Deletes every save (RL's step 0 now holds the warmed-up policy) and closes the manager."""
    self._checkpointer.delete_all()
    self._checkpointer.close()
