"""`paper_tables` after a preemption and past `max_to_keep` (issue #33, defect 5): the step-0 checkpoint that the
tables read (the run's starting policy, `init_from`) survives checkpoint retention, so a table whose run was killed
with SIGTERM and resumed, and one of 20 RL steps, complete instead of crashing after all their training."""

from __future__ import annotations

import os
import signal

import pytest

from agent_r1_jax.experiments import paper_tables
from agent_r1_jax.trainer import loop
from agent_r1_jax.trainer.actor_checkpoint import checkpoint_steps
from test_paper_tables import MICRO

# The micro model, 20 RL steps at the tiny preset's own schedule (a checkpoint every 5 steps, the latest 4 kept:
# 0, 5, 10, 15, 20 saved, so retention alone would drop step 0), validating only where it saves.
TWENTY_STEPS = {**{k: v for k, v in MICRO.items() if k != "trainer.save_every"}, "trainer.total_steps": 20,
                "trainer.save_every": 5, "trainer.max_to_keep": 4, "rollout.max_new_tokens_per_turn": 6}


def test_tables_complete_after_a_sigterm_and_resume_with_twenty_steps(tmp_path, monkeypatch):
  """The GRPO run is preempted at step 7 (SIGTERM: it saves 7 and stops; `paper_tables` exits asking for a rerun),
  the rerun resumes it from 7 to 20 and the tables complete: its starting policy, read back from the run's step-0
  checkpoint, is the warm-up's, and step 0 is still on disk beside the latest four."""
  original_step = loop.RLTrainer.step
  sent = []

  def step_then_preempt(self, step):
    metrics = original_step(self, step)
    if step == 7 and not sent:
      sent.append(step)
      os.kill(os.getpid(), signal.SIGTERM)  # the Preemption handler turns it into save-and-stop
    return metrics

  monkeypatch.setattr(loop.RLTrainer, "step", step_then_preempt)
  monkeypatch.setattr(paper_tables, "CURVE_OVERRIDES", {"trainer.eval_every": 5})
  with pytest.raises(SystemExit, match="interrupted .SIGTERM. at step 7"):
    paper_tables.run_tables(tmp_path, preset="tiny", overrides=TWENTY_STEPS, run_names=("grpo",), num_examples=4,
                            progress=False)
  run_dir = tmp_path / "runs" / "grpo" / "warmup0_seed0"
  assert checkpoint_steps(run_dir) == [0, 5, 7]
  results = paper_tables.run_tables(tmp_path, preset="tiny", overrides=TWENTY_STEPS, run_names=("grpo",),
                                    num_examples=4, progress=False)
  (grpo,) = results["runs"]["grpo"]["seeds"]
  assert grpo["start_sha256"] == results["warmups"][0]["sha256"] and not grpo["reused"]
  assert checkpoint_steps(run_dir) == [0, 7, 10, 15, 20]
  assert (tmp_path / "table3.md").is_file() and 0.0 <= grpo["avg_em"] <= 1.0
