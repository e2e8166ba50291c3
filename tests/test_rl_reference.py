"""Plain-Python references for the RL kernels (the paper's algorithm, written as explicit loops).

Each reference compacts the masked tokens of a row, recurses over them backwards in float64 and scatters
the result back, exactly as the paper's PyTorch code does it. The tests in this file pin the references
themselves to hand-computed cases; the other `test_rl_*` files compare the jitted kernels against them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

WHITEN_EPS = 1e-8


def ref_whiten(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
  vals = [float(x[b, t]) for b in range(x.shape[0]) for t in range(x.shape[1]) if mask[b, t]]
  out = np.zeros(x.shape, np.float64)
  if not vals:
    return out
  n = len(vals)
  mean = sum(vals) / n
  var = sum((v - mean) ** 2 for v in vals) / (n - 1) if n > 1 else 0.0
  scale = 1.0 / math.sqrt(var + WHITEN_EPS)
  for b in range(x.shape[0]):
    for t in range(x.shape[1]):
      if mask[b, t]:
        out[b, t] = (float(x[b, t]) - mean) * scale
  return out


def ref_gae(rewards, values, mask, gamma, lam, whiten=True):
  """Returns (advantages, returns) float64 [B, T]."""
  batch, horizon = rewards.shape
  adv = np.zeros((batch, horizon))
  ret = np.zeros((batch, horizon))
  for b in range(batch):
    pos = [t for t in range(horizon) if mask[b, t]]
    last = 0.0
    for i in reversed(range(len(pos))):
      t = pos[i]
      next_v = float(values[b, pos[i + 1]]) if i + 1 < len(pos) else 0.0
      delta = float(rewards[b, t]) + gamma * next_v - float(values[b, t])
      last = delta + gamma * lam * last
      adv[b, t] = last
      ret[b, t] = last + float(values[b, t])
  if whiten:
    adv = ref_whiten(adv, mask)
  return adv, ret


def ref_discounted_returns(rewards, mask, gamma):
  batch, horizon = rewards.shape
  out = np.zeros((batch, horizon))
  for b in range(batch):
    pos = [t for t in range(horizon) if mask[b, t]]
    running = 0.0
    for t in reversed(pos):
      running = float(rewards[b, t]) + gamma * running
      out[b, t] = running
  return out


def ref_reinforce_pp(rewards, mask, gamma):
  return ref_whiten(ref_discounted_returns(rewards, mask, gamma), mask)


def _scores(rewards, mask):
  return [sum(float(rewards[b, t]) for t in range(rewards.shape[1]) if mask[b, t])
          for b in range(rewards.shape[0])]


def _groups(group_ids):
  members: dict[int, list[int]] = {}
  for b, g in enumerate(group_ids):
    members.setdefault(int(g), []).append(b)
  return members


def _broadcast(row_values, mask):
  out = np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    for t in range(mask.shape[1]):
      if mask[b, t]:
        out[b, t] = row_values[b]
  return out


def ref_grpo(rewards, mask, group_ids, norm_by_std=True, epsilon=1e-6):
  s = _scores(rewards, mask)
  row = [0.0] * len(s)
  for rows in _groups(group_ids).values():
    vals = [s[i] for i in rows]
    n = len(vals)
    if n == 1:
      mean, std = 0.0, 1.0
    else:
      mean = sum(vals) / n
      std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
    for i in rows:
      row[i] = (s[i] - mean) / (std + epsilon) if norm_by_std else s[i] - mean
  return _broadcast(row, mask)


def ref_reinforce_pp_baseline(rewards, mask, group_ids):
  s = _scores(rewards, mask)
  row = [0.0] * len(s)
  for rows in _groups(group_ids).values():
    mean = sum(s[i] for i in rows) / len(rows) if len(rows) > 1 else 0.0
    for i in rows:
      row[i] = s[i] - mean
  return ref_whiten(_broadcast(row, mask), mask)


def ref_rloo(rewards, mask, group_ids):
  s = _scores(rewards, mask)
  row = [0.0] * len(s)
  for rows in _groups(group_ids).values():
    n = len(rows)
    for i in rows:
      row[i] = s[i] - sum(s[j] for j in rows if j != i) / (n - 1) if n > 1 else s[i]
  return _broadcast(row, mask)


def ref_advantages(name, rewards, mask, values, group_ids, gamma, lam):
  """(advantages, returns-or-None) from the reference of estimator `name` (default hyper-parameters)."""
  if name == "gae":
    return ref_gae(rewards, values, mask, gamma, lam)
  if name == "grpo":
    return ref_grpo(rewards, mask, group_ids), None
  if name == "reinforce_plus_plus":
    return ref_reinforce_pp(rewards, mask, gamma), None
  if name == "reinforce_plus_plus_baseline":
    return ref_reinforce_pp_baseline(rewards, mask, group_ids), None
  if name == "rloo":
    return ref_rloo(rewards, mask, group_ids), None
  raise KeyError(name)


def random_batch(seed: int, batch: int = 12, horizon: int = 40):
  """Rewards, values, mask, group ids with the corner cases the estimators must handle.

  Row 0 has no masked token, row 1 a single one, row 2 two short action runs separated by a long
  observation run, row 3 alternating runs, row 4 all masked, the rest random masks with right padding;
  rewards and values are non-zero everywhere (also off the mask, where they must be ignored). Group ids
  are arbitrary, non-contiguous and include singleton groups.
  """
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=(batch, horizon)).astype(np.float32)
  values = rng.normal(size=(batch, horizon)).astype(np.float32)
  mask = np.zeros((batch, horizon), np.float32)
  mask[1, 7] = 1
  mask[2, 1:4] = 1
  mask[2, horizon - 6:horizon - 3] = 1
  for start in range(0, horizon, 8):
    mask[3, start:start + 3] = 1
  mask[4, :] = 1
  for b in range(5, batch):
    length = int(rng.integers(1, horizon + 1))
    mask[b, :length] = rng.uniform(size=length) < 0.7
  base = rng.choice([3, 17, 400, 9, 123456], size=batch)
  group_ids = base.astype(np.int32)
  group_ids[batch - 1] = 999_999  # a singleton group
  return rewards, values, mask, group_ids


def test_reference_gae_hand_computed():
  # Masked positions 0 and 2; the observation token in between is skipped (its reward 5 is ignored).
  r = np.array([[0.0, 5.0, 1.0]])
  v = np.array([[0.5, 9.0, 0.25]])
  m = np.array([[1, 0, 1]])
  adv, ret = ref_gae(r, v, m, gamma=0.5, lam=0.5, whiten=False)
  # t=2: delta = 1 - 0.25 = 0.75; t=0: delta = 0 + 0.5 * 0.25 - 0.5 = -0.375, A = -0.375 + 0.25 * 0.75.
  np.testing.assert_allclose(adv, [[-0.1875, 0.0, 0.75]])
  np.testing.assert_allclose(ret, [[0.3125, 0.0, 1.0]])


def test_reference_returns_and_whiten_hand_computed():
  r = np.array([[1.0, 7.0, 2.0, 0.0]])
  m = np.array([[1, 0, 1, 0]])
  np.testing.assert_allclose(ref_discounted_returns(r, m, 0.5), [[2.0, 0.0, 2.0, 0.0]])
  x = np.array([[1.0, 100.0, 3.0]])
  w = ref_whiten(x, np.array([[1, 0, 1]]))
  # mean 2, unbiased var 2.
  np.testing.assert_allclose(w, [[-1 / math.sqrt(2 + 1e-8), 0.0, 1 / math.sqrt(2 + 1e-8)]])


def test_reference_group_estimators_hand_computed():
  r = np.array([[1.0], [3.0], [5.0], [1.0], [2.0], [6.0]])
  m = np.ones_like(r)
  g = np.array([7, 7, 2, 40, 40, 40])
  grpo = ref_grpo(r, m, g, epsilon=0.0)[:, 0]
  np.testing.assert_allclose(grpo[:3], [-1 / math.sqrt(2), 1 / math.sqrt(2), 5.0])
  rloo = ref_rloo(r, m, g)[:, 0]
  np.testing.assert_allclose(rloo, [-2.0, 2.0, 5.0, -3.0, -1.5, 4.5])
  base = ref_reinforce_pp_baseline(r, m, g)[:, 0]
  raw = np.array([-1.0, 1.0, 5.0, -2.0, -1.0, 3.0])
  np.testing.assert_allclose(base, (raw - raw.mean()) / math.sqrt(raw.var(ddof=1) + 1e-8))


@pytest.mark.parametrize("seed", [0])
def test_random_batch_has_the_corner_cases(seed):
  _, _, mask, group_ids = random_batch(seed)
  counts = mask.sum(-1)
  assert counts[0] == 0 and counts[1] == 1 and counts[4] == mask.shape[1]
  assert list(group_ids).count(999_999) == 1
