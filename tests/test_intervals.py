"""`experiments.intervals` against a hand-computed t-interval, a plain-loop bootstrap and its coverage."""

from __future__ import annotations

import numpy as np
import pytest

from agent_r1_jax.experiments import intervals


def test_the_seed_t_interval_matches_the_hand_computed_one():
  """Seed means 1, 2, 3: mean 2, sd 1, t_{2, 0.975} = 4.3027 (a t table), half-width 4.3027 / sqrt(3) = 2.4842."""
  x = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
  iv = intervals.seed_t_interval(x)
  assert iv.mean == 2.0
  assert iv.low == pytest.approx(2.0 - 2.4842, abs=1e-4) and iv.high == pytest.approx(2.0 + 2.4842, abs=1e-4)
  one = intervals.seed_t_interval(x[:1])
  assert (one.low, one.high) == (1.0, 1.0)


def _loop_bootstrap(x, resamples, seed, confidence=0.95):
  """The two-level bootstrap written as loops, drawing from the generator in the documented order."""
  rng = np.random.default_rng(seed)
  n_seeds, n_questions = len(x), len(x[0])
  question_draws = rng.integers(0, n_questions, size=(resamples, n_questions))
  seed_draws = rng.integers(0, n_seeds, size=(resamples, n_seeds))
  means = []
  for b in range(resamples):
    total = 0.0
    for s in seed_draws[b]:
      for q in question_draws[b]:
        total += x[s][q]
    means.append(total / (n_seeds * n_questions))
  alpha = (1 - confidence) / 2
  return np.quantile(means, [alpha, 1 - alpha])


def test_the_bootstrap_equals_a_plain_loop():
  rng = np.random.default_rng(3)
  x = (rng.random((3, 17)) < 0.6).astype(float)
  iv = intervals.bootstrap_interval(x, resamples=300, seed=11)
  low, high = _loop_bootstrap(x.tolist(), 300, 11)
  assert (iv.low, iv.high) == pytest.approx((low, high), abs=1e-12)
  assert iv.mean == pytest.approx(x.mean())
  assert intervals.bootstrap_interval(np.ones((2, 5))).as_dict() == {"mean": 1.0, "low": 1.0, "high": 1.0,
                                                                     "confidence": 0.95}


def test_the_bootstrap_covers_the_true_rate_about_95_percent_of_the_time():
  """200 simulated evaluations of 150 Bernoulli(0.6) questions, 2 seeds: the interval holds 0.6 in ~95% of them."""
  rng = np.random.default_rng(0)
  covered = 0
  for i in range(200):
    x = (rng.random((2, 150)) < 0.6).astype(float)
    iv = intervals.bootstrap_interval(x, resamples=500, seed=i)
    covered += iv.low <= 0.6 <= iv.high
  assert 0.89 <= covered / 200 <= 0.99, covered


def test_pairing_removes_the_shared_question_difficulty():
  """A and B differ by one question in 40 right, on questions of very different difficulty: the paired interval of
  A - B is much narrower than the difference of two independent intervals would allow, and excludes 0 here."""
  rng = np.random.default_rng(5)
  easy = rng.random(400) < 0.5                     # half the questions everyone solves, half no one
  b = np.tile(easy.astype(float), (3, 1))
  a = b.copy()
  a[:, np.flatnonzero(~easy)[:20]] = 1.0            # A also solves 20 of the hard ones, in every seed
  diff = intervals.paired_difference(a, b, resamples=1000)
  assert diff.mean == pytest.approx(20 / 400)
  assert diff.excludes_zero() and diff.high - diff.low < 0.05
  ia, ib = intervals.bootstrap_interval(a, resamples=1000), intervals.bootstrap_interval(b, resamples=1000)
  assert ia.low < ib.high  # unpaired, the two intervals overlap
  same = intervals.paired_difference(b, b)
  assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0)
  with pytest.raises(ValueError, match="same questions"):
    intervals.paired_difference(a, b[:, :10])


def test_formatting():
  iv = intervals.Interval(0.5, 0.25, 0.75, 0.95)
  assert intervals.format_interval(iv) == "0.5000 [0.2500, 0.7500]"
  assert intervals.format_interval(intervals.Interval(0.03, -0.01, 0.07, 0.95), signed=True) == (
      "+0.0300 [-0.0100, +0.0700]")
