"""`experiments.paper_tables` at a micro budget: one warm-up shared by every seed run, statistics recomputed from the
records, reuse on rerun (a new seed trains alone), parsable tables."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from agent_r1_jax import paths, trainer
from agent_r1_jax.evaluation import pipeline
from agent_r1_jax.experiments import paper_tables

# The tiny preset shrunk to seconds: a 1-layer 32-wide model, a small world, a 2-step warm-up without the
# drill, the fresh worlds and the read check, 2 RL steps of 4 rows.
MICRO = {
    "model.hidden_size": 32, "model.intermediate_size": 64, "model.num_hidden_layers": 1,
    "model.num_attention_heads": 2, "model.num_key_value_heads": 1,
    "data.synthetic.num_train": 24, "data.synthetic.num_validation": 4, "data.synthetic.num_test": 4,
    "rollout.max_turns": 2, "rollout.max_new_tokens_per_turn": 8, "rollout.n_samples": 2,
    "trainer.batch_size": 2, "trainer.total_steps": 2, "trainer.eval_every": 1, "trainer.save_every": 2,
    "trainer.eval_num_examples": 4, "trainer.eval_batch_size": 4, "trainer.progress_bar": False,
    "actor.micro_batch_size_per_device": 2, "critic.micro_batch_size_per_device": 2,
    "sft.stages": "1:2:4", "sft.reading_worlds": 0, "sft.rag_questions": 0, "sft.multi_hop_worlds": 0,
    "sft.min_read_accuracy": 0.0,
}
RUNS = ("grpo", "ppo", "ppo_no_masks")
SEEDS = 2


def _table_rows(text: str) -> dict[str, dict[str, str]]:
  """{first cell: {column header: cell}} of a markdown table."""
  lines = [line for line in text.splitlines() if line.startswith("|")]
  assert len(lines) >= 3 and set(lines[1].replace("|", "")) == {"-"}
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
  assert all(len(c) == len(cells[0]) for c in cells)
  return {c[0]: dict(zip(cells[0][1:], c[1:])) for c in cells[2:]}


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
  root = tmp_path_factory.mktemp("tables")
  results = paper_tables.run_tables(root, preset="tiny", overrides=MICRO, run_names=RUNS, num_examples=4,
                                    seeds=SEEDS, progress=False)
  return root, results


def _records_em(path) -> dict[tuple[str, str], float]:
  out = {}
  for line in path.read_text().splitlines():
    r = json.loads(line)
    if r["method"] == "agent":
      out[(r["data_source"], r["example_id"])] = r["scores"]["em"]
  return out


@pytest.mark.slow
def test_every_seed_run_starts_from_the_one_warm_up(tables):
  _, results = tables
  assert set(results["runs"]) == set(RUNS)
  warm = results["warmups"][0]["sha256"]
  for run in results["runs"].values():
    assert [(r["warmup"], r["seed"]) for r in run["seeds"]] == [(0, 0), (0, 1)]
    assert all(r["start_sha256"] == warm and r["starts_from_its_warmup"] for r in run["seeds"])
  assert results["runs"]["grpo"]["overrides"] == {} and results["runs"]["ppo_no_masks"]["overrides"] == {
      "algorithm.advantage_mask": "response", "algorithm.loss_mask": "response"}


@pytest.mark.slow
def test_row_statistics_and_paired_differences_match_the_records(tables):
  """Means over seeds and the paired difference to GRPO recomputed from every seed run's records.jsonl."""
  root, results = tables
  per_run = {}
  for name in RUNS:
    seeds = [_records_em(root / "eval" / name / f"warmup0_seed{k}" / "records.jsonl") for k in range(SEEDS)]
    assert all(set(s) == set(seeds[0]) for s in seeds)
    per_run[name] = sum(sum(s.values()) / len(s) for s in seeds) / SEEDS
  for name in RUNS:
    m = results["runs"][name]["metrics"]
    assert m["avg_em"] == pytest.approx(per_run[name])
    assert m["paired"]["mean"] == pytest.approx(per_run[name] - per_run["grpo"])
    assert m["interval"]["low"] <= m["avg_em"] <= m["interval"]["high"]
    assert len(m["per_seed_avg_em"]) == SEEDS
  assert results["runs"]["ppo_no_masks"]["table4"]["paired"]["mean"] == pytest.approx(per_run["ppo_no_masks"]
                                                                                        - per_run["ppo"])


