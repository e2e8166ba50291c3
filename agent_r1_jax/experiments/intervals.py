"""Confidence intervals for EM over warm-ups, RL seeds and held-out questions, paired differences between
algorithms, and the rule that picks the interval the tables print.

Data. A row's result is a score array `x[w, s, q]` in [0, 1]: the run with RL seed index s from warm-up w, on
held-out question q. Every row is evaluated on the same questions, and every algorithm runs the same RL seed
indices from the same warm-ups (a baseline has one evaluation per warm-up: `[W, 1, Q]`). The questions fall into
G question sets (the averaged data sets, `sets`: one label per question); "EM avg." is the unweighted mean over
the sets of each set's EM, as the paper's Avg. is the mean over its three multi-hop sets, so question q of set g
weighs `v_q = 1 / (G n_g)` and a row's EM is

    m = mean_{w, s} sum_q v_q x[w, s, q]        (the plain mean over questions when the sets are equal in size).

Pairing. A difference A - B is taken on everything the two rows share: `D[w, s, q] = A[w, s, q] - B[w, s, q]`,
the same warm-up, the same RL seed index and the same question (a one-evaluation side is broadcast over the
other's seeds), and every interval of a difference is that of D. A row against itself has D = 0, so its
difference and every resample of it are exactly 0. A row's own interval is that of D = x.

* `t_interval`: the warm-up means `d_w = mean_s sum_q v_q D[w, s, q]` and d +- t_{W-1, (1+c)/2} sd(d_w) / sqrt(W).
  Exact for normal warm-up means, whatever the warm-up x algorithm effect. It holds the questions fixed (every
  warm-up answers the same ones): an interval for these held-out questions. Needs W >= 2.
* `bootstrap_interval`: the nested percentile bootstrap. Resample b draws W warm-ups with replacement, S seed
  indices with replacement for each drawn warm-up, and within each set g its n_g questions with replacement; the
  same draws serve both sides of a difference. It also covers the question draw, but it cannot see more spread
  between warm-ups than the W drawn show: its warm-up variance is (W-1)/W of theirs and its quantiles are normal
  where t_{W-1} ones are due. With 2 warm-ups its warm-up level is little more than the two values' range. Where
  per-answer noise dominates it is conservative instead (that noise enters both the unit and the question draw).
* `seed_t_interval`: with one warm-up, the seed means `d_s = sum_q v_q D[0, s, q]` and d +- t_{S-1, (1+c)/2}
  sd(d_s) / sqrt(S): an interval given that warm-up (and these questions), for what another RL seed from it would
  give. It says nothing of another warm-up (two warm-ups of one recipe have ended RL at 0.68 and 0.26). Needs S >= 2.
* `table_interval` (what the tables print): the bootstrap from `MIN_BOOTSTRAP_WARMUPS` warm-ups on, the
  t-interval over warm-ups below that; with one warm-up the t-interval over its seeds, given it, and none ("n/a")
  with one warm-up and one run, where nothing bounds any spread.
  The threshold is where the bootstrap's worst case, a warm-up level that is all the noise, covers within ~1.5
  points of nominal: P(|t_{W-1}| < 1.96 sqrt((W-1)/W)) is 93.6% at 30 warm-ups (92.9% at 20, 60% at 2).
  Simulated with true difference 0 (tests/test_intervals.py's `_null_differences`, 3 seeds, 200 questions, 1,000
  tables per W), a warm-up x algorithm effect of sd 0.15 let the bootstrap hold 0 in 64% of tables at 2
  warm-ups, 87% at 5, 94.5% at 30 (sd 0.05: 86% at 2), the t-interval in 94-96% at every W.

Resampling draws `u ~ U[0, 1)` from `np.random.default_rng(seed)`, Q + W + W*S of them per resample, in resample
order: question slot k of set g takes the set's floor(u * n_g)-th question, warm-up slot i the floor(u * W)-th
warm-up, seed slot (i, j) the floor(u * S)-th seed. A double is one 64-bit word of the generator, so drawing
`chunk` resamples at a time gives the same numbers as drawing all B at once; memory is O(chunk * (Q + W*S)), not
the O(B * W * S * Q) of gathering every resample's scores (2000 x 3 x 50,000 doubles, 2.4 GB, at full
evaluation size). tests/test_intervals.py reproduces the draws with loops.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from scipy import stats

MIN_BOOTSTRAP_WARMUPS = 30
RESAMPLES = 2000
CHUNK_DOUBLES = 1 << 20  # per array of a chunk: ~8 MB


@dataclasses.dataclass(frozen=True)
class Interval:
  """A point estimate and its interval at `confidence` by `method` ("bootstrap", "t" over warm-ups, "t-seeds" over
  the seeds of one warm-up, or "n/a" with `low` and `high` None) from `warmups` warm-ups of `seeds` runs each."""
  mean: float
  low: float | None
  high: float | None
  confidence: float
  method: str
  warmups: int
  seeds: int = 1

  def excludes_zero(self) -> bool:
    return self.low is not None and (self.low > 0.0 or self.high < 0.0)

  def as_dict(self) -> dict[str, float | str | int | None]:
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


def paired_scores(a, b) -> np.ndarray:
  """`D[w, s, q] = a[w, s, q] - b[w, s, q]`, a side with one seed run per warm-up broadcast over the other's.

  Raises:
    ValueError: the sides differ in questions or warm-ups, or both have several seeds and not the same number.
  """
  a, b = _scores(a), _scores(b)
  if a.shape[2] != b.shape[2]:
    raise ValueError(f"a paired difference needs the same questions: {a.shape[2]} vs {b.shape[2]} columns")
  if a.shape[0] != b.shape[0]:
    raise ValueError(f"a paired difference needs runs from the same warm-ups: {a.shape[0]} vs {b.shape[0]}")
  if 1 not in (a.shape[1], b.shape[1]) and a.shape[1] != b.shape[1]:
    raise ValueError(f"a paired difference needs the same RL seeds per warm-up: {a.shape[1]} vs {b.shape[1]}")
  return a - b


def _set_labels(sets: Sequence | None, n_questions: int) -> np.ndarray:
  """`[Q]` set indices 0..G-1 of the questions (`sets`: a label per question; None: one set)."""
  if sets is None:
    return np.zeros(n_questions, np.int64)
  labels = np.unique(np.asarray(sets), return_inverse=True)[1].reshape(-1)
  if labels.size != n_questions:
    raise ValueError(f"sets labels {labels.size} questions, the scores hold {n_questions}")
  return labels


def set_weights(sets: Sequence | None, n_questions: int) -> np.ndarray:
  """`[Q]` weights `v_q = 1 / (G n_g)` of the unweighted mean over the G sets (module docstring)."""
  labels = _set_labels(sets, n_questions)
  counts = np.bincount(labels)
  return 1.0 / (counts.size * counts[labels])


def _estimate(d: np.ndarray, v: np.ndarray) -> float:
  return float((d.mean(axis=1) @ v).mean())


def _t(means: np.ndarray, confidence: float) -> tuple[float, float | None, float | None]:
  """(mean, low, high) of the t-interval over the unit means `means` (None bounds for one unit)."""
  mean, n = float(means.mean()), means.size
  if n == 1:
    return mean, None, None
  half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1) * means.std(ddof=1) / np.sqrt(n))
  return mean, mean - half, mean + half


def t_interval(d, confidence: float = 0.95, sets: Sequence | None = None) -> Interval:
  """The t-interval over the warm-up means of `d` (module docstring); "n/a" with one warm-up."""
  d = _scores(d)
  warmup_means = d.mean(axis=1) @ set_weights(sets, d.shape[2])            # [W]
  mean, low, high = _t(warmup_means, confidence)
  return Interval(mean, low, high, confidence, "n/a" if low is None else "t", d.shape[0], d.shape[1])


def seed_t_interval(d, confidence: float = 0.95, sets: Sequence | None = None) -> Interval:
  """The t-interval over the seed means of `d`'s one warm-up, given that warm-up (module docstring); "n/a" with
  one seed run."""
  d = _scores(d)
  if d.shape[0] != 1:
    raise ValueError(f"the interval over seeds is given one warm-up, the scores hold {d.shape[0]}: use t_interval")
  seed_means = d[0] @ set_weights(sets, d.shape[2])                         # [S]
  mean, low, high = _t(seed_means, confidence)
  return Interval(mean, low, high, confidence, "n/a" if low is None else "t-seeds", 1, d.shape[1])


def _question_slots(sets: Sequence | None, n_questions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`(members, start, size)` per question slot k: slot k draws `members[start[k] + floor(u * size[k])]`, a
  question of its own set."""
  labels = _set_labels(sets, n_questions)
  members = np.argsort(labels, kind="stable")
  counts = np.bincount(labels)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  return members, starts[labels], counts[labels]


