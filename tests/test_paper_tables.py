"""`experiments.paper_tables` at a micro budget: one warm-up shared by every seed run, reuse on rerun (a new seed
trains alone), parsable tables naming their interval methods; and the same workdir grown to two warm-ups whose
records are replaced by EM that differs by row, warm-up, seed and question, from which every row's statistics,
paired differences and intervals are recomputed independently (the micro runs' own EM is mostly 0)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

from agent_r1_jax import paths, trainer
from agent_r1_jax.evaluation import pipeline
from agent_r1_jax.experiments import intervals, paper_tables

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


def _records_em(path, method: str = "agent") -> dict[tuple[str, str], float]:
  out = {}
  for line in path.read_text().splitlines():
    r = json.loads(line)
    if r["method"] == method:
      out[(r["data_source"], r["example_id"])] = r["scores"]["em"]
  return out


def _set_average(em: dict[tuple[str, str], float]) -> float:
  """A run's "EM avg." by hand: each set's mean, then the unweighted mean over the sets."""
  per_set: dict[str, list[float]] = {}
  for (source, _), v in em.items():
    per_set.setdefault(source, []).append(v)
  return sum(sum(v) / len(v) for v in per_set.values()) / len(per_set)


# Synthetic EM: row strength, a warm-up effect that differs by row (warm-up x algorithm), a seed effect, and each
# question's difficulty; 0/1 by a draw keyed on all four.
ROW_EFFECT = {"grpo": 0.0, "ppo": 0.15, "ppo_no_masks": -0.2, "base_tool_call": -0.3, "naive_rag": -0.35,
              "no_retrieval": -0.4}
WARMUP_EFFECT = {"grpo": -0.2, "ppo": -0.05, "ppo_no_masks": -0.35, "base_tool_call": 0.1, "naive_rag": 0.0,
                 "no_retrieval": 0.05}


def _synthetic_em(row: str, warmup: int, seed: int, source: str, example_id: str) -> float:
  key = zlib.crc32(f"{source}/{example_id}".encode())
  p = 0.5 + ROW_EFFECT[row] + WARMUP_EFFECT[row] * warmup + 0.08 * seed + 0.3 * ((key % 7) / 6 - 0.5)
  u = np.random.default_rng([zlib.crc32(row.encode()), warmup, seed, key]).random()
  return float(u < p)


def _inject(eval_dir, em_of) -> None:
  """Replaces every record's EM in `eval_dir` with `em_of(method, source, example id)` and each summary's "em" by
  the mean over its set's records."""
  records, per_set = [], {}
  for line in (eval_dir / "records.jsonl").read_text().splitlines():
    r = json.loads(line)
    r["scores"]["em"] = em_of(r["method"], r["data_source"], r["example_id"])
    per_set.setdefault((r["method"], r["data_source"]), []).append(r["scores"]["em"])
    records.append(json.dumps(r))
  (eval_dir / "records.jsonl").write_text("\n".join(records) + "\n")
  results = json.loads((eval_dir / "results.json").read_text())
  for (method, source), values in per_set.items():
    results["methods"][method][source]["em"] = sum(values) / len(values)
  (eval_dir / "results.json").write_text(json.dumps(results))


def _refuse(*args, **kwargs):
  raise AssertionError("a finished run or evaluation was repeated")


@pytest.fixture(scope="module")
def two_warmups(tables, tmp_path_factory):
  """The micro workdir copied, warm-up 0 and its runs copied as warm-up 1, every evaluation's EM replaced by
  `_synthetic_em`, and the tables rewritten from it (nothing trained or evaluated)."""
  root = tmp_path_factory.mktemp("two_warmups") / "w"
  shutil.copytree(tables[0], root)
  shutil.copytree(root / "warmup" / "seed0", root / "warmup" / "seed1")
  shutil.copytree(root / "eval" / "warmup" / "seed0", root / "eval" / "warmup" / "seed1")
  for name in RUNS:
    for k in range(SEEDS):
      for top in ("runs", "eval"):
        shutil.copytree(root / top / name / f"warmup0_seed{k}", root / top / name / f"warmup1_seed{k}")
  methods = {"agent": "base_tool_call", "naive_rag": "naive_rag", "no_retrieval": "no_retrieval"}
  for m in range(2):
    _inject(root / "eval" / "warmup" / f"seed{m}", lambda method, *q, m=m: _synthetic_em(methods[method], m, 0, *q))
    for name in RUNS:
      for k in range(SEEDS):
        _inject(root / "eval" / name / f"warmup{m}_seed{k}",
                lambda method, *q, name=name, m=m, k=k: _synthetic_em(name, m, k, *q))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(trainer, "train", _refuse)
    patch.setattr(pipeline, "run", _refuse)
    results = paper_tables.run_tables(root, preset="tiny", overrides=MICRO, run_names=RUNS, num_examples=4,
                                      seeds=SEEDS, warmup_seeds=2, progress=False)
  return root, results


