"""`experiments.table_layout.row_stats` with `data.average_over`: the average, its intervals and the paired
difference cover the averaged sets alone, every set keeps its EM column, and a set no evaluation holds is refused."""

from __future__ import annotations

import numpy as np
import pytest

from agent_r1_jax.experiments import intervals
from agent_r1_jax.experiments.table_layout import SeedEval, row_stats


def _seed_eval(per_set: dict[str, list[float]]) -> SeedEval:
  calls = {"multi": 2.0, "one": 1.0}
  summaries = {d: {"em": float(np.mean(v)), "substring_acc": float(np.mean(v)), "f1": float(np.mean(v)),
                   "tool_calls": calls[d]} for d, v in per_set.items()}
  return SeedEval(summaries, {(d, f"q{i}"): x for d, v in per_set.items() for i, x in enumerate(v)})


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
