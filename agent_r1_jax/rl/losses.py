"""PPO policy loss (asymmetric clip + dual clip) and clipped value loss, as `Aggregate` pairs.

Shapes: every per-token input is `[B, T]` float; `action_mask` is 0/1 `[B, T]`. Inputs off the mask are
replaced by constants before any arithmetic, so whatever sits there (padding log-probs of -inf, NaN
values) produces exactly zero loss and exactly zero gradient.

Outputs are `Aggregate(total, denominator)` pairs (see `rl.aggregation`): sum them over micro-batches
with `accumulate` and divide once with `finalize` to get full-batch values. Metrics (clip fractions,
approximate KL) are always token means.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from agent_r1_jax.rl import aggregation
from agent_r1_jax.rl.aggregation import Aggregate
from agent_r1_jax.rl.masked import zero_off_mask

# exp(20) ~ 4.9e8: a ratio that large already means the sample is useless; clamping the log-ratio
# keeps exp finite (and its gradient finite) when log-probs drift apart, e.g. after a bad update.
LOG_RATIO_CLAMP = 20.0


class PolicyLossOutput(NamedTuple):
  """Policy loss and its metrics, each an `Aggregate`."""
  loss: Aggregate                 # PPO clipped surrogate (aggregated by loss_agg_mode)
  clip_fraction: Aggregate        # fraction of tokens where the clipped branch was taken
  clip_fraction_lower: Aggregate  # fraction of tokens where the dual clip bound was taken (A < 0)
  approx_kl: Aggregate            # token mean of old_logp - logp (k1 estimate of KL(old || new))


class ValueLossOutput(NamedTuple):
  """Value loss and its clip fraction."""
  loss: Aggregate
  clip_fraction: Aggregate


def compute_policy_loss(old_logprobs: jax.Array, logprobs: jax.Array, advantages: jax.Array,
                        action_mask: jax.Array, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
                        clip_ratio_c: float = 3.0, loss_agg_mode: str = "token-mean",
                        horizon: int | None = None, log_ratio_clamp: float = LOG_RATIO_CLAMP) -> PolicyLossOutput:
  """PPO clipped surrogate with asymmetric clip range and dual clip.

      rho_t = exp(clip(logp_t - old_logp_t, -c0, c0))                  (c0 = log_ratio_clamp)
      L_t   = max(-A_t rho_t, -A_t clip(rho_t, 1 - eps_low, 1 + eps_high))
      L_t   = min(L_t, -A_t * clip_ratio_c)       where A_t < 0          (dual clip)

  then aggregated over the mask by `loss_agg_mode`. The dual clip bounds the loss of a negative
  advantage token whose ratio exploded; `clip_ratio_c` must exceed 1.

  Args:
    old_logprobs: float `[B, T]`, log-probs of the sampling (behaviour) policy.
    logprobs: float `[B, T]`, log-probs of the current policy (differentiated).
    advantages: float `[B, T]`.
    action_mask: 0/1 `[B, T]`.
    clip_ratio_low, clip_ratio_high: eps_low and eps_high.
    clip_ratio_c: dual clip constant (> 1).
    loss_agg_mode: one of `rl.aggregation.LOSS_AGG_MODES`.
    horizon: H of `seq-mean-token-sum-norm` (default T).
    log_ratio_clamp: c0 above.

  Returns:
    `PolicyLossOutput` of `Aggregate`s.

  Raises:
    ValueError: `clip_ratio_c <= 1`, negative clip ratios, or an unknown `loss_agg_mode`.
  """
  aggregation.check_mode(loss_agg_mode)
  if clip_ratio_low < 0 or clip_ratio_high < 0:
    raise ValueError(f"clip ratios must be >= 0, got low={clip_ratio_low}, high={clip_ratio_high}")
  if clip_ratio_c <= 1.0:
    raise ValueError(f"clip_ratio_c (dual clip) must be > 1, got {clip_ratio_c}")
  on, logp, old_logp, adv = zero_off_mask(action_mask, logprobs, old_logprobs, advantages)

  log_ratio = jnp.clip(logp - old_logp, -log_ratio_clamp, log_ratio_clamp)
  ratio = jnp.exp(log_ratio)
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
  ppo = jnp.maximum(unclipped, clipped)
  dual_bound = -adv * clip_ratio_c
  dual = jnp.minimum(ppo, dual_bound)
  per_token = jnp.where(adv < 0, dual, ppo)

  clip_frac = (clipped > unclipped).astype(jnp.float32)
  clip_frac_lower = ((ppo > dual_bound) & (adv < 0)).astype(jnp.float32)
  return PolicyLossOutput(
      loss=aggregation.aggregate(per_token, on, loss_agg_mode, horizon),
      clip_fraction=aggregation.token_mean(jax.lax.stop_gradient(clip_frac), on),
      clip_fraction_lower=aggregation.token_mean(jax.lax.stop_gradient(clip_frac_lower), on),
      approx_kl=aggregation.token_mean(jax.lax.stop_gradient(-log_ratio), on),
  )


def compute_value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, action_mask: jax.Array,
                       *, clip_range_value: float = 0.5, loss_agg_mode: str = "token-mean",
                       horizon: int | None = None) -> ValueLossOutput:
  """Clipped value loss.

      v_clip_t = clip(v_t, old_v_t - c, old_v_t + c)
      L_t      = 0.5 * max((v_t - R_t)^2, (v_clip_t - R_t)^2)

  aggregated over the mask by `loss_agg_mode`; `clip_fraction` is the token fraction where the clipped
  term is the larger one.

  Args:
    values: float `[B, T]` current critic values (differentiated).
    old_values: float `[B, T]` critic values at rollout time.
    returns: float `[B, T]` targets (GAE returns).
    action_mask: 0/1 `[B, T]`.
    clip_range_value: c above (>= 0).
    loss_agg_mode: one of `rl.aggregation.LOSS_AGG_MODES`.
    horizon: H of `seq-mean-token-sum-norm` (default T).

  Returns:
    `ValueLossOutput` of `Aggregate`s.
  """
  aggregation.check_mode(loss_agg_mode)
  if clip_range_value < 0:
    raise ValueError(f"clip_range_value must be >= 0, got {clip_range_value}")
  on, v, old_v, ret = zero_off_mask(action_mask, values, old_values, returns)
  # clip(v, old - c, old + c) rather than old + clip(v - old, -c, c): equal in exact arithmetic, but
  # only this form returns v bit-for-bit inside the range, so clip_fraction counts no rounding ties.
  v_clipped = jnp.clip(v, old_v - clip_range_value, old_v + clip_range_value)
  loss_unclipped = jnp.square(v - ret)
  loss_clipped = jnp.square(v_clipped - ret)
  per_token = 0.5 * jnp.maximum(loss_unclipped, loss_clipped)
  clip_frac = (loss_clipped > loss_unclipped).astype(jnp.float32)
  return ValueLossOutput(
      loss=aggregation.aggregate(per_token, on, loss_agg_mode, horizon),
      clip_fraction=aggregation.token_mean(jax.lax.stop_gradient(clip_frac), on),
  )
