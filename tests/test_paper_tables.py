"""`experiments.paper_tables` at a micro budget: one warm-up shared by every run, reuse on rerun, parsable tables."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent_r1_jax import paths, trainer
from agent_r1_jax.evaluation import pipeline
from agent_r1_jax.experiments import paper_tables

# The tiny preset shrunk to seconds: a 1-layer 32-wide model, a small world, a 2-step warm-up without the
# drill and the fresh worlds, 2 RL steps of 4 rows.
MICRO = {
    "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_hidden_layers": 1,
    "model.num_attention_heads": 2, "model.num_key_value_heads": 1,
    "data.synthetic.num_train": 24, "data.synthetic.num_validation": 4, "data.synthetic.num_test": 4,
    "rollout.max_turns": 2, "rollout.max_new_tokens_per_turn": 8, "rollout.n_samples": 2,
    "trainer.batch_size": 2, "trainer.total_steps": 2, "trainer.eval_every": 1, "trainer.save_every": 2,
    "trainer.eval_num_examples": 4, "trainer.eval_batch_size": 4, "trainer.progress_bar": False,
    "actor.micro_batch_size_per_device": 2, "critic.micro_batch_size_per_device": 2,
    "sft.stages": "1:2:4", "sft.reading_worlds": 0, "sft.rag_questions": 0, "sft.multi_hop_worlds": 0,
}
RUNS = ("grpo", "ppo", "ppo_no_masks")


def _table_rows(text: str) -> dict[str, list[str]]:
  """{first cell: the other cells} of a markdown table, header and rule dropped."""
  lines = [line for line in text.splitlines() if line.startswith("|")]
  assert len(lines) >= 3 and set(lines[1].replace("|", "")) == {"-"}
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
  assert all(len(c) == len(cells[0]) for c in cells)
  return {c[0]: c[1:] for c in cells[2:]}


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
  root = tmp_path_factory.mktemp("tables")
  results = paper_tables.run_tables(root, preset="tiny", overrides=MICRO, run_names=RUNS, num_examples=4,
                                    progress=False)
  return root, results


def test_every_run_starts_from_the_one_warm_up(tables):
  _, results = tables
  assert set(results["runs"]) == set(RUNS)
  warm = results["warmup"]["sha256"]
  assert all(r["start_sha256"] == warm for r in results["runs"].values())
  assert results["runs"]["grpo"]["overrides"] == {} and results["runs"]["ppo_no_masks"]["overrides"] == {
      "algorithm.advantage_mask": "response", "algorithm.loss_mask": "response"}


def test_tables_parse_with_one_row_per_method(tables):
  root, results = tables
  table3 = _table_rows((root / "table3.md").read_text())
  assert list(table3) == ["Base Tool Call", "Naive RAG", "No Retrieval", "GRPO", "PPO"]
  table4 = _table_rows((root / "table4.md").read_text())
  assert list(table4) == ["PPO", "PPO w/o advantage and loss masks", "GRPO"]
  for label, cells in {**table3, **table4}.items():
    values = [float(c) for c in cells if c != "-"]
    assert all(0.0 <= v <= 3.0 for v in values), (label, cells)
  assert table3["GRPO"][2] == f"{results['runs']['grpo']['metrics']['avg_em']:.4f}"
  assert table3["PPO"][3] == "0.3719" and table4["GRPO"][3] == "0.3877"  # the paper's averages beside ours
  assert json.loads((root / "results.json").read_text())["runs"].keys() == set(RUNS)
  assert (root / "em_curves.png").stat().st_size > 10_000


def test_a_rerun_reuses_every_finished_run_and_evaluation(tables, monkeypatch):
  root, results = tables

  def refuse(*args, **kwargs):
    raise AssertionError("a finished run or evaluation was repeated")

  monkeypatch.setattr(trainer, "train", refuse)
  monkeypatch.setattr(pipeline, "run", refuse)
  again = paper_tables.run_tables(root, preset="tiny", overrides=MICRO, run_names=RUNS, num_examples=4,
                                  progress=False)
  assert all(r["reused"] for r in again["runs"].values()) and again["warmup"]["reused"]
  assert {k: r["metrics"] for k, r in again["runs"].items()} == {k: r["metrics"] for k, r in results["runs"].items()}


def test_cli_refuses_an_unknown_run_in_one_line(tmp_path):
  out = subprocess.run([sys.executable, "-m", "agent_r1_jax.experiments.paper_tables", f"--workdir={tmp_path}",
                        "--runs=grpo,dpo"], capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
  assert out.returncode == 2 and "unknown run(s) ['dpo']" in out.stderr and "Traceback" not in out.stderr
