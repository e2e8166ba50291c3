"""Advantage estimators over masked `[B, T]` token arrays, and the registry the trainer dispatches on.

Shapes: `token_level_rewards`, `values`, `action_mask` are `[B, T]` (response tokens, right-padded);
`group_ids` is int `[B]` (rows sampled for the same prompt share an id). All outputs are float32
`[B, T]` and exactly 0 where `action_mask` is 0.

`action_mask` is 1 at tokens the policy sampled. Observation (tool) tokens and padding are 0 and are
treated as deleted from the sequence: a time recursion steps from one masked token straight to the next
masked token of the row, so discounting counts action tokens only. Consequently rewards (and values)
placed on unmasked positions are ignored; the trainer puts the trajectory reward on the last action
token. An ablation that passes the response mask here gets the plain (non-agentic) estimators.

Scores of the outcome-based estimators are `s_i = sum_t r_{i,t} * m_{i,t}`.

Every function is jit-compatible with static shapes (no Python loop over rows or time).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from agent_r1_jax.rl import groups
from agent_r1_jax.rl import masked
from agent_r1_jax.rl import recurrences
from agent_r1_jax.rl.recurrences import ScanMethod


def _scores_in_groups(token_level_rewards: jax.Array, action_mask: jax.Array, group_ids: jax.Array):
  """`(m, s, stats)`: the float mask `[B, T]`, each row's score `s_i = sum_t r_it m_it` `[B]`, and the
  statistics of each row's group (`groups.group_stats`: size, mean, unbiased std, broadcast to rows)."""
  m = masked.as_float_mask(action_mask)
  scores = masked.masked_sum(jnp.asarray(token_level_rewards, jnp.float32), m, axis=-1)
  return m, scores, groups.group_stats(scores, group_ids)


def _broadcast(row_values: jax.Array, m: jax.Array) -> jax.Array:
  return jnp.where(m > 0, row_values[:, None], 0.0)