def _run_averages(root, name: str) -> np.ndarray:
  """`[warm-ups, seeds]` "EM avg." of a row's runs, by hand from their records."""
  return np.array([[_set_average(_records_em(root / "eval" / name / f"warmup{m}_seed{k}/records.jsonl"))
                    for k in range(SEEDS)] for m in range(2)])


T_1_975 = 12.706204736  # t_{1, 0.975}, from a t table


def _hand_t(per_warmup: np.ndarray) -> tuple[float, float, float]:
  """(mean, low, high) of the t-interval over two warm-up figures."""
  mean = per_warmup.mean()
  half = T_1_975 * abs(per_warmup[0] - per_warmup[1]) / np.sqrt(2) / np.sqrt(2)  # sd of two = |a - b| / sqrt(2)
  return mean, mean - half, mean + half


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
def test_row_statistics_and_paired_intervals_match_the_records(two_warmups):
  """Every row's "EM avg.", its t-interval over the two warm-ups and its paired difference to GRPO (Table 3) and to
  PPO (Table 4) recomputed by hand from the injected records, which differ by row, warm-up, seed and question.
  Controls: the hand computation with PPO's two warm-ups swapped (mis-paired) misses the table's interval, and GRPO
  against itself, exactly 0, would not be 0 mis-paired."""
  root, results = two_warmups
  runs = {name: _run_averages(root, name) for name in RUNS}
  assert all(np.ptp(runs[name].mean(axis=1)) > 0.05 for name in RUNS), runs  # warm-ups differ in every row
  assert any(np.ptp(runs[name], axis=1).max() > 0 for name in RUNS), runs   # and seeds in some
  for name in RUNS:
    m = results["runs"][name]["metrics"]
    assert m["avg_em"] == pytest.approx(runs[name].mean())
    assert (m["interval"]["mean"], m["interval"]["low"], m["interval"]["high"]) == pytest.approx(
        _hand_t(runs[name].mean(axis=1)))
    assert m["interval"]["method"] == m["paired"]["method"] == "t" and m["interval"]["warmups"] == 2
    expected = _hand_t(runs[name].mean(axis=1) - runs["grpo"].mean(axis=1))
    assert (m["paired"]["mean"], m["paired"]["low"], m["paired"]["high"]) == pytest.approx(expected)
  ablation = results["runs"]["ppo_no_masks"]["table4"]["paired"]
  assert (ablation["mean"], ablation["low"], ablation["high"]) == pytest.approx(
      _hand_t(runs["ppo_no_masks"].mean(axis=1) - runs["ppo"].mean(axis=1)))
  base = [_set_average(_records_em(root / "eval" / "warmup" / f"seed{m}" / "records.jsonl")) for m in range(2)]
  paired = results["baselines"]["base_tool_call"]["paired"]
  assert (paired["mean"], paired["low"], paired["high"]) == pytest.approx(
      _hand_t(np.array(base) - runs["grpo"].mean(axis=1)))
  grpo = results["runs"]["grpo"]["metrics"]["paired"]
  assert (grpo["mean"], grpo["low"], grpo["high"]) == (0.0, 0.0, 0.0)
  assert _hand_t(runs["grpo"].mean(axis=1) - runs["grpo"].mean(axis=1)[::-1])[2] > 0.05  # control
  mispaired = _hand_t(runs["ppo"].mean(axis=1)[::-1] - runs["grpo"].mean(axis=1))
  ppo = results["runs"]["ppo"]["metrics"]["paired"]
  assert abs(mispaired[2] - ppo["high"]) > 0.05, (mispaired, ppo)  # control


@pytest.mark.slow
def test_two_warmup_tables_print_the_recomputed_intervals(two_warmups):
  root, results = two_warmups
  table3 = _table_rows((root / "table3.md").read_text())
  assert table3["GRPO"]["vs GRPO [95% CI] (method)"] == "+0.0000 [+0.0000, +0.0000] (t, 2 warm-ups)"
  ppo = results["runs"]["ppo"]["metrics"]
  assert table3["PPO"]["EM avg. [95% CI] (method)"] == (
      f"{ppo['avg_em']:.4f} [{ppo['interval']['low']:.4f}, {ppo['interval']['high']:.4f}] (t, 2 warm-ups)")
  assert table3["PPO"]["vs GRPO [95% CI] (method)"] == (
      f"{ppo['paired']['mean']:+.4f} [{ppo['paired']['low']:+.4f}, {ppo['paired']['high']:+.4f}] (t, 2 warm-ups)")
  assert table3["GRPO"]["seeds"] == str(2 * SEEDS)
  assert all(r["starts_from_its_warmup"] for run in results["runs"].values() for r in run["seeds"])