def _index(u: np.ndarray, n) -> np.ndarray:
  """floor(u * n), kept below n where rounding reaches it."""
  return np.minimum((u * n).astype(np.int64), np.asarray(n) - 1)


def resampled_means(d, resamples: int = RESAMPLES, seed: int = 0, sets: Sequence | None = None,
                    chunk: int | None = None) -> np.ndarray:
  """`[B]` estimates m_b of the nested bootstrap of `d` (module docstring), `chunk` resamples at a time (default:
  ~`CHUNK_DOUBLES` doubles per array).

  Resample b: unit counts N_b[w*S + s] = #{(i, j): warm-up draw i is w, its seed draw j is s} / (W S), and
  m_b = sum_k v_k (N_b X)[question draw k] with X = d as `[W*S, Q]`.
  """
  d = _scores(d)
  n_warmups, n_seeds, n_questions = d.shape
  units, width = n_warmups * n_seeds, n_questions + n_warmups + n_warmups * n_seeds
  chunk = chunk or max(1, CHUNK_DOUBLES // width)
  v = set_weights(sets, n_questions)
  members, start, size = _question_slots(sets, n_questions)
  x = d.reshape(units, n_questions)
  rng = np.random.default_rng(seed)
  out = np.empty(resamples)
  for lo in range(0, resamples, chunk):
    c = min(chunk, resamples - lo)
    u = rng.random((c, width))
    questions = members[start + _index(u[:, :n_questions], size)]                            # [c, Q]
    warmups = _index(u[:, n_questions:n_questions + n_warmups], n_warmups)                    # [c, W]
    seeds = _index(u[:, n_questions + n_warmups:], n_seeds).reshape(c, n_warmups, n_seeds)   # [c, W, S]
    drawn_units = (warmups[:, :, None] * n_seeds + seeds).reshape(c, units) + units * np.arange(c)[:, None]
    counts = np.bincount(drawn_units.ravel(), minlength=c * units).reshape(c, units) / units  # [c, W*S]
    # einsum, not BLAS: BLAS picks its kernel by shape, so a resample's rounding would depend on the chunk.
    unit_means = np.einsum("cu,uq->cq", counts, x)                                          # [c, Q]
    out[lo:lo + c] = np.einsum("cq,q->c", np.take_along_axis(unit_means, questions, axis=1), v)
  return out


def bootstrap_interval(d, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = 0,
                       sets: Sequence | None = None, chunk: int | None = None) -> Interval:
  """The nested percentile bootstrap interval of `d`'s estimate (module docstring)."""
  d = _scores(d)
  alpha = (1 - confidence) / 2
  low, high = np.quantile(resampled_means(d, resamples, seed, sets, chunk), [alpha, 1 - alpha])
  return Interval(_estimate(d, set_weights(sets, d.shape[2])), float(low), float(high), confidence, "bootstrap",
                  d.shape[0], d.shape[1])


def table_interval(d, confidence: float = 0.95, sets: Sequence | None = None, **bootstrap) -> Interval:
  """The interval the tables print for `d` (a row's scores, or `paired_scores`): the bootstrap from
  `MIN_BOOTSTRAP_WARMUPS` warm-ups on, the t-interval over warm-up means below, over the seeds given the warm-up
  with one warm-up, n/a with one run."""
  d = _scores(d)
  if d.shape[0] >= MIN_BOOTSTRAP_WARMUPS:
    return bootstrap_interval(d, confidence, sets=sets, **bootstrap)
  if d.shape[0] == 1:
    return seed_t_interval(d, confidence, sets)
  return t_interval(d, confidence, sets)


def format_interval(interval: Interval, signed: bool = False) -> str:
  """`0.6120 [0.5840, 0.6410] (t, 3 warm-ups)`, `+0.0310 [...]` for a difference, `0.6120 [...] (t over 3 seeds,
  given 1 warm-up)`, `0.6120 (n/a, 1 warm-up, 1 run)`."""
  sign = "+" if signed else ""
  warmups = f"{interval.warmups} warm-up{'s' if interval.warmups != 1 else ''}"
  method = {"t-seeds": f"(t over {interval.seeds} seeds, given {warmups})",
            "n/a": f"(n/a, {warmups}, {interval.seeds} run{'s' if interval.seeds != 1 else ''})"}.get(
                interval.method, f"({interval.method}, {warmups})")
  if interval.low is None:
    return f"{interval.mean:{sign}.4f} {method}"
  return f"{interval.mean:{sign}.4f} [{interval.low:{sign}.4f}, {interval.high:{sign}.4f}] {method}"
