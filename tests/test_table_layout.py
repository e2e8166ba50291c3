"""`experiments.table_layout`: `row_stats` with `data.average_over` (the average, its interval and the paired
difference cover the averaged sets alone, every set keeps its EM column, a set no evaluation holds is refused);
"EM avg." is one figure, the unweighted mean over the sets, in the cell, `avg_em` and the interval; runs grouped
by warm-up and RL seed (`score_matrix`), a row against itself exactly 0, and every table line naming its interval
method."""

from __future__ import annotations

import numpy as np
import pytest

from agent_r1_jax.experiments import intervals
from agent_r1_jax.experiments.table_layout import SeedEval, markdown_table, row_stats, score_matrix


def _seed_eval(per_set: dict[str, list[float]], warmup: int = 0, seed: int = 0) -> SeedEval:
  calls = {"multi": 2.0, "one": 1.0}
  summaries = {d: {"em": float(np.mean(v)), "substring_acc": float(np.mean(v)), "f1": float(np.mean(v)),
                   "tool_calls": calls[d]} for d, v in per_set.items()}
  return SeedEval(summaries, {(d, f"q{i}"): x for d, v in per_set.items() for i, x in enumerate(v)}, warmup, seed)


# Two seeds of a row on two sets of two questions: set "multi" EM 0.5 and 0.0, set "one" EM 1.0 in both.
ROW = [_seed_eval({"multi": [1.0, 0.0], "one": [1.0, 1.0]}, seed=0),
       _seed_eval({"multi": [0.0, 0.0], "one": [1.0, 1.0]}, seed=1)]
ZERO = [_seed_eval({"multi": [0.0, 0.0], "one": [0.0, 0.0]}, seed=s) for s in range(2)]


def _table_cells(text: str) -> dict[str, dict[str, str]]:
  lines = [line for line in text.splitlines() if line.startswith("|")]
  cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
  return {c[0]: dict(zip(cells[0][1:], c[1:])) for c in cells[2:]}


def test_the_average_over_one_set_ignores_the_other():
  only = row_stats(ROW, ZERO, over=("multi",))
  both = row_stats(ROW, ZERO)
  # Hand-computed: seed averages (0.5 + 0.0) / 2 over "multi" alone, ((0.5 + 1) / 2 + (0 + 1) / 2) / 2 over both.
  assert only["avg_em"] == pytest.approx(0.25) and only["per_seed_avg_em"] == pytest.approx([0.5, 0.0])
  assert both["avg_em"] == pytest.approx(0.625)
  assert only["em"] == both["em"] == pytest.approx({"multi": 0.25, "one": 1.0})  # every set keeps its column
  assert (only["f1"], only["substring_acc"], only["tool_calls"]) == pytest.approx((0.25, 0.25, 2.0))
  assert (both["f1"], both["tool_calls"]) == pytest.approx((0.625, 1.5))
  assert only["paired"]["mean"] == pytest.approx(0.25) and both["paired"]["mean"] == pytest.approx(0.625)
  # One warm-up: the t-interval over its two seeds' "multi" EM, 0.5 and 0.0: sd 0.35355, t_{1, 0.975} = 12.706,
  # half-width 12.706 x 0.35355 / sqrt(2) = 3.1765, given the warm-up, said so.
  assert only["interval"] == {"mean": pytest.approx(0.25), "low": pytest.approx(0.25 - 3.1765, abs=1e-4),
                              "high": pytest.approx(0.25 + 3.1765, abs=1e-4), "confidence": 0.95,
                              "method": "t-seeds", "warmups": 1, "seeds": 2}


def test_an_average_over_a_set_no_evaluation_holds_is_refused():
  with pytest.raises(ValueError, match=r"data.average_over names \['musique'\].*hold \['multi', 'one'\]"):
    row_stats(ROW, None, over=("musique",))


def test_em_avg_is_one_figure_with_sets_of_different_sizes():
  """Set "multi" has 4 questions, "one" 1; two warm-ups. Each run's EM avg., hand-computed unweighted over the
  sets: (0.75 + 1) / 2 = 0.875 and (0.25 + 1) / 2 = 0.625, mean 0.75: the figure in `avg_em`, in the interval and
  in the cell. Control: weighing the questions alike (what the cell showed before) gives (4/5 + 2/5) / 2 = 0.6."""
  runs = [_seed_eval({"multi": [1.0, 1.0, 1.0, 0.0], "one": [1.0]}, warmup=0),
          _seed_eval({"multi": [1.0, 0.0, 0.0, 0.0], "one": [1.0]}, warmup=1)]
  stats = row_stats(runs)
  assert stats["per_seed_avg_em"] == pytest.approx([0.875, 0.625])
  assert stats["avg_em"] == pytest.approx(0.75) and stats["interval"]["mean"] == pytest.approx(0.75)
  cell = _table_cells(markdown_table([("row", stats, None)], "x"))["row"]["EM avg. [95% CI] (method)"]
  assert cell.startswith("0.7500 [")
  assert score_matrix(runs).mean() == pytest.approx(0.6)


