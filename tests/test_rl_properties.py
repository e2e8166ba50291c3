"""Property tests (hypothesis) of the RL kernels: mask invariances, zero gradients off the mask, and
micro-batch accumulation of (sum, denominator) pairs."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agent_r1_jax import rl
from test_rl_reference import ref_discounted_returns
from test_rl_reference import ref_gae

B, T, T_INSERTED = 4, 8, 16
GAMMA, LAM = 0.9, 0.8
ESTIMATORS = ("gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo")
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

finite = st.floats(-3.0, 3.0, width=32, allow_nan=False, allow_subnormal=False)
masks = hnp.arrays(np.bool_, (B, T))
token_values = hnp.arrays(np.float32, (B, T), elements=finite)
group_ids = hnp.arrays(np.int32, (B,), elements=st.integers(0, 6))
# For each row, the sorted slots of the longer row that the original T tokens move to.
insertions = st.lists(st.lists(st.integers(0, T_INSERTED - 1), min_size=T, max_size=T, unique=True).map(sorted),
                      min_size=B, max_size=B)


@functools.partial(jax.jit, static_argnames=("name",))
def _advantages(name, rewards, mask, values, gids):
  return rl.compute_advantages(name, rewards, mask, values=values, group_ids=gids,
                               params=rl.AdvantageParams(gamma=GAMMA, lam=LAM))


def _whitening_gain(name, rewards, mask, values, gids):
  """max|x| / std of the pre-whitening quantity x: how much float32 rounding in the whitening
  statistics (whose summation order changes when zeros are inserted) is amplified."""
  if name == "gae":
    raw = ref_gae(rewards, values, mask, GAMMA, LAM, whiten=False)[0]
  elif name == "reinforce_plus_plus":
    raw = ref_discounted_returns(rewards, mask, GAMMA)
  elif name == "reinforce_plus_plus_baseline":
    raw = np.where(mask, (rewards * mask).sum(-1, keepdims=True), 0.0)  # bounds |s - mean| <= 2 max|s|
  else:
    return 0.0
  x = raw[mask.astype(bool)]
  if x.size < 2:
    return 0.0
  return 2.0 * float(np.abs(x).max()) / math.sqrt(float(x.var(ddof=1)) + 1e-8)


@SETTINGS
@given(name=st.sampled_from(ESTIMATORS), rewards=token_values, values=token_values, mask=masks, gids=group_ids,
       slots=insertions, junk=hnp.arrays(np.float32, (2, B, T_INSERTED), elements=finite))
def test_inserting_unmasked_tokens_leaves_advantages_unchanged(name, rewards, values, mask, gids, slots, junk):
  mask = mask.astype(np.float32)
  rewards2, values2 = junk[0].copy(), junk[1].copy()  # junk rewards/values on the inserted tokens
  mask2 = np.zeros((B, T_INSERTED), np.float32)
  for b in range(B):
    rewards2[b, slots[b]] = rewards[b]
    values2[b, slots[b]] = values[b]
    mask2[b, slots[b]] = mask[b]
  adv, ret = map(np.asarray, _advantages(name, rewards, mask, values, gids))
  adv2, ret2 = map(np.asarray, _advantages(name, rewards2, mask2, values2, gids))
  assert np.all(adv[mask == 0] == 0.0) and np.all(adv2[mask2 == 0] == 0.0)
  tol = 1e-5 * (1.0 + _whitening_gain(name, rewards, mask, values, gids))
  for b in range(B):
    np.testing.assert_allclose(adv2[b, slots[b]], adv[b], atol=tol, rtol=0)
    if name == "gae":
      np.testing.assert_allclose(ret2[b, slots[b]], ret[b], atol=1e-5, rtol=0)


def _poison(x, mask, rng_values):
  """x with NaN / +-inf at unmasked positions, as padding or a diverged model could leave there."""
  return np.where(mask[(...,) + (None,) * (x.ndim - mask.ndim)] > 0, x, rng_values).astype(np.float32)


@jax.jit
def _loss_grads(logp, old, adv, v, old_v, ret, logits, mask):
  """Gradients of every loss (all aggregation modes and KL kinds) w.r.t. every differentiated input."""
  grads = []
  for mode in rl.LOSS_AGG_MODES:
    def policy(logp, old, adv):
      return rl.compute_policy_loss(old, logp, adv, mask, loss_agg_mode=mode).loss.value()

    def value(v, old_v, ret):
      return rl.compute_value_loss(v, old_v, ret, mask, clip_range_value=0.2, loss_agg_mode=mode).loss.value()

    def entropy(logits):
      return rl.compute_entropy_loss(logits, mask, loss_agg_mode=mode).value()

    grads.append(jax.grad(entropy)(logits))
    grads.extend(jax.grad(policy, argnums=(0, 1, 2))(logp, old, adv))
    grads.extend(jax.grad(value, argnums=(0, 1, 2))(v, old_v, ret))
    for kind in rl.KL_PENALTIES:
      def kl(logp, ref):
        return rl.compute_kl_loss(logp, ref, mask, kind=kind, loss_agg_mode=mode).value()
      grads.extend(jax.grad(kl, argnums=(0, 1))(logp, old))
  return grads


@SETTINGS
@given(mask=masks, seed=st.integers(0, 2**31 - 1))
def test_loss_gradients_are_exactly_zero_off_the_mask(mask, seed):
  rng = np.random.default_rng(seed)
  m = mask.astype(np.float32)
  poison = rng.choice(np.array([np.nan, np.inf, -np.inf], np.float32), size=(B, T))
  logp = _poison(rng.normal(-1.0, 1.0, (B, T)), m, poison)
  old = _poison(logp + rng.normal(0.0, 0.5, (B, T)), m, poison)
  adv = _poison(rng.normal(size=(B, T)), m, poison)
  v, old_v, ret = (_poison(rng.normal(size=(B, T)), m, poison) for _ in range(3))
  logits = _poison(rng.normal(0.0, 3.0, (B, T, 5)), m, poison[..., None])
  grads = [np.asarray(g) for g in _loss_grads(logp, old, adv, v, old_v, ret, logits, m)]
  off = m == 0
  for g in grads:
    assert np.all(np.isfinite(g))
    assert np.all(g[off] == 0.0)
  # Gradients must flow on the mask, else the property above is vacuous: the entropy and the k1 KL
  # (gradient 1/denominator per token) always have non-zero gradients there. (The PPO and value losses
  # may legitimately have none: a clipped token passes no gradient.)
  if m.any():
    assert np.all(grads[0][~off].any(-1)) and np.all(grads[7][~off] != 0.0)


MICRO, N_MICRO = 2, 3


@jax.jit
def _full_and_accumulated(logp, old, adv, logits, mask, order):
  """For every aggregation mode: full-batch outputs and gradient, and the same accumulated from
  micro-batches of the rows taken in `order`."""
  results = {}
  for mode in rl.LOSS_AGG_MODES:
    def outputs(logp, old, adv, logits, mask):
      return (rl.compute_policy_loss(old, logp, adv, mask, loss_agg_mode=mode, horizon=32),
              rl.compute_entropy_loss(logits, mask, loss_agg_mode=mode, horizon=32))

    def loss_total(logp, old, adv, mask):
      return rl.compute_policy_loss(old, logp, adv, mask, loss_agg_mode=mode, horizon=32).loss.total

    full = outputs(logp, old, adv, logits, mask)
    grad_full = jax.grad(lambda x: rl.compute_policy_loss(
        old, x, adv, mask, loss_agg_mode=mode, horizon=32).loss.value())(logp)
    # Gradient accumulation: every micro-batch divides its total by the full-batch denominator,
    # which depends on the masks only and so is known before the update.
    denominator = rl.loss_denominator(mask, mode, horizon=32)
    safe = jnp.maximum(denominator, 1.0)
    acc, grad_acc = None, jnp.zeros_like(logp)
    for k in range(N_MICRO):
      rows = order[k * MICRO:(k + 1) * MICRO]
      part = outputs(logp[rows], old[rows], adv[rows], logits[rows], mask[rows])
      acc = part if acc is None else rl.accumulate(acc, part)
      g = jax.grad(lambda x: loss_total(x, old[rows], adv[rows], mask[rows]) / safe)(logp[rows])
      grad_acc = grad_acc.at[rows].add(g)
    results[mode] = (full, acc, grad_full, grad_acc, denominator)
  return results


@SETTINGS
@given(mask=hnp.arrays(np.bool_, (MICRO * N_MICRO, T)), order=st.permutations(range(MICRO * N_MICRO)),
       seed=st.integers(0, 2**31 - 1))
def test_micro_batch_accumulation_equals_full_batch(mask, order, seed):
  rng = np.random.default_rng(seed)
  m = mask.astype(np.float32)
  logp = rng.normal(-1.0, 1.0, m.shape).astype(np.float32)
  old = (logp + rng.normal(0.0, 0.5, m.shape)).astype(np.float32)
  adv = rng.normal(size=m.shape).astype(np.float32)
  logits = rng.normal(size=m.shape + (5,)).astype(np.float32)
  results = _full_and_accumulated(logp, old, adv, logits, m, np.asarray(order, np.int32))
  for mode, (full, acc, grad_full, grad_acc, denominator) in results.items():
    for a, f in zip(jax.tree.leaves(rl.finalize(acc)), jax.tree.leaves(rl.finalize(full))):
      np.testing.assert_allclose(float(a), float(f), rtol=1e-5, atol=1e-6, err_msg=mode)
    assert float(denominator) == float(full[0].loss.denominator), mode
    np.testing.assert_allclose(np.asarray(grad_acc), np.asarray(grad_full), rtol=1e-5, atol=1e-7, err_msg=mode)