@pytest.mark.slow
def test_tables_parse_with_one_row_per_method(tables):
  root, results = tables
  table3 = _table_rows((root / "table3.md").read_text())
  assert list(table3) == ["Base Tool Call", "Naive RAG", "No Retrieval", "GRPO", "PPO"]
  table4 = _table_rows((root / "table4.md").read_text())
  assert list(table4) == ["PPO", "PPO w/o advantage and loss masks", "GRPO"]
  grpo = results["runs"]["grpo"]["metrics"]
  assert table3["GRPO"]["EM avg. [95% CI]"] == (f"{grpo['avg_em']:.4f} [{grpo['interval']['low']:.4f}, "
                                                f"{grpo['interval']['high']:.4f}]")
  assert table3["GRPO"]["EM bridge"] == f"{grpo['em_type']['bridge']:.4f}"  # the tiny world asks bridge questions
  assert table3["GRPO"]["vs GRPO [95% CI]"] == "+0.0000 [+0.0000, +0.0000]"
  assert table3["PPO"]["paper EM avg. (Qwen2.5-3B)"] == "0.3719"
  assert table4["GRPO"]["paper EM avg. (Qwen2.5-3B)"] == "0.3877" and table4["PPO"]["vs unablated [95% CI]"] == (
      "+0.0000 [+0.0000, +0.0000]")
  assert table3["GRPO"]["seeds"] == str(SEEDS)
  for row in {**table3, **table4}.values():
    values = [float(c) for k, c in row.items() if k.startswith(("EM ", "substring", "F1")) and " [" not in c
              and c != "-"]
    assert all(0.0 <= v <= 1.0 for v in values), row
  assert json.loads((root / "results.json").read_text())["runs"].keys() == set(RUNS)
  assert (root / "em_curves.png").stat().st_size > 10_000


@pytest.mark.slow
def test_a_rerun_reuses_every_finished_run_and_a_new_seed_trains_alone(tables, monkeypatch):
  root, results = tables

  def refuse(*args, **kwargs):
    raise AssertionError("a finished run or evaluation was repeated")

  with monkeypatch.context() as patch:
    patch.setattr(trainer, "train", refuse)
    patch.setattr(pipeline, "run", refuse)
    again = paper_tables.run_tables(root, preset="tiny", overrides=MICRO, run_names=RUNS, num_examples=4,
                                    seeds=SEEDS, progress=False)
  assert all(r["reused"] for run in again["runs"].values() for r in run["seeds"])
  assert {k: r["metrics"] for k, r in again["runs"].items()} == {k: r["metrics"] for k, r in results["runs"].items()}
  trained = []
  original = trainer.train
  monkeypatch.setattr(trainer, "train", lambda c, workdir: trained.append(str(workdir)) or original(c, workdir))
  more = paper_tables.run_tables(root, preset="tiny", overrides=MICRO, run_names=("grpo",), num_examples=4,
                                 seeds=SEEDS + 1, progress=False)
  assert [p.rsplit("/", 2)[-2:] for p in trained] == [["grpo", f"warmup0_seed{SEEDS}"]]
  assert [r["reused"] for r in more["runs"]["grpo"]["seeds"]] == [True] * SEEDS + [False]


@pytest.mark.slow
def test_an_average_over_one_set_reuses_every_run(tables, monkeypatch):
  """`data.average_over` changes only the tables: the same runs, averaged over the multi-hop set alone."""
  root, results = tables

  def refuse(*args, **kwargs):
    raise AssertionError("a finished run or evaluation was repeated")

  monkeypatch.setattr(trainer, "train", refuse)
  monkeypatch.setattr(pipeline, "run", refuse)
  overrides = {**MICRO, "data.average_over": ("synthetic_multihop",)}
  again = paper_tables.run_tables(root, preset="tiny", overrides=overrides, run_names=RUNS, num_examples=4,
                                  seeds=SEEDS, progress=False)
  assert results["average_over"] == ["synthetic_multihop", "synthetic_one_hop"]
  assert again["average_over"] == ["synthetic_multihop"]
  for name in RUNS:
    seeds = [_records_em(root / "eval" / name / f"warmup0_seed{k}" / "records.jsonl") for k in range(SEEDS)]
    multi = [[v for (source, _), v in s.items() if source == "synthetic_multihop"] for s in seeds]
    assert again["runs"][name]["metrics"]["avg_em"] == pytest.approx(float(np.mean(multi)))
    assert again["runs"][name]["metrics"]["em"] == results["runs"][name]["metrics"]["em"]


def test_cli_refuses_an_average_over_a_set_the_task_does_not_evaluate(tmp_path):
  out = subprocess.run([sys.executable, "-m", "agent_r1_jax.experiments.paper_tables", f"--workdir={tmp_path}",
                        "--config.data.average_over=('musique',)"], capture_output=True, text=True, timeout=120,
                       cwd=paths.REPO_ROOT)
  assert out.returncode == 2 and "data.average_over names ['musique']" in out.stderr, out.stderr[-2000:]
  assert "Traceback" not in out.stderr and not (tmp_path / "warmup").exists()


def test_cli_refuses_an_unknown_run_in_one_line(tmp_path):
  out = subprocess.run([sys.executable, "-m", "agent_r1_jax.experiments.paper_tables", f"--workdir={tmp_path}",
                        "--runs=grpo,dpo"], capture_output=True, text=True, timeout=120, cwd=paths.REPO_ROOT)
  assert out.returncode == 2 and "unknown run(s) ['dpo']" in out.stderr and "Traceback" not in out.stderr