def compute_gae(token_level_rewards: jax.Array, values: jax.Array, action_mask: jax.Array,
                gamma: float | jax.Array, lam: float | jax.Array, whiten: bool = True,
                method: ScanMethod = "scan") -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation over action tokens only.

  With `n(t)` the next masked position after t in the row (values/advantages there are 0 after the last
  masked token):

      delta_t = r_t + gamma * V_{n(t)} - V_t
      A_t     = delta_t + gamma * lam * A_{n(t)}
      R_t     = A_t + V_t                                   (returns, before whitening)

  then `A` is whitened over all masked tokens of the batch (masked mean, unbiased variance,
  `rsqrt(var + 1e-8)`).

  Args:
    token_level_rewards: float `[B, T]`; entries off the mask are ignored.
    values: float `[B, T]` critic values; entries off the mask are ignored.
    action_mask: 0/1 `[B, T]`.
    gamma: discount.
    lam: GAE lambda.
    whiten: whiten the advantages (the paper does).
    method: `"scan"` (lax.scan) or `"associative"` (lax.associative_scan), see `rl.recurrences`.

  Returns:
    `(advantages, returns)`, float32 `[B, T]`, both 0 off the mask.
  """
  m = masked.as_float_mask(action_mask)
  adv = recurrences.masked_gae(token_level_rewards, values, m, gamma, lam, method)
  returns = jnp.where(m > 0, adv + jnp.asarray(values, jnp.float32), 0.0)
  if whiten:
    adv = masked.masked_whiten(adv, m)
  return adv, returns


def compute_grpo(token_level_rewards: jax.Array, action_mask: jax.Array, group_ids: jax.Array,
                 norm_by_std: bool = True, epsilon: float = 1e-6) -> jax.Array:
  """GRPO outcome advantage: the row score normalised within its group, on every action token.

      A_i = (s_i - mean_g) / (std_g + epsilon)    if norm_by_std  else  s_i - mean_g

  with the unbiased group std; a group of one has mean 0 and std 1.

  Args:
    token_level_rewards: float `[B, T]`.
    action_mask: 0/1 `[B, T]`.
    group_ids: int `[B]`, arbitrary non-negative ids.
    norm_by_std: divide by the group std (GRPO) or not (Dr. GRPO style).
    epsilon: added to the std.

  Returns:
    float32 `[B, T]` advantages.
  """
  m, scores, stats = _scores_in_groups(token_level_rewards, action_mask, group_ids)
  single = stats.size <= 1.0
  mean = jnp.where(single, 0.0, stats.mean)
  row_adv = scores - mean
  if norm_by_std:
    std = jnp.where(single, 1.0, stats.std)
    row_adv = row_adv / (std + epsilon)
  return _broadcast(row_adv, m)


def compute_reinforce_pp(token_level_rewards: jax.Array, action_mask: jax.Array,
                         gamma: float | jax.Array, method: ScanMethod = "scan") -> jax.Array:
  """REINFORCE++: whitened discounted return over action tokens only.

      G_t = r_t + gamma * G_{n(t)}    (n(t): next masked position; G = 0 after the last one)
      A   = whiten_mask(G)

  Args:
    token_level_rewards: float `[B, T]`; entries off the mask are ignored.
    action_mask: 0/1 `[B, T]`.
    gamma: discount.
    method: recurrence strategy, see `rl.recurrences`.

  Returns:
    float32 `[B, T]` advantages.
  """
  m = masked.as_float_mask(action_mask)
  returns = recurrences.masked_discounted_returns(token_level_rewards, m, gamma, method)
  return masked.masked_whiten(returns, m)


def compute_reinforce_pp_baseline(token_level_rewards: jax.Array, action_mask: jax.Array,
                                  group_ids: jax.Array) -> jax.Array:
  """REINFORCE++ with a group-mean baseline: `A = whiten_mask((s_i - mean_g) * m)`.

  A group of one has mean 0.

  Args:
    token_level_rewards: float `[B, T]`.
    action_mask: 0/1 `[B, T]`.
    group_ids: int `[B]`.

  Returns:
    float32 `[B, T]` advantages.
  """
  m, scores, stats = _scores_in_groups(token_level_rewards, action_mask, group_ids)
  mean = jnp.where(stats.size <= 1.0, 0.0, stats.mean)
  return masked.masked_whiten(_broadcast(scores - mean, m), m)


def compute_rloo(token_level_rewards: jax.Array, action_mask: jax.Array, group_ids: jax.Array) -> jax.Array:
  """RLOO: leave-one-out baseline within the group, on every action token.

      A_i = s_i * n/(n-1) - mean_g * n/(n-1)   ( = s_i - mean of the other n-1 scores)   for n > 1
      A_i = s_i                                                                         for n = 1

  Args:
    token_level_rewards: float `[B, T]`.
    action_mask: 0/1 `[B, T]`.
    group_ids: int `[B]`.

  Returns:
    float32 `[B, T]` advantages.
  """
  m, scores, stats = _scores_in_groups(token_level_rewards, action_mask, group_ids)
  n = stats.size
  scale = n / jnp.maximum(n - 1.0, 1.0)
  row_adv = jnp.where(n > 1.0, scores * scale - stats.mean * scale, scores)
  return _broadcast(row_adv, m)


# --------------------------------------------------------------------------------------------------
# Registry: one uniform signature so the trainer never branches on the algorithm.


@dataclasses.dataclass(frozen=True)
class AdvantageParams:
  """Hyper-parameters every estimator may read (hashable: pass as a static jit argument)."""
  gamma: float = 1.0
  lam: float = 1.0
  norm_by_std: bool = True
  epsilon: float = 1e-6
  whiten: bool = True
  method: ScanMethod = "scan"


# fn(token_level_rewards, action_mask, values | None, group_ids | None, params) -> (advantages, returns)
EstimatorFn = Callable[..., tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class AdvantageEstimator:
  """A registered estimator.

  `fn(token_level_rewards, action_mask, values, group_ids, params) -> (advantages, returns)`; for the
  critic-free estimators `returns` is the advantages array (nothing trains on it). `needs_values` /
  `needs_group_ids` say which optional inputs must be given (and whether a critic is needed).
  """
  name: str
  fn: EstimatorFn
  needs_values: bool
  needs_group_ids: bool


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_estimator(name: str, *, needs_values: bool = False, needs_group_ids: bool = False):
  """Decorator adding an `EstimatorFn` to `ADVANTAGE_ESTIMATORS` under `name`."""
  def wrap(fn: EstimatorFn) -> EstimatorFn:
    if name in ADVANTAGE_ESTIMATORS:
      raise ValueError(f"advantage estimator {name!r} is already registered")
    ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(name, fn, needs_values, needs_group_ids)
    return fn
  return wrap


@register_estimator("gae", needs_values=True)
def _gae(rewards, mask, values, group_ids, p: AdvantageParams):
  del group_ids
  return compute_gae(rewards, values, mask, p.gamma, p.lam, whiten=p.whiten, method=p.method)


@register_estimator("grpo", needs_group_ids=True)
def _grpo(rewards, mask, values, group_ids, p: AdvantageParams):
  del values
  adv = compute_grpo(rewards, mask, group_ids, norm_by_std=p.norm_by_std, epsilon=p.epsilon)
  return adv, adv


@register_estimator("reinforce_plus_plus")
def _reinforce_pp(rewards, mask, values, group_ids, p: AdvantageParams):
  del values, group_ids
  adv = compute_reinforce_pp(rewards, mask, p.gamma, method=p.method)
  return adv, adv


@register_estimator("reinforce_plus_plus_baseline", needs_group_ids=True)
def _reinforce_pp_baseline(rewards, mask, values, group_ids, p: AdvantageParams):
  del values
  adv = compute_reinforce_pp_baseline(rewards, mask, group_ids)
  return adv, adv


@register_estimator("rloo", needs_group_ids=True)
def _rloo(rewards, mask, values, group_ids, p: AdvantageParams):
  del values, p
  adv = compute_rloo(rewards, mask, group_ids)
  return adv, adv


def get_estimator(name: str) -> AdvantageEstimator:
  """The registered estimator called `name` (a config's `algorithm.adv_estimator`)."""
  try:
    return ADVANTAGE_ESTIMATORS[name]
  except KeyError:
    raise ValueError(f"unknown advantage estimator {name!r}; set it to one of "
                     f"{sorted(ADVANTAGE_ESTIMATORS)}") from None


def compute_advantages(name: str, token_level_rewards: jax.Array, action_mask: jax.Array, *,
                       values: jax.Array | None = None, group_ids: jax.Array | None = None,
                       params: AdvantageParams = AdvantageParams()) -> tuple[jax.Array, jax.Array]:
  """Runs the estimator `name`: `(advantages, returns)`, both float32 `[B, T]`.

  Jit it with `name` and `params` static, e.g.
  `jax.jit(compute_advantages, static_argnames=("name", "params"))`.

  Raises:
    ValueError: unknown `name`, or `values` / `group_ids` missing where the estimator needs them.
  """
  est = get_estimator(name)
  if est.needs_values and values is None:
    raise ValueError(f"advantage estimator {name!r} needs critic `values`; pass values=[B, T]")
  if est.needs_group_ids and group_ids is None:
    raise ValueError(f"advantage estimator {name!r} needs `group_ids` (one int per row); pass group_ids=[B]")
  return est.fn(token_level_rewards, action_mask, values, group_ids, params)