def test_runs_are_grouped_by_warmup_and_rl_seed():
  """Runs listed out of order land in `[warm-ups, seeds, questions]` by warm-up and by RL seed index; the row's
  interval is the t over its two warm-up means (0.75 and 0.25: half-width 12.7062 x 0.35355 / sqrt(2)); the
  difference to a baseline (one evaluation per warm-up) is broadcast over the seeds; warm-ups with different RL
  seeds are refused, as is a reference with other seeds."""
  w0s0, w0s1 = _seed_eval({"one": [1.0, 1.0]}, 0, 0), _seed_eval({"one": [1.0, 0.0]}, 0, 1)
  w1s0, w1s1 = _seed_eval({"one": [0.0, 0.0]}, 1, 0), _seed_eval({"one": [0.0, 1.0]}, 1, 1)
  x = score_matrix([w1s1, w0s1, w1s0, w0s0])
  np.testing.assert_array_equal(x, [[[1.0, 1.0], [1.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]]])
  stats = row_stats([w1s1, w0s1, w1s0, w0s0], [w0s1, w1s1])
  assert stats["interval"]["method"] == "t"
  assert stats["interval"]["high"] - stats["interval"]["low"] == pytest.approx(2 * 12.7062 * 0.5 / 2, abs=1e-3)
  assert stats["paired"] == pytest.approx(intervals.t_interval(x - x[:, 1:]).as_dict())
  with pytest.raises(ValueError, match=r"same RL seeds, each run once, got \{0: \[0, 1\], 1: \[0\]\}"):
    score_matrix([w0s0, w0s1, w1s0])
  other = [_seed_eval({"one": [1.0, 1.0]}, w, s) for w in (0, 1) for s in (1, 2)]
  with pytest.raises(ValueError, match="same RL seeds from the same warm-ups"):
    row_stats([w0s0, w0s1, w1s0, w1s1], other)


def _varied_runs() -> list[SeedEval]:
  """Three warm-ups of two seed runs whose EM differs by question, seed and warm-up."""
  rng = np.random.default_rng(0)
  return [_seed_eval({"multi": list((rng.random(6) < 0.2 + 0.3 * w).astype(float))}, w, s)
          for w in range(3) for s in range(2)]


def _relabelled(runs: list[SeedEval], warmup=lambda w: w, seed=lambda s: s) -> list[SeedEval]:
  return [SeedEval(e.summaries, e.scores, warmup(e.warmup), seed(e.seed)) for e in runs]


def test_a_row_against_itself_is_exactly_zero_and_every_line_names_its_method():
  """The row against its own runs (listed in another order, as a table's reference row is) is +0.0000 [+0.0000,
  +0.0000]. Control: the same runs with the reference's warm-up labels rotated (warm-ups paired wrongly) are not 0.
  Every interval cell names its method and warm-ups, and the footnote explains the methods."""
  runs = _varied_runs()
  stats = row_stats(runs, runs[::-1])
  assert (stats["paired"]["mean"], stats["paired"]["low"], stats["paired"]["high"]) == (0.0, 0.0, 0.0)
  wrong = row_stats(runs, _relabelled(runs, warmup=lambda w: (w + 1) % 3))["paired"]
  assert wrong["high"] - wrong["low"] > 0.1, wrong
  one, single = row_stats(runs[:2]), row_stats(runs[:1])
  table = markdown_table([("self", stats, 0.3), ("one warm-up", {**one, "paired": None}, None),
                          ("one run", {**single, "paired": None}, None)], "self")
  cells = _table_cells(table)
  assert cells["self"]["vs self [95% CI] (method)"] == "+0.0000 [+0.0000, +0.0000] (t, 3 warm-ups)"
  assert cells["self"]["EM avg. [95% CI] (method)"].endswith("] (t, 3 warm-ups)")
  assert cells["one warm-up"]["EM avg. [95% CI] (method)"].endswith("] (t over 2 seeds, given 1 warm-up)")
  assert cells["one warm-up"]["vs self [95% CI] (method)"] == "-"
  assert cells["one run"]["EM avg. [95% CI] (method)"] == f"{single['avg_em']:.4f} (n/a, 1 warm-up, 1 run)"
  assert '"t, W warm-ups": the t-interval over the W warm-up means' in table
  assert '"t over S seeds, given 1 warm-up": the t-interval over the S seed runs\' means' in table


def test_with_enough_warmups_the_bootstrap_pairs_the_rl_seeds(monkeypatch):
  """With the bootstrap threshold lowered to 3 warm-ups, `row_stats` prints the nested bootstrap, and a row against
  itself is still exactly 0 because both sides draw the same RL seed of each warm-up. Control: the reference's seed
  labels swapped (seed 0 of one side against seed 1 of the other) give a non-zero interval."""
  monkeypatch.setattr(intervals, "MIN_BOOTSTRAP_WARMUPS", 3)
  runs = _varied_runs()
  stats = row_stats(runs, runs[::-1])
  assert stats["interval"]["method"] == stats["paired"]["method"] == "bootstrap"
  assert (stats["paired"]["mean"], stats["paired"]["low"], stats["paired"]["high"]) == (0.0, 0.0, 0.0)
  wrong = row_stats(runs, _relabelled(runs, seed=lambda s: 1 - s))["paired"]
  assert wrong["method"] == "bootstrap" and wrong["high"] - wrong["low"] > 0.01, wrong
