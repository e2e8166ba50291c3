"""`experiments.intervals` against hand-computed t-intervals and set weights, a plain-loop nested bootstrap, chunked
resampling (the same draws, memory bounded by the chunk), pairing on warm-ups, seeds and questions (a row against
itself is exactly 0), and coverage: the interval the tables print covers a true difference of 0 ~95% of the time
under a warm-up x algorithm effect, where the nested bootstrap with few warm-ups does not."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from agent_r1_jax.experiments import intervals


def test_the_t_interval_is_over_warmup_means_and_matches_the_hand_computed_one():
  """Warm-up means 1, 2, 3 (each over two seeds of two questions): mean 2, sd 1, t_{2, 0.975} = 4.3027 (a t table),
  half-width 4.3027 / sqrt(3) = 2.4842. Warm-up 0's seeds 0.9 and 0.7, warm-up 1's 0.5 and 0.3: means 0.8 and 0.4,
  sd 0.28284, t_{1, 0.975} = 12.706, half-width 2.5412; the four seed means taken as four warm-ups give a far
  narrower (and wrong) one."""
  x = np.array([[[1.0, 1.0], [0.5, 1.5]], [[2.0, 2.0], [2.0, 2.0]], [[3.0, 3.0], [2.0, 4.0]]])
  iv = intervals.t_interval(x)
  assert (iv.mean, iv.method, iv.warmups) == (2.0, "t", 3)
  assert (iv.low, iv.high) == pytest.approx((2.0 - 2.4842, 2.0 + 2.4842), abs=1e-4)
  y = np.array([[[0.9] * 4, [0.7] * 4], [[0.5] * 4, [0.3] * 4]])
  two = intervals.t_interval(y)
  assert (two.low, two.high) == pytest.approx((0.6 - 2.5412, 0.6 + 2.5412), abs=1e-4)
  flat = intervals.t_interval(y.reshape(4, 1, 4))
  assert flat.high - flat.low < 0.5 * (two.high - two.low)


def test_one_warmup_gives_the_t_interval_over_its_seeds_and_one_run_none():
  """One warm-up, seed means 1, 0.5, 0 (two questions each): mean 0.5, sd 0.5, t_{2, 0.975} = 4.3027 (a t table),
  half-width 4.3027 x 0.5 / sqrt(3) = 1.2421, given that warm-up. One run alone: no interval."""
  seeds = intervals.table_interval(np.array([[[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]]))
  assert (seeds.mean, seeds.method, seeds.warmups, seeds.seeds) == (0.5, "t-seeds", 1, 3)
  assert (seeds.low, seeds.high) == pytest.approx((0.5 - 1.2421, 0.5 + 1.2421), abs=1e-4)
  assert intervals.format_interval(seeds) == "0.5000 [-0.7421, 1.7421] (t over 3 seeds, given 1 warm-up)"
  one = intervals.table_interval(np.array([[1.0, 0.0]]))
  assert (one.mean, one.low, one.high, one.method, one.warmups, one.seeds) == (0.5, None, None, "n/a", 1, 1)
  assert not one.excludes_zero()
  assert intervals.format_interval(one) == "0.5000 (n/a, 1 warm-up, 1 run)"
  with pytest.raises(ValueError, match="given one warm-up"):
    intervals.seed_t_interval(np.zeros((2, 3, 2)))


def test_em_avg_is_the_unweighted_mean_over_the_sets():
  """Set "a" has 1 question in 2 right, set "b" 4 in 4: EM avg. (0.5 + 1) / 2 = 0.75, not the question-weighted
  5 / 6; the weights are 1 / (2 x 2) and 1 / (2 x 4)."""
  sets = ["a", "a", "b", "b", "b", "b"]
  np.testing.assert_allclose(intervals.set_weights(sets, 6), [0.25, 0.25, 0.125, 0.125, 0.125, 0.125])
  x = np.array([[[1.0, 0.0, 1.0, 1.0, 1.0, 1.0]], [[1.0, 0.0, 1.0, 1.0, 1.0, 1.0]]])
  assert intervals.t_interval(x, sets=sets).mean == pytest.approx(0.75)
  assert intervals.bootstrap_interval(x, sets=sets, resamples=50).mean == pytest.approx(0.75)
  assert intervals.t_interval(x).mean == pytest.approx(5 / 6)  # control: one set weighs questions
  with pytest.raises(ValueError, match="sets labels 5 questions"):
    intervals.set_weights(sets[:5], 6)


def _loop_bootstrap(x, resamples, seed, sets):
  """The resampled estimates of `x[w][s][q]` written as loops, drawing the documented uniforms per resample:
  Q question slots (each within its own set), W warm-up slots, W x S seed slots."""
  rng = np.random.default_rng(seed)
  n_warmups, n_seeds, n_questions = len(x), len(x[0]), len(x[0][0])
  members = {g: [q for q in range(n_questions) if sets[q] == g] for g in set(sets)}
  out = []
  for _ in range(resamples):
    u = rng.random(n_questions + n_warmups + n_warmups * n_seeds)
    questions = [members[sets[k]][int(u[k] * len(members[sets[k]]))] for k in range(n_questions)]
    total = 0.0
    for i in range(n_warmups):
      w = int(u[n_questions + i] * n_warmups)
      for j in range(n_seeds):
        s = int(u[n_questions + n_warmups + i * n_seeds + j] * n_seeds)
        for k, q in enumerate(questions):  # each set's mean, then the mean over sets
          total += x[w][s][q] / (len(set(sets)) * len(members[sets[k]]))
    out.append(total / (n_warmups * n_seeds))
  return np.array(out)


def test_the_nested_bootstrap_equals_a_plain_loop():
  """Three warm-ups of different strength, two seeds each, two question sets of 5 and 8 questions."""
  rng = np.random.default_rng(4)
  x = (rng.random((3, 2, 13)) < np.array([0.2, 0.5, 0.9])[:, None, None]).astype(float)
  sets = ["m"] * 5 + ["o"] * 8
  rng.shuffle(sets)
  means = intervals.resampled_means(x, resamples=300, seed=7, sets=sets)
  np.testing.assert_allclose(means, _loop_bootstrap(x.tolist(), 300, 7, sets), rtol=0, atol=1e-12)
  iv = intervals.bootstrap_interval(x, resamples=300, seed=7, sets=sets)
  assert (iv.low, iv.high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])), abs=1e-12)
  assert iv.mean == pytest.approx(0.5 * x[..., [k for k in range(13) if sets[k] == "m"]].mean()
                                  + 0.5 * x[..., [k for k in range(13) if sets[k] == "o"]].mean())
  assert intervals.bootstrap_interval(x[1], seed=2) == intervals.bootstrap_interval(x[1:2], seed=2)
  with pytest.raises(ValueError, match="warm-ups, seeds, questions"):
    intervals.bootstrap_interval(x[None])


def test_chunked_resampling_draws_the_same_resamples():
  rng = np.random.default_rng(9)
  x = rng.random((2, 3, 101))
  whole = intervals.resampled_means(x, resamples=250, seed=3, chunk=250)
  for chunk in (1, 7, 64, 1000):
    np.testing.assert_array_equal(intervals.resampled_means(x, resamples=250, seed=3, chunk=chunk), whole)
  assert not np.array_equal(intervals.resampled_means(x, resamples=250, seed=4), whole)  # the seed matters


def _peak_bytes(x, chunk):
  tracemalloc.start()
  try:
    intervals.resampled_means(x, resamples=256, seed=0, chunk=chunk)
    return tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()


def test_resampling_memory_is_bounded_by_the_chunk():
  """20,000 questions, 256 resamples: with 4 resamples a chunk the peak allocation (the input excluded; the
  per-question weights and set indices included) stays under 10 chunk-sized arrays, 6.4 MB (4.0 MB measured), where
  all 256 at once (as the unchunked code held them) needs at least one [256, 20,000] array, 41 MB (165 MB
  measured). numpy reports its allocations to tracemalloc."""
  x = np.random.default_rng(0).random((1, 2, 20_000))
  row_bytes = 8 * (20_000 + 1 + 2)
  assert _peak_bytes(x, chunk=4) < 10 * 4 * row_bytes
  assert _peak_bytes(x, chunk=256) > 256 * 20_000 * 8  # control: the measure sees a whole-size array


def test_the_bootstrap_covers_the_true_rate_about_95_percent_of_the_time():
  """200 simulated evaluations of 150 Bernoulli(0.6) questions, 2 seeds: the interval holds 0.6 in ~95% of them."""
  rng = np.random.default_rng(0)
  covered = 0
  for i in range(200):
    x = (rng.random((2, 150)) < 0.6).astype(float)
    iv = intervals.bootstrap_interval(x, resamples=500, seed=i)
    covered += iv.low <= 0.6 <= iv.high
  assert 0.89 <= covered / 200 <= 0.99, covered


def test_a_row_against_itself_is_exactly_zero_because_seeds_are_paired():
  """Every algorithm runs RL seeds 0..S-1 from every warm-up, so the paired draws pick the same run on both sides:
  every resample of A - A is 0. Control: the same runs with one side's seeds drawn independently (its seed runs
  permuted within each warm-up, as the bootstrap drew them before) give a non-zero interval."""
  rng = np.random.default_rng(1)
  a = (rng.random((3, 3, 60)) < rng.uniform(0.3, 0.7, (3, 3, 1))).astype(float)
  same = intervals.paired_scores(a, a)
  assert not np.any(intervals.resampled_means(same, resamples=500))
  for iv in (intervals.bootstrap_interval(same), intervals.t_interval(same), intervals.table_interval(same)):
    assert (iv.mean, iv.low, iv.high) == (0.0, 0.0, 0.0)
  assert intervals.format_interval(intervals.table_interval(same), signed=True) == (
      "+0.0000 [+0.0000, +0.0000] (t, 3 warm-ups)")
  unpaired = intervals.bootstrap_interval(intervals.paired_scores(a, a[:, [1, 2, 0]]))
  assert unpaired.high - unpaired.low > 0.02, unpaired


def test_pairing_removes_the_shared_question_difficulty():
  """A and B differ by one question in 40 right, on questions of very different difficulty: the paired interval of
  A - B is much narrower than the difference of two independent intervals would allow, and excludes 0 here."""
  rng = np.random.default_rng(5)
  easy = rng.random(400) < 0.5                     # half the questions everyone solves, half no one
  b = np.tile(easy.astype(float), (3, 1))
  a = b.copy()
  a[:, np.flatnonzero(~easy)[:20]] = 1.0            # A also solves 20 of the hard ones, in every seed
  diff = intervals.bootstrap_interval(intervals.paired_scores(a, b), resamples=1000)
  assert diff.mean == pytest.approx(20 / 400)
  assert diff.excludes_zero() and diff.high - diff.low < 0.05
  ia, ib = intervals.bootstrap_interval(a, resamples=1000), intervals.bootstrap_interval(b, resamples=1000)
  assert ia.low < ib.high  # unpaired, the two intervals overlap
  with pytest.raises(ValueError, match="same questions"):
    intervals.paired_scores(a, b[:, :10])


def test_pairing_removes_the_shared_warmup():
  """Warm-up 0 is strong (0.8) and warm-up 1 weak (0.3); from each, A solves the same 10 questions in 200 that B
  never does (+0.05), and each seed run changes 3% of its warm-up's answers. Paired on the warm-ups, the bootstrap
  interval of A - B excludes 0; the same runs paired across warm-ups (A's from warm-up 0 against B's from warm-up
  1, as independent warm-up draws would) give one several times wider that holds 0; the t-interval over the two
  warm-up means of either row is wider than 1."""
  rng = np.random.default_rng(8)
  strength = np.array([0.8, 0.3])
  base = rng.random((2, 1, 200)) < strength[:, None, None]     # the warm-up's policy decides most questions
  flips = rng.random((2, 3, 200)) < 0.03                        # each seed run changes a few answers
  b = (base ^ flips).astype(float)
  b[:, :, :10] = 0.0
  a = b.copy()
  a[:, :, :10] = 1.0
  diff = intervals.bootstrap_interval(intervals.paired_scores(a, b), resamples=1000)
  assert diff.mean == pytest.approx(0.05)
  assert diff.excludes_zero() and diff.high - diff.low < 0.1, diff  # ~0.07: whether the 10 questions are drawn
  crossed = intervals.bootstrap_interval(a.reshape(6, 1, 200) - b.reshape(6, 1, 200)[[3, 4, 5, 0, 1, 2]],
                                         resamples=1000)
  assert crossed.mean == pytest.approx(diff.mean)
  assert not crossed.excludes_zero() and crossed.high - crossed.low > 3 * (diff.high - diff.low), crossed
  assert intervals.t_interval(a).high - intervals.t_interval(a).low > 1.0
  # One evaluation per warm-up on one side (a baseline) is broadcast over the other's seeds; other shapes are not.
  assert intervals.t_interval(intervals.paired_scores(a, b[:, :1])).mean == pytest.approx(a.mean() - b[:, 0].mean())
  with pytest.raises(ValueError, match="same warm-ups"):
    intervals.paired_scores(a, b[:1])
  with pytest.raises(ValueError, match="same RL seeds"):
    intervals.paired_scores(a, b[:, :2])


def _null_differences(rng, n, n_warmups, n_seeds, n_questions, effect_sd, seed_sd=0.02):
  """`[n, W, S, Q]` paired 0/1 differences of two algorithms whose true difference is 0: each question has its
  difficulty, each warm-up its strength (sd 0.1), each warm-up x algorithm its effect (sd `effect_sd`), each seed
  run its own strength (sd `seed_sd`); A and B are exchangeable."""
  difficulty = rng.uniform(0.2, 0.8, (n, 1, 1, n_questions))
  warmup = rng.normal(0.0, 0.1, (n, n_warmups, 1, 1))

  def row():
    p = (difficulty + warmup + rng.normal(0.0, effect_sd, (n, n_warmups, 1, 1))
         + rng.normal(0.0, seed_sd, (n, n_warmups, n_seeds, 1)))
    return (rng.random((n, n_warmups, n_seeds, n_questions)) < p).astype(np.float64)

  return row() - row()


def _coverage(d, interval) -> float:
  """The share of the simulated tables `d` whose `interval` holds 0."""
  return float(np.mean([iv.low <= 0.0 <= iv.high for iv in map(interval, d)]))


@pytest.mark.parametrize("n_warmups,effect_sd", [(3, 0.15), (5, 0.15), (3, 0.05)])
def test_the_printed_interval_covers_a_null_difference_95_percent_under_warmup_effects(n_warmups, effect_sd):
  """2,000 simulated tables (3 seeds, 200 questions, true difference 0): the interval the tables print (t over
  warm-up means below `MIN_BOOTSTRAP_WARMUPS`) holds 0 in 95% +- 1.5 points (3 binomial sd). Control: the nested
  bootstrap on the first 300 of them undercovers (below 90%, ~77-84% measured) where the effect dominates."""
  d = _null_differences(np.random.default_rng(n_warmups), 2000, n_warmups, 3, 200, effect_sd)
  assert n_warmups < intervals.MIN_BOOTSTRAP_WARMUPS
  assert 0.935 <= _coverage(d, intervals.table_interval) <= 0.965
  if effect_sd == 0.15:
    assert _coverage(d[:300], lambda x: intervals.bootstrap_interval(x, resamples=500)) < 0.90


def test_with_one_warmup_the_interval_covers_given_that_warmup_and_no_more():
  """One warm-up, 3 seeds, 200 questions, 2,000 simulated tables of two algorithms that differ in nothing given the
  warm-up (no warm-up x algorithm effect; a seed run's own strength, sd 0.05): the printed interval (t over the
  seeds) holds 0 in 95% +- 1.5 points. With a warm-up x algorithm effect (sd 0.15) the true difference over
  warm-ups is still 0 but this warm-up's is not, and the same interval holds 0 far less often (below 60%): it is an
  interval given the warm-up, as its label says."""
  rng = np.random.default_rng(1)
  given = _null_differences(rng, 2000, 1, 3, 200, 0.0, seed_sd=0.05)
  assert intervals.table_interval(given[0]).method == "t-seeds"
  assert 0.935 <= _coverage(given, intervals.table_interval) <= 0.965
  assert _coverage(_null_differences(rng, 2000, 1, 3, 200, 0.15), intervals.table_interval) < 0.60


def test_the_bootstrap_is_printed_where_it_covers():
  """At `MIN_BOOTSTRAP_WARMUPS` warm-ups the tables print the bootstrap, and under the dominating warm-up x
  algorithm effect (sd 0.15) it holds 0 in at least 92% of 400 simulated tables (95% measured; 92% is 2.8 binomial
  sd below 95%); with 2 warm-ups it holds 0 in under 80% of them (76.5% measured: the control)."""
  rng = np.random.default_rng(30)
  d = _null_differences(rng, 400, intervals.MIN_BOOTSTRAP_WARMUPS, 2, 100, 0.15)
  assert intervals.table_interval(d[0]).method == "bootstrap"
  assert _coverage(d, lambda x: intervals.table_interval(x, resamples=500)) >= 0.92
  two = _null_differences(rng, 400, 2, 2, 100, 0.15)
  assert _coverage(two, lambda x: intervals.bootstrap_interval(x, resamples=500)) < 0.80


def test_formatting():
  iv = intervals.Interval(0.5, 0.25, 0.75, 0.95, "t", 3)
  assert intervals.format_interval(iv) == "0.5000 [0.2500, 0.7500] (t, 3 warm-ups)"
  assert intervals.format_interval(intervals.Interval(0.03, -0.01, 0.07, 0.95, "bootstrap", 30), signed=True) == (
      "+0.0300 [-0.0100, +0.0700] (bootstrap, 30 warm-ups)")