@pytest.mark.slow
def test_retabulating_from_results_alone_gives_the_intervals_of_the_records(two_warmups, tmp_path):
  """`retabulate` on the results.json alone (old-style: intervals dropped, a "t_interval" left over) rewrites the
  same intervals and table lines that `run_tables` computed from every question's record. Control: one seed run's
  "EM avg." changed in results.json moves its row's retabulated interval, so the figures are read, not copied."""
  root, results = two_warmups
  old = json.loads((root / "results.json").read_text())
  for row in [*old["baselines"].values(), *[r["metrics"] for r in old["runs"].values()]]:
    del row["interval"], row["paired"]
    row["t_interval"] = {"mean": 0.0}
  (tmp_path / "results.json").write_text(json.dumps(old))
  again = paper_tables.retabulate(tmp_path)
  for name in RUNS:
    for key in ("metrics", "table4"):
      if results["runs"][name][key] is not None:
        assert again["runs"][name][key]["interval"] == pytest.approx(results["runs"][name][key]["interval"])
        assert again["runs"][name][key]["paired"] == pytest.approx(results["runs"][name][key]["paired"])
        assert "t_interval" not in again["runs"][name][key]
  assert again["baselines"]["naive_rag"]["paired"] == pytest.approx(results["baselines"]["naive_rag"]["paired"])
  assert (tmp_path / "table3.md").read_text() == (root / "table3.md").read_text()
  old["runs"]["ppo"]["seeds"][0]["avg_em"] += 0.25
  (tmp_path / "results.json").write_text(json.dumps(old))
  moved = paper_tables.retabulate(tmp_path)["runs"]["ppo"]["metrics"]
  assert moved["interval"]["low"] != pytest.approx(results["runs"]["ppo"]["metrics"]["interval"]["low"])
  old["warmup_seeds"] = intervals.MIN_BOOTSTRAP_WARMUPS
  (tmp_path / "results.json").write_text(json.dumps(old))
  with pytest.raises(ValueError, match="needs the per-question records"):
    paper_tables.retabulate(tmp_path)


@pytest.mark.slow
def test_tables_parse_with_one_row_per_method(tables):
  root, results = tables
  table3 = _table_rows((root / "table3.md").read_text())
  assert list(table3) == ["Base Tool Call", "Naive RAG", "No Retrieval", "GRPO", "PPO"]
  table4 = _table_rows((root / "table4.md").read_text())
  assert list(table4) == ["PPO", "PPO w/o advantage and loss masks", "GRPO"]
  grpo = results["runs"]["grpo"]["metrics"]
  given = f"(t over {SEEDS} seeds, given 1 warm-up)"
  assert table3["GRPO"]["EM avg. [95% CI] (method)"].startswith(f"{grpo['avg_em']:.4f} [")
  assert table3["GRPO"]["EM avg. [95% CI] (method)"].endswith(given)
  assert table3["GRPO"]["EM bridge"] == f"{grpo['em_type']['bridge']:.4f}"  # the tiny world asks bridge questions
  assert table3["GRPO"]["vs GRPO [95% CI] (method)"] == f"+0.0000 [+0.0000, +0.0000] {given}"
  assert all(table3[b]["EM avg. [95% CI] (method)"].endswith("(n/a, 1 warm-up, 1 run)")
             for b in ("Base Tool Call", "Naive RAG", "No Retrieval"))  # one evaluation of the warm-up
  assert table3["Naive RAG"]["vs GRPO [95% CI] (method)"].endswith(given)  # paired with GRPO's seeds
  assert table3["PPO"]["paper EM avg. (Qwen2.5-3B)"] == "0.3719"
  assert table4["GRPO"]["paper EM avg. (Qwen2.5-3B)"] == "0.3877"
  assert table4["PPO"]["vs unablated [95% CI] (method)"] == f"+0.0000 [+0.0000, +0.0000] {given}"
  assert table3["GRPO"]["seeds"] == str(SEEDS)
  for row in {**table3, **table4}.values():
    values = [float(c) for k, c in row.items() if k.startswith(("EM ", "substring", "F1")) and "(" not in c
              and c != "-"]
    assert all(0.0 <= v <= 1.0 for v in values), row
  assert json.loads((root / "results.json").read_text())["runs"].keys() == set(RUNS)
  assert (root / "em_curves.png").stat().st_size > 10_000


@pytest.mark.slow
def test_a_rerun_reuses_every_finished_run_and_a_new_seed_trains_alone(tables, monkeypatch):
  root, results = tables
  with monkeypatch.context() as patch:
    patch.setattr(trainer, "train", _refuse)
    patch.setattr(pipeline, "run", _refuse)
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
  monkeypatch.setattr(trainer, "train", _refuse)
  monkeypatch.setattr(pipeline, "run", _refuse)
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
