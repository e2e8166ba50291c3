"""Confidence intervals for EM over RL seeds and held-out questions, and paired differences between algorithms.

An algorithm's result is a 0/1 (or [0, 1]) score matrix `x[s, q]`: seed s (an RL run from the shared warm-up) on
question q (the same held-out questions for every seed and algorithm). Its EM is the grand mean
`m = mean_{s,q} x[s, q]`. Two sources of noise move m: which seeds were run and which questions were asked.

* `seed_t_interval`: m +- t_{S-1, (1+c)/2} * sd(seed means) / sqrt(S), the t-interval over the S seed means.
  It treats the question set as fixed (the seed-to-seed spread already includes how each seed does on it) and
  is exact for normal seed means; with S = 3 its t quantile is 4.30, so it is wide, honestly.
* `bootstrap_interval`: the percentile interval of m over B resamples that draw S seeds with replacement and,
  independently, Q questions with replacement (a two-level bootstrap), so both the seed noise and the question
  sampling are in it. With few seeds it is narrower than the t-interval (the bootstrap cannot see more seed
  spread than the S seeds show); the tables report it and results.json holds both.
* `paired_difference`: algorithm A minus algorithm B on the same questions, d = m_A - m_B, with the same
  two-level bootstrap where the question draw is shared by A and B (pairing removes the question-difficulty
  noise both share) and each algorithm's seeds are drawn independently (seed i of A and of B are different runs).
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
  x = np.asarray(x, np.float64)
  if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
    raise ValueError(f"scores must be a non-empty [seeds, questions] matrix, got shape {x.shape}")
  return x


def seed_t_interval(x, confidence: float = 0.95) -> Interval:
  """The t-interval of the grand mean over the seed means (module docstring); one seed gives a zero-width one."""
  seed_means = _scores(x).mean(axis=1)
  mean, n = float(seed_means.mean()), seed_means.size
  if n == 1:
    return Interval(mean, mean, mean, confidence)
  half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1) * seed_means.std(ddof=1) / np.sqrt(n))
  return Interval(mean, mean - half, mean + half, confidence)


def _resampled_means(x: np.ndarray, question_draws: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """`[B]` grand means of x over B seed resamples (drawn here) and the given `[B, Q]` question resamples."""
  n_seeds = x.shape[0]
  seed_draws = rng.integers(0, n_seeds, size=(question_draws.shape[0], n_seeds))
  # mean over (s, q) of x[seed_draws[b, s], question_draws[b, q]]: gather rows, then columns.
  rows = x[seed_draws]                                            # [B, S, Q]
  picked = np.take_along_axis(rows, question_draws[:, None, :], axis=2)  # [B, S, Q']
  return picked.mean(axis=(1, 2))


def bootstrap_interval(x, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
  """The two-level (seeds, questions) percentile bootstrap interval of the grand mean (module docstring)."""
  x = _scores(x)
  rng = np.random.default_rng(seed)
  question_draws = rng.integers(0, x.shape[1], size=(resamples, x.shape[1]))
  means = _resampled_means(x, question_draws, rng)
  alpha = (1 - confidence) / 2
  low, high = np.quantile(means, [alpha, 1 - alpha])
  return Interval(float(x.mean()), float(low), float(high), confidence)


def paired_difference(a, b, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
  """m_A - m_B with the paired two-level bootstrap interval (shared question draws, independent seed draws)."""
  a, b = _scores(a), _scores(b)
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"a paired difference needs the same questions: {a.shape[1]} vs {b.shape[1]} columns")
  rng = np.random.default_rng(seed)
  question_draws = rng.integers(0, a.shape[1], size=(resamples, a.shape[1]))
  diffs = _resampled_means(a, question_draws, rng) - _resampled_means(b, question_draws, rng)
  alpha = (1 - confidence) / 2
  low, high = np.quantile(diffs, [alpha, 1 - alpha])
  return Interval(float(a.mean() - b.mean()), float(low), float(high), confidence)


def format_interval(interval: Interval, signed: bool = False) -> str:
  """`0.6120 [0.5840, 0.6410]` (or `+0.0310 [...]` for a difference)."""
  sign = "+" if signed else ""
  return f"{interval.mean:{sign}.4f} [{interval.low:{sign}.4f}, {interval.high:{sign}.4f}]"
