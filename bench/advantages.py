"""Jitted masked advantage kernels vs the straightforward reference, in one run.

    python bench/advantages.py                       # B=512, T=4096, ~30% observation tokens
    python bench/advantages.py --batch 64 --length 1024
    python bench/advantages.py --smoke               # B=8, T=256, one repeat: that it runs

The reference is what the paper's PyTorch code does, written in NumPy: for each row, compact the action
(masked) positions, run the backward recursion over them in a Python loop, scatter back, then whiten.
A second baseline vectorises the recursion over rows (one NumPy step per time index, carrying through
observation tokens), to show what part of the gap is Python overhead. Inputs already live on the device
for the JAX timings (as in the trainer); reported times are medians over repeats after compilation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from agent_r1_jax import rl  # noqa: E402

WHITEN_EPS = 1e-8


def make_batch(batch: int, length: int, obs_frac: float, seed: int = 0):
  """Rows of alternating action runs and observation (tool output) runs, then right padding.

  Action runs are U[50, 400] tokens; observation runs are scaled so that about `obs_frac` of the
  non-padding tokens are observations; each row ends with U[0, T/8] padding tokens. The trajectory
  reward sits on the last action token; values are random.
  """
  rng = np.random.default_rng(seed)
  mask = np.zeros((batch, length), np.float32)
  rewards = np.zeros((batch, length), np.float32)
  mean_action = 225.0
  mean_obs = mean_action * obs_frac / (1.0 - obs_frac)
  for b in range(batch):
    end = length - int(rng.integers(0, length // 8 + 1))
    t = 0
    while t < end:
      run = int(rng.integers(50, 401))
      mask[b, t:min(t + run, end)] = 1.0
      t += run + int(rng.integers(int(0.2 * mean_obs), int(1.8 * mean_obs) + 1))
    last = np.nonzero(mask[b])[0][-1]
    rewards[b, last] = float(rng.integers(0, 2))
  values = rng.normal(0.0, 0.5, size=(batch, length)).astype(np.float32)
  group_ids = (np.arange(batch) // 8).astype(np.int32)
  return rewards, values, mask, group_ids


def _np_whiten(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
  sel = mask > 0
  vals = x[sel]
  mean = vals.mean()
  var = vals.var(ddof=1)
  return np.where(sel, (x - mean) / np.sqrt(var + WHITEN_EPS), 0.0)


def reference_gae(rewards, values, mask, gamma, lam):
  """Per-row compaction + reverse time loop (the paper's algorithm), NumPy."""
  adv = np.zeros_like(rewards)
  ret = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    pos = np.nonzero(mask[b])[0]
    last = 0.0
    for i in range(len(pos) - 1, -1, -1):
      t = pos[i]
      next_value = values[b, pos[i + 1]] if i + 1 < len(pos) else 0.0
      delta = rewards[b, t] + gamma * next_value - values[b, t]
      last = delta + gamma * lam * last
      adv[b, t] = last
      ret[b, t] = last + values[b, t]
  return _np_whiten(adv, mask), ret


def reference_reinforce_pp(rewards, mask, gamma):
  """Per-row compaction + reverse time loop over the discounted return, NumPy."""
  ret = np.zeros_like(rewards)
  for b in range(rewards.shape[0]):
    pos = np.nonzero(mask[b])[0]
    running = 0.0
    for i in range(len(pos) - 1, -1, -1):
      t = pos[i]
      running = rewards[b, t] + gamma * running
      ret[b, t] = running
  return _np_whiten(ret, mask)


def reference_grpo(rewards, mask, group_ids, eps=1e-6):
  """Per-group Python loop over a dict of scores (the paper's GRPO), NumPy."""
  scores = (rewards * mask).sum(-1)
  members: dict[int, list[int]] = {}
  for i, g in enumerate(group_ids):
    members.setdefault(int(g), []).append(i)
  row = np.zeros_like(scores)
  for rows in members.values():
    s = scores[rows]
    mean, std = (0.0, 1.0) if len(rows) == 1 else (s.mean(), s.std(ddof=1))
    row[rows] = (s - mean) / (std + eps)
  return np.where(mask > 0, row[:, None], 0.0)


def vectorised_gae(rewards, values, mask, gamma, lam):
  """Rows at once, Python loop over time with pass-through at observation tokens, NumPy."""
  batch, length = rewards.shape
  adv = np.zeros_like(rewards)
  next_v = np.zeros(batch, np.float32)
  next_a = np.zeros(batch, np.float32)
  for t in range(length - 1, -1, -1):
    m = mask[:, t]
    delta = rewards[:, t] + gamma * next_v - values[:, t]
    a = delta + gamma * lam * next_a
    next_a = np.where(m > 0, a, next_a)
    next_v = np.where(m > 0, values[:, t], next_v)
    adv[:, t] = np.where(m > 0, a, 0.0)
  return _np_whiten(adv, mask)


def timed(fn, repeats: int) -> tuple[float, object]:
  out = fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times), out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=512)
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--obs-frac", type=float, default=0.3)
  parser.add_argument("--repeats", type=int, default=10, help="timed repeats of each JAX kernel")
  parser.add_argument("--gamma", type=float, default=1.0)
  parser.add_argument("--lam", type=float, default=0.95)
  parser.add_argument("--smoke", action="store_true", help="B=8, T=256, one repeat: checks that the bench runs")
  args = parser.parse_args()
  if args.smoke:
    args.batch, args.length, args.repeats = 8, 256, 1

  rewards, values, mask, group_ids = make_batch(args.batch, args.length, args.obs_frac)
  padding = (np.cumsum(mask[:, ::-1], axis=1)[:, ::-1] == 0)
  obs = 1.0 - mask.sum() / (~padding).sum()
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()} ({jax.default_backend()}), "
        f"jax {jax.__version__}; B={args.batch} T={args.length}, observation tokens {obs:.1%} of "
        f"non-padding, action tokens {mask.mean():.1%} of all")

  d_rewards, d_values, d_mask, d_groups = (jnp.asarray(x) for x in (rewards, values, mask, group_ids))
  rows = []

  def row(name, ref_time, ref_out, kernels):
    for label, fn in kernels:
      t, out = timed(lambda fn=fn: jax.block_until_ready(fn()), args.repeats)
      err = float(np.max(np.abs(np.asarray(out) - ref_out)))
      rows.append((name, label, ref_time, t, err))

  t0 = time.perf_counter()
  ref_gae, _ = reference_gae(rewards, values, mask, args.gamma, args.lam)
  t_ref_gae = time.perf_counter() - t0
  t0 = time.perf_counter()
  vec_gae = vectorised_gae(rewards, values, mask, args.gamma, args.lam)
  t_vec_gae = time.perf_counter() - t0
  gae = {m: jax.jit(lambda r, v, k, m=m: rl.compute_gae(r, v, k, args.gamma, args.lam, method=m)[0])
         for m in ("scan", "associative")}
  row("GAE", t_ref_gae, ref_gae, [(f"jit {m}", lambda f=f: f(d_rewards, d_values, d_mask)) for m, f in gae.items()])

  t0 = time.perf_counter()
  ref_rpp = reference_reinforce_pp(rewards, mask, args.gamma)
  t_ref_rpp = time.perf_counter() - t0
  rpp = {m: jax.jit(lambda r, k, m=m: rl.compute_reinforce_pp(r, k, args.gamma, method=m))
         for m in ("scan", "associative")}
  row("REINFORCE++", t_ref_rpp, ref_rpp, [(f"jit {m}", lambda f=f: f(d_rewards, d_mask)) for m, f in rpp.items()])

  t0 = time.perf_counter()
  ref_grpo = reference_grpo(rewards, mask, group_ids)
  t_ref_grpo = time.perf_counter() - t0
  grpo = jax.jit(rl.compute_grpo)
  row("GRPO", t_ref_grpo, ref_grpo, [("jit", lambda: grpo(d_rewards, d_mask, d_groups))])

  print(f"\n{'estimator':<12} {'kernel':<16} {'reference s':>12} {'jax ms':>9} {'speedup':>9} {'max |diff|':>11}")
  for name, label, ref_t, t, err in rows:
    print(f"{name:<12} {label:<16} {ref_t:>12.3f} {t * 1e3:>9.2f} {ref_t / t:>8.1f}x {err:>11.2e}")
  best_gae = min(t for name, _, _, t, _ in rows if name == "GAE")
  print(f"\nvectorised-over-rows NumPy GAE (time loop, pass-through at observations): {t_vec_gae:.3f} s, "
        f"max |diff| {np.max(np.abs(vec_gae - ref_gae)):.2e}; best jitted GAE is {t_vec_gae / best_gae:.1f}x faster")


if __name__ == "__main__":
  main()
