"""Checkpoint retention: the latest `max_to_keep` steps, and step 0 whatever `max_to_keep` is (issue #33, defect 5:
orbax's `max_to_keep` alone deleted step 0, which `init_from`, `evaluate` and the paper tables read after a run)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from agent_r1_jax.trainer.actor_checkpoint import checkpoint_steps
from agent_r1_jax.trainer.checkpointing import Checkpointer


def _save(ck: Checkpointer, step: int) -> None:
  ck.save(step, {"w": jnp.full((3,), float(step))}, {"fingerprint": {"model": "m"}, "step": step})
  ck.wait()


def test_step_zero_survives_max_to_keep_across_a_preemption_and_resume(tmp_path):
  """The tiny preset's schedule with a SIGTERM at 7 and a resumed run (a new manager over the same directory):
  saves at 0, 5, 7 | 10, 15, 20 with max_to_keep=4 keep 0 and the latest four, and step 0 restores as saved."""
  directory = tmp_path / "checkpoints"
  first = Checkpointer(directory, max_to_keep=4, async_save=False)
  for step in (0, 5, 7):
    _save(first, step)
  first.close()
  resumed = Checkpointer(directory, max_to_keep=4, async_save=False)
  for step in (10, 15):
    _save(resumed, step)
  assert checkpoint_steps(tmp_path) == [0, 5, 7, 10, 15]
  _save(resumed, 20)
  assert checkpoint_steps(tmp_path) == [0, 7, 10, 15, 20]
  state, meta = resumed.restore(0, {"w": jnp.zeros((3,))}, {"model": "m"})
  np.testing.assert_array_equal(np.asarray(state["w"]), np.zeros(3))
  assert meta["step"] == 0
  resumed.close()


def test_other_kept_steps_and_a_run_without_step_zero(tmp_path):
  """`keep_steps` names the steps kept besides the latest; a run that never saved step 0 keeps just the latest."""
  ck = Checkpointer(tmp_path / "checkpoints", max_to_keep=2, async_save=False, keep_steps=(3,))
  for step in (1, 2, 3, 4, 5, 6):
    _save(ck, step)
  assert checkpoint_steps(tmp_path) == [3, 5, 6]
  ck.close()
