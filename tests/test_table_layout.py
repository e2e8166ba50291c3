"""`experiments.table_layout.row_stats` with `data.average_over`: the average, its intervals and the paired
difference cover the averaged sets alone, every set keeps its EM column, and a set no evaluation holds is refused;
runs from several warm-ups are grouped by warm-up (`score_matrix`), and unbalanced warm-ups are refused."""

from __future__ import annotations

import numpy as np
import pytest

from agent_r1_jax.experiments import intervals
from agent_r1_jax.experiments.table_layout import SeedEval, row_stats, score_matrix


def _seed_eval(per_set: dict[str, list[float]], warmup: int = 0) -> SeedEval:
  calls = {"multi": 2.0, "one": 1.0}
  summaries = {d: {"em": float(np.mean(v)), "substring_acc": float(np.mean(v)), "f1": float(np.mean(v)),
                   "tool_calls": calls[d]} for d, v in per_set.items()}
  return SeedEval(summaries, {(d, f"q{i}"): x for d, v in per_set.items() for i, x in enumerate(v)}, warmup)


# Two seeds of a row on two sets of two questions: set "multi" EM 0.5 and 0.0, set "one" EM 1.0 in both.
ROW = [_seed_eval({"multi": [1.0, 0.0], "one": [1.0, 1.0]}), _seed_eval({"multi": [0.0, 0.0], "one": [1.0, 1.0]})]
ZERO = [_seed_eval({"multi": [0.0, 0.0], "one": [0.0, 0.0]})] * 2


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
  # The interval is the bootstrap of the "multi" questions' [seeds, questions] matrix alone.
  expected = intervals.bootstrap_interval(np.array([[1.0, 0.0], [0.0, 0.0]]), 0.95).as_dict()
  assert only["interval"] == pytest.approx(expected)
  assert only["t_interval"]["mean"] == pytest.approx(0.25)


def test_an_average_over_a_set_no_evaluation_holds_is_refused():
  with pytest.raises(ValueError, match=r"data.average_over names \['musique'\].*hold \['multi', 'one'\]"):
    row_stats(ROW, None, over=("musique",))


def test_runs_from_two_warmups_are_grouped_by_warmup():
  """Runs listed out of warm-up order land in `[warm-ups, seeds, questions]` by warm-up, each warm-up's runs in the
  order given; the row's intervals are the nested ones of that array; a warm-up with fewer runs is refused."""
  w0a, w0b = _seed_eval({"one": [1.0, 1.0]}, 0), _seed_eval({"one": [1.0, 0.0]}, 0)
  w1a, w1b = _seed_eval({"one": [0.0, 0.0]}, 1), _seed_eval({"one": [0.0, 1.0]}, 1)
  x = score_matrix([w1a, w0a, w1b, w0b])
  np.testing.assert_array_equal(x, [[[1.0, 1.0], [1.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]]])
  stats = row_stats([w1a, w0a, w1b, w0b], [w0b, w1b])
  assert stats["interval"] == pytest.approx(intervals.bootstrap_interval(x, 0.95).as_dict())
  assert stats["t_interval"] == pytest.approx(intervals.seed_t_interval(x, 0.95).as_dict())
  # Warm-up means 0.75 and 0.25: the t-interval is over those two, not over the four seed means.
  assert stats["t_interval"]["high"] - stats["t_interval"]["low"] == pytest.approx(2 * 12.7062 * 0.5 / 2, abs=1e-3)
  assert stats["paired"] == pytest.approx(intervals.paired_difference(x, x[:, 1:], 0.95).as_dict())
  with pytest.raises(ValueError, match=r"same number of seed runs, got \{0: 2, 1: 1\}"):
    score_matrix([w0a, w0b, w1a])
