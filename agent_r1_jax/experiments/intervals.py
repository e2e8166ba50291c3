"""Confidence intervals for EM over warm-ups, RL seeds and held-out questions, and paired differences between
algorithms.

An algorithm's result is a 0/1 (or [0, 1]) score array `x[w, s, q]`: RL seed run s from warm-up w on question q
(the same held-out questions for every run and algorithm; every warm-up has the same number of seed runs). A
`[seeds, questions]` matrix is one warm-up, `x[None]`. Its EM is the grand mean `m = mean_{w,s,q} x[w, s, q]`.
Three sources of noise move m: which warm-ups were trained, which RL seeds were run from each, and which questions
were asked. The draws nest: seed runs from one warm-up share its policy, so they are not independent of each
other, and warm-ups are the top level.

* `seed_t_interval`: m +- t_{U-1, (1+c)/2} * sd(unit means) / sqrt(U), the t-interval over the U top-level unit
  means: the S seed means with one warm-up, the W warm-up means (each over its seeds) with several. It treats the
  question set as fixed (the spread between units already includes how each does on it) and is exact for normal
  unit means; with 3 units its t quantile is 4.30, with 2 it is 12.71, so it is wide, honestly.
* `bootstrap_interval`: the percentile interval of m over B resamples that each draw W warm-ups with replacement,
  then, for each drawn warm-up, its S seed runs with replacement, and, independently, Q questions with replacement
  (a nested bootstrap), so the warm-up, seed and question noise are all in it. With few units it is narrower
  than the t-interval (the bootstrap cannot see more spread than the units show); the tables report it and
  results.json holds both. With one warm-up it is the two-level (seeds, questions) bootstrap.
* `paired_difference`: algorithm A minus algorithm B on the same questions from the same warm-ups,
  d = m_A - m_B, with the same nested bootstrap where the question draw and the warm-up draw are shared by A and B
  (pairing removes the question-difficulty and the warm-up noise both share: the difference is that of two
  algorithms started from the same policies) and each algorithm's seeds are drawn independently (seed i of A and
  of B are different runs). A and B may have different numbers of seeds per warm-up (a baseline's one evaluation
  per warm-up against an algorithm's S seed runs).

The generator is drawn in a fixed order, which tests/test_intervals.py reproduces with loops: the `[B, Q]` question
draws, then (with W > 1 only) the `[B, W]` warm-up draws, then each algorithm's `[B, W, S]` seed draws.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats


@dataclasses.dataclass(frozen=True)
class Interval:
  """A point estimate and its interval at `confidence`."""
  mean: float
  low: float
  high: float
  confidence: float

  def excludes_zero(self) -> bool:
    return self.low > 0.0 or self.high < 0.0

  def as_dict(self) -> dict[str, float]:
    return dataclasses.asdict(self)


def _scores(x) -> np.ndarray:
  """`x` as a `[warm-ups, seeds, questions]` array (a `[seeds, questions]` matrix is one warm-up)."""
  x = np.asarray(x, np.float64)
  if x.ndim == 2:
    x = x[None]
  if x.ndim != 3 or 0 in x.shape:
    raise ValueError(f"scores must be a non-empty [seeds, questions] or [warm-ups, seeds, questions] array, "
                     f"got shape {np.shape(x)}")
  return x


def seed_t_interval(x, confidence: float = 0.95) -> Interval:
  """The t-interval of the grand mean over the top-level unit means (module docstring): the seed means with one
  warm-up, the warm-up means with several; a single unit gives a zero-width interval."""
  x = _scores(x)
  unit_means = x[0].mean(axis=1) if x.shape[0] == 1 else x.mean(axis=(1, 2))
  mean, n = float(x.mean()), unit_means.size
  if n == 1:
    return Interval(mean, mean, mean, confidence)
  half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1) * unit_means.std(ddof=1) / np.sqrt(n))
  return Interval(mean, mean - half, mean + half, confidence)


def _shared_draws(n_warmups: int, n_questions: int, resamples: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """`([B, Q] question draws, [B, W] warm-up draws)`; one warm-up is always itself (no draw from `rng`)."""
  question_draws = rng.integers(0, n_questions, size=(resamples, n_questions))
  if n_warmups == 1:
    return question_draws, np.zeros((resamples, 1), np.int64)
  return question_draws, rng.integers(0, n_warmups, size=(resamples, n_warmups))


def _resampled_means(x: np.ndarray, warmup_draws: np.ndarray, question_draws: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
  """`[B]` grand means of `x[w, s, q]` over the given warm-up and question resamples and seed resamples drawn here.

  Resample b averages x[warmup_draws[b, i], seed_draws[b, i, j], question_draws[b, k]] over i, j, k: the seeds
  of each drawn warm-up are drawn from that warm-up's own runs.
  """
  n_warmups, n_seeds, _ = x.shape
  seed_draws = rng.integers(0, n_seeds, size=(question_draws.shape[0], n_warmups, n_seeds))
  rows = x[warmup_draws[:, :, None], seed_draws]                            # [B, W, S, Q]
  picked = np.take_along_axis(rows, question_draws[:, None, None, :], axis=3)  # [B, W, S, Q']
  return picked.mean(axis=(1, 2, 3))


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
  alpha = (1 - confidence) / 2
  low, high = np.quantile(values, [alpha, 1 - alpha])
  return float(low), float(high)


def bootstrap_interval(x, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
  """The nested (warm-ups, seeds, questions) percentile bootstrap interval of the grand mean (module docstring)."""
  x = _scores(x)
  rng = np.random.default_rng(seed)
  question_draws, warmup_draws = _shared_draws(x.shape[0], x.shape[2], resamples, rng)
  low, high = _percentiles(_resampled_means(x, warmup_draws, question_draws, rng), confidence)
  return Interval(float(x.mean()), low, high, confidence)


def paired_difference(a, b, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
  """m_A - m_B with the paired nested bootstrap interval: shared question and warm-up draws, independent seed
  draws (module docstring)."""
  a, b = _scores(a), _scores(b)
  if a.shape[2] != b.shape[2]:
    raise ValueError(f"a paired difference needs the same questions: {a.shape[2]} vs {b.shape[2]} columns")
  if a.shape[0] != b.shape[0]:
    raise ValueError(f"a paired difference needs runs from the same warm-ups: {a.shape[0]} vs {b.shape[0]}")
  rng = np.random.default_rng(seed)
  question_draws, warmup_draws = _shared_draws(a.shape[0], a.shape[2], resamples, rng)
  diffs = (_resampled_means(a, warmup_draws, question_draws, rng)
           - _resampled_means(b, warmup_draws, question_draws, rng))
  low, high = _percentiles(diffs, confidence)
  return Interval(float(a.mean() - b.mean()), low, high, confidence)


def format_interval(interval: Interval, signed: bool = False) -> str:
  """`0.6120 [0.5840, 0.6410]` (or `+0.0310 [...]` for a difference)."""
  sign = "+" if signed else ""
  return f"{interval.mean:{sign}.4f} [{interval.low:{sign}.4f}, {interval.high:{sign}.4f}]"
