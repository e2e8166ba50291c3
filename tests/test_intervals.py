"""`experiments.intervals` against hand-computed t-intervals, a plain-loop (nested) bootstrap, its coverage, and the
properties pairing must have: the shared question difficulty and the shared warm-up both drop out of a difference."""

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


def test_with_several_warmups_the_t_interval_is_over_the_warmup_means():
  """Warm-up 0's seeds score 0.9 and 0.7 (mean 0.8), warm-up 1's 0.5 and 0.3 (mean 0.4): the interval is over the two
  warm-up means, mean 0.6, sd 0.28284, t_{1, 0.975} = 12.706 (a t table), half-width 12.706 * 0.28284 / sqrt(2)
  = 2.5412; the four seed means taken as one warm-up would give a far narrower (and wrong) one."""
  x = np.array([[[0.9] * 4, [0.7] * 4], [[0.5] * 4, [0.3] * 4]])
  iv = intervals.seed_t_interval(x)
  assert iv.mean == pytest.approx(0.6)
  assert (iv.low, iv.high) == pytest.approx((0.6 - 2.5412, 0.6 + 2.5412), abs=1e-4)
  flat = intervals.seed_t_interval(x.reshape(4, 4))
  assert flat.high - flat.low < 0.5 * (iv.high - iv.low)


def _loop_bootstrap(x, resamples, seed, confidence=0.95):
  """The bootstrap of `x[w][s][q]` written as loops, drawing from the generator in the documented order: questions,
  then warm-ups (only with several), then the seeds of each drawn warm-up slot."""
  rng = np.random.default_rng(seed)
  n_warmups, n_seeds, n_questions = len(x), len(x[0]), len(x[0][0])
  question_draws = rng.integers(0, n_questions, size=(resamples, n_questions))
  warmup_draws = (rng.integers(0, n_warmups, size=(resamples, n_warmups)) if n_warmups > 1
                  else [[0]] * resamples)
  seed_draws = rng.integers(0, n_seeds, size=(resamples, n_warmups, n_seeds))
  means = []
  for b in range(resamples):
    total = 0.0
    for i, w in enumerate(warmup_draws[b]):
      for s in seed_draws[b][i]:
        for q in question_draws[b]:
          total += x[w][s][q]
    means.append(total / (n_warmups * n_seeds * n_questions))
  alpha = (1 - confidence) / 2
  return np.quantile(means, [alpha, 1 - alpha])


def test_the_bootstrap_equals_a_plain_loop():
  rng = np.random.default_rng(3)
  x = (rng.random((3, 17)) < 0.6).astype(float)
  iv = intervals.bootstrap_interval(x, resamples=300, seed=11)
  low, high = _loop_bootstrap(x[None].tolist(), 300, 11)
  assert (iv.low, iv.high) == pytest.approx((low, high), abs=1e-12)
  assert iv.mean == pytest.approx(x.mean())
  assert intervals.bootstrap_interval(np.ones((2, 5))).as_dict() == {"mean": 1.0, "low": 1.0, "high": 1.0,
                                                                     "confidence": 0.95}


def test_the_nested_bootstrap_equals_a_plain_loop():
  """Three warm-ups of different strength, two seeds each: the nested draws match the loop, and a [seeds,
  questions] matrix is the same as its one-warm-up array."""
  rng = np.random.default_rng(4)
  x = (rng.random((3, 2, 13)) < np.array([0.2, 0.5, 0.9])[:, None, None]).astype(float)
  iv = intervals.bootstrap_interval(x, resamples=300, seed=7)
  assert (iv.low, iv.high) == pytest.approx(tuple(_loop_bootstrap(x.tolist(), 300, 7)), abs=1e-12)
  assert iv.mean == pytest.approx(x.mean())
  assert intervals.bootstrap_interval(x[1], seed=2) == intervals.bootstrap_interval(x[1:2], seed=2)
  with pytest.raises(ValueError, match="warm-ups, seeds, questions"):
    intervals.bootstrap_interval(x[None])


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


def test_pairing_removes_the_shared_warmup():
  """Warm-up 0 is strong (0.8) and warm-up 1 weak (0.3); from each, A solves the same 10 questions in 200 that B
  never does (+0.05), and each seed run changes 3% of its warm-up's answers. Paired on the warm-ups, the interval of
  A - B excludes 0; the same runs pooled as if from one warm-up (seed draws cross the warm-up boundary) give one
  several times wider that holds 0; and the t-interval over two warm-up means of either row is wider than 1."""
  rng = np.random.default_rng(8)
  strength = np.array([0.8, 0.3])
  base = rng.random((2, 1, 200)) < strength[:, None, None]     # the warm-up's policy decides most questions
  flips = rng.random((2, 3, 200)) < 0.03                        # each seed run changes a few answers
  b = (base ^ flips).astype(float)
  b[:, :, :10] = 0.0
  a = b.copy()
  a[:, :, :10] = 1.0
  diff = intervals.paired_difference(a, b, resamples=1000)
  assert diff.mean == pytest.approx(0.05)
  assert diff.excludes_zero() and diff.high - diff.low < 0.1, diff  # ~0.07: whether the 10 questions are drawn
  pooled = intervals.paired_difference(a.reshape(6, 200), b.reshape(6, 200), resamples=1000)
  assert pooled.mean == pytest.approx(diff.mean)
  assert not pooled.excludes_zero() and pooled.high - pooled.low > 3 * (diff.high - diff.low), pooled
  row = intervals.seed_t_interval(a)
  assert row.high - row.low > 1.0
  # Fewer seeds per warm-up on one side (a baseline's one evaluation per warm-up) is allowed; other warm-ups not.
  assert intervals.paired_difference(a, b[:, :1]).mean == pytest.approx(a.mean() - b[:, 0].mean())
  with pytest.raises(ValueError, match="same warm-ups"):
    intervals.paired_difference(a, b[:1])


def test_formatting():
  iv = intervals.Interval(0.5, 0.25, 0.75, 0.95)
  assert intervals.format_interval(iv) == "0.5000 [0.2500, 0.7500]"
  assert intervals.format_interval(intervals.Interval(0.03, -0.01, 0.07, 0.95), signed=True) == (
      "+0.0300 [-0.0100, +0.0700]")
