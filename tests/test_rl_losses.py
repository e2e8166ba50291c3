"""Policy/value/entropy/KL losses vs per-token Python loops, and the KL controllers vs hand computation."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agent_r1_jax import rl
from test_rl_reference import random_batch

TOL = 1e-5


def ref_aggregate(per_token, mask, mode, horizon=None):
  """Full-batch aggregate from the definitions (rows without masked tokens take no part)."""
  batch, length = mask.shape
  horizon = length if horizon is None else horizon
  rows = [b for b in range(batch) if any(mask[b])]
  if not rows:
    return 0.0
  row_sum = {b: sum(per_token[b][t] for t in range(length) if mask[b, t]) for b in rows}
  row_len = {b: sum(1 for t in range(length) if mask[b, t]) for b in rows}
  if mode == "token-mean":
    return sum(row_sum.values()) / sum(row_len.values())
  if mode == "seq-mean-token-mean":
    return sum(row_sum[b] / row_len[b] for b in rows) / len(rows)
  if mode == "seq-mean-token-sum":
    return sum(row_sum.values()) / len(rows)
  if mode == "seq-mean-token-sum-norm":
    return sum(row_sum[b] / horizon for b in rows) / len(rows)
  raise KeyError(mode)


def ref_policy_loss(old, new, adv, mask, low, high, c, mode, horizon=None):
  batch, length = mask.shape
  loss = [[0.0] * length for _ in range(batch)]
  clip = [[0.0] * length for _ in range(batch)]
  lower = [[0.0] * length for _ in range(batch)]
  kl = [[0.0] * length for _ in range(batch)]
  for b in range(batch):
    for t in range(length):
      if not mask[b, t]:
        continue
      a = float(adv[b, t])
      d = min(max(float(new[b, t]) - float(old[b, t]), -20.0), 20.0)
      ratio = math.exp(d)
      surr1 = -a * ratio
      surr2 = -a * min(max(ratio, 1 - low), 1 + high)
      ppo = max(surr1, surr2)
      clip[b][t] = float(surr2 > surr1)
      if a < 0:
        lower[b][t] = float(ppo > -a * c)
        ppo = min(ppo, -a * c)
      loss[b][t] = ppo
      kl[b][t] = -d
  return (ref_aggregate(loss, mask, mode, horizon), ref_aggregate(clip, mask, "token-mean"),
          ref_aggregate(lower, mask, "token-mean"), ref_aggregate(kl, mask, "token-mean"))


def _policy_inputs(seed):
  rewards, values, mask, _ = random_batch(seed)
  rng = np.random.default_rng(seed + 100)
  old = rng.normal(-2.0, 1.0, size=mask.shape).astype(np.float32)
  # Log-ratios spread enough to hit both clip bounds and the dual clip.
  new = (old + rng.normal(0.0, 0.6, size=mask.shape)).astype(np.float32)
  new[5, :3] = old[5, :3] + np.array([3.0, -3.0, 25.0], np.float32)
  return old, new, rewards, values, mask


@pytest.mark.parametrize("mode", rl.LOSS_AGG_MODES)
def test_policy_loss_matches_reference(mode):
  old, new, adv, _, mask = _policy_inputs(0)
  fn = jax.jit(functools.partial(rl.compute_policy_loss, clip_ratio_low=0.2, clip_ratio_high=0.28,
                                 clip_ratio_c=3.0, loss_agg_mode=mode))
  out = rl.finalize(fn(old, new, adv, mask))
  ref = ref_policy_loss(old, new, adv, mask, 0.2, 0.28, 3.0, mode)
  np.testing.assert_allclose([float(out.loss), float(out.clip_fraction), float(out.clip_fraction_lower),
                              float(out.approx_kl)], ref, atol=TOL, rtol=1e-6)
  assert 0.0 < float(out.clip_fraction) < 1.0 and float(out.clip_fraction_lower) > 0.0


def test_horizon_override_of_seq_mean_token_sum_norm():
  old, new, adv, _, mask = _policy_inputs(1)
  out = rl.compute_policy_loss(old, new, adv, mask, loss_agg_mode="seq-mean-token-sum-norm", horizon=256)
  ref = ref_policy_loss(old, new, adv, mask, 0.2, 0.2, 3.0, "seq-mean-token-sum-norm", horizon=256)
  np.testing.assert_allclose(float(out.loss.value()), ref[0], atol=TOL, rtol=1e-6)


def test_value_loss_matches_reference():
  _, _, mask, _ = random_batch(2)
  rng = np.random.default_rng(7)
  old_v, ret = rng.normal(size=(2,) + mask.shape).astype(np.float32)
  v = (old_v + rng.normal(0.0, 0.8, size=mask.shape)).astype(np.float32)
  c = 0.3
  per_tok, clipped = np.zeros(mask.shape), np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    for t in range(mask.shape[1]):
      vc = float(old_v[b, t]) + min(max(float(v[b, t]) - float(old_v[b, t]), -c), c)
      l1, l2 = (float(v[b, t]) - float(ret[b, t])) ** 2, (vc - float(ret[b, t])) ** 2
      per_tok[b, t] = 0.5 * max(l1, l2)
      clipped[b, t] = float(l2 > l1)
  for mode in rl.LOSS_AGG_MODES:
    out = rl.finalize(jax.jit(functools.partial(rl.compute_value_loss, clip_range_value=c, loss_agg_mode=mode))(
        v, old_v, ret, mask))
    np.testing.assert_allclose(float(out.loss), ref_aggregate(per_tok, mask, mode), atol=TOL, rtol=1e-6)
    np.testing.assert_allclose(float(out.clip_fraction), ref_aggregate(clipped, mask, "token-mean"), atol=TOL)


def _np_log_softmax(z):
  z = z.astype(np.float64)
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_entropy_and_token_logprobs_match_float64_reference():
  rng = np.random.default_rng(3)
  logits = rng.normal(0.0, 4.0, size=(3, 5, 11)).astype(np.float32)
  logits[0, 0] += 1e4  # large logits must not overflow
  logits[1, 2, 4] = 60.0  # a nearly deterministic position
  logp = _np_log_softmax(logits)
  ref_h = -(np.exp(logp) * logp).sum(-1)
  np.testing.assert_allclose(np.asarray(jax.jit(rl.entropy_from_logits)(logits)), ref_h, atol=TOL)
  ids = rng.integers(0, 11, size=(3, 5))
  ref_lp = np.take_along_axis(logp, ids[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(rl.token_logprobs(logits, ids)), ref_lp, atol=TOL)
  ref_lp_t = np.take_along_axis(_np_log_softmax(logits / 0.7), ids[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(rl.token_logprobs(logits, ids, temperature=0.7)), ref_lp_t, atol=TOL)
  mask = np.array([[1, 1, 0, 0, 0], [0, 0, 1, 0, 1], [0, 0, 0, 0, 0]])
  entropy_loss = jax.jit(rl.compute_entropy_loss, static_argnames=("loss_agg_mode", "horizon"))
  for mode in rl.LOSS_AGG_MODES:
    ent = entropy_loss(logits, mask, loss_agg_mode=mode).value()
    np.testing.assert_allclose(float(ent), ref_aggregate(ref_h, mask, mode), atol=TOL)


def _ref_kl(d, kind):
  if kind == "kl":
    return d
  if kind == "abs":
    return abs(d)
  if kind == "mse":
    return 0.5 * d * d
  x = min(max(-d, -20.0), 20.0)
  return min(max(math.exp(x) - x - 1.0, -10.0), 10.0)


@pytest.mark.parametrize("kind", rl.KL_PENALTIES)
def test_kl_penalties_loss_and_reward_penalty(kind):
  old, new, rewards, _, mask = _policy_inputs(4)
  ref_lp = old  # reference policy log-probs; `new` plays the current policy
  per_tok = np.array([[_ref_kl(float(new[b, t]) - float(ref_lp[b, t]), kind) for t in range(mask.shape[1])]
                      for b in range(mask.shape[0])])
  np.testing.assert_allclose(np.asarray(rl.kl_penalty(new, ref_lp, kind)), per_tok, atol=TOL, rtol=1e-6)
  for mode in ("token-mean", "seq-mean-token-sum"):
    loss = rl.compute_kl_loss(new, ref_lp, mask, kind=kind, loss_agg_mode=mode).value()
    np.testing.assert_allclose(float(loss), ref_aggregate(per_tok, mask, mode), atol=TOL, rtol=1e-6)
  beta = 0.05
  penalised, kl_metric = jax.jit(functools.partial(rl.apply_kl_penalty, kind=kind))(rewards, new, ref_lp, mask, beta)
  np.testing.assert_allclose(np.asarray(penalised), rewards - beta * per_tok * mask, atol=TOL, rtol=1e-6)
  np.testing.assert_allclose(float(kl_metric.value()), ref_aggregate(per_tok, mask, "seq-mean-token-mean"),
                             atol=TOL, rtol=1e-6)


def test_low_var_kl_is_clamped_and_its_gradient_stays_finite():
  """k3 = exp(-d) - 1 + d with d = logp - ref. Values: clamped to 10 at d = -30 and d = 30 (29 unclamped). Gradient
  in logp, hand-computed 1 - exp(-d) where nothing clamps (d = -1: 1 - e; d = 0.5: 1 - exp(-0.5)), and 0 where
  the result is clamped. At d = -100 exp(100) overflows float32: without the inner clamp of d to [-20, 20] the
  clamped value is still 10 but its gradient is 0 * inf = nan, which is what that clamp is for (#33)."""
  ref = np.array([[30.0, -30.0, 1.0, -0.5, 100.0]], np.float32)
  logp = np.zeros_like(ref)
  out = np.asarray(rl.kl_penalty(logp, ref, "low_var_kl"))
  np.testing.assert_array_equal(out[0, :2], [10.0, 10.0])
  np.testing.assert_allclose(out[0, 2:4], [math.exp(1.0) - 2.0, math.exp(-0.5) - 0.5], rtol=1e-6)
  assert out[0, 4] == 10.0
  grad = np.asarray(jax.grad(lambda lp: rl.kl_penalty(lp, jnp.asarray(ref), "low_var_kl").sum())(jnp.asarray(logp)))
  assert np.isfinite(grad).all(), grad
  np.testing.assert_allclose(grad[0], [0.0, 0.0, 1.0 - math.e, 1.0 - math.exp(-0.5), 0.0], rtol=1e-6, atol=1e-7)


def test_kl_controllers():
  fixed = rl.make_kl_controller("fixed", 0.1)
  fixed.update(5.0, n_steps=64)
  assert fixed.value == 0.1
  adaptive = rl.make_kl_controller("adaptive", 0.1, target_kl=0.05, horizon=100)
  adaptive.update(0.1, n_steps=10)      # error clipped to +0.2: 0.1 * (1 + 0.2 * 10 / 100)
  assert adaptive.value == pytest.approx(0.102)
  adaptive.update(0.0459, n_steps=10)   # error -0.082: 0.102 * (1 - 0.082 * 0.1)
  assert adaptive.value == pytest.approx(0.102 * (1 - 0.082 * 0.1))
  with pytest.raises(ValueError, match="target_kl and horizon"):
    rl.make_kl_controller("adaptive", 0.1)
  with pytest.raises(ValueError, match="target_kl must be > 0"):
    rl.AdaptiveKLController(0.1, 0.0, 10)
  with pytest.raises(ValueError, match="unknown KL controller"):
    rl.make_kl_controller("pid", 0.1)


def test_bad_static_options_raise_clear_errors():
  old, new, adv, _, mask = _policy_inputs(0)
  with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'"):
    rl.compute_policy_loss(old, new, adv, mask, loss_agg_mode="mean")
  with pytest.raises(ValueError, match="clip_ratio_c"):
    rl.compute_policy_loss(old, new, adv, mask, clip_ratio_c=0.5)
  with pytest.raises(ValueError, match="unknown kl penalty 'k9'"):
    rl.kl_penalty(old, new, "k9")


def test_a_registered_kl_penalty_is_used_by_name_and_a_taken_name_is_refused():
  logp = np.array([[-1.0, -2.0, -0.5]], np.float32)
  ref = np.array([[-1.5, -1.0, -0.5]], np.float32)
  name = "test_only_fourth_power"
  rl.register_kl_penalty(name)(lambda d: d ** 4)
  try:
    np.testing.assert_allclose(np.asarray(rl.kl_penalty(logp, ref, name)), (logp - ref) ** 4, rtol=1e-6)
    loss = rl.compute_kl_loss(logp, ref, np.array([[1, 0, 1]], np.float32), kind=name)
    np.testing.assert_allclose(float(loss.value()), (0.5 ** 4 + 0.0) / 2, rtol=1e-6)  # token mean over the mask
    with pytest.raises(ValueError, match="already registered"):
      rl.register_kl_penalty("low_var_kl")(lambda d: d)
  finally:
    del rl.KL_PENALTIES[name]


def test_empty_mask_gives_zero_not_nan():
  z = np.zeros((2, 3), np.float32)
  out = rl.finalize(rl.compute_policy_loss(z, z, z + 1.0, z))
  assert all(float(x) == 0.0 for x in out)
