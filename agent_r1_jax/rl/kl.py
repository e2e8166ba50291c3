"""KL estimators between the policy and a reference policy, as loss term or reward penalty.

Per token, with `d_t = logp_t - ref_logp_t` (log-probs of the sampled token, float `[B, T]`):

    kl          k1:  d
    abs              |d|
    mse         k2:  0.5 * d^2
    low_var_kl  k3:  exp(-d) - 1 + d, with d clamped to [-20, 20] and the result to [-10, 10]

k1 and k3 are unbiased estimates of KL(pi || ref) under samples of pi; k3 is non-negative with low
variance (Schulman's "Approximating KL divergence"). Each is a function of `d` in the `KL_PENALTIES`
registry (`register_kl_penalty` adds one). The coefficient is held by a host-side controller:
`FixedKLController` or `AdaptiveKLController` (Ziegler et al. 2019).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from agent_r1_jax.rl import aggregation
from agent_r1_jax.rl.aggregation import Aggregate
from agent_r1_jax.rl.masked import zero_off_mask

KL_CONTROLLERS: tuple[str, ...] = ("fixed", "adaptive")
_K3_LOG_RATIO_CLAMP = 20.0
_K3_CLAMP = 10.0

KLEstimate = Callable[[jax.Array], jax.Array]  # d = logp - ref_logp, float32 [B, T] -> per-token estimate [B, T]
KL_PENALTIES: dict[str, KLEstimate] = {}


def register_kl_penalty(name: str):
  """Decorator adding a per-token estimate `f(d)` (a `KLEstimate`) to `KL_PENALTIES` under `name`."""
  def wrap(fn: KLEstimate) -> KLEstimate:
    if name in KL_PENALTIES:
      raise ValueError(f"KL penalty {name!r} is already registered")
    KL_PENALTIES[name] = fn
    return fn
  return wrap


@register_kl_penalty("kl")
def _k1(d: jax.Array) -> jax.Array:
  return d


@register_kl_penalty("abs")
def _abs(d: jax.Array) -> jax.Array:
  return jnp.abs(d)


@register_kl_penalty("mse")
def _k2(d: jax.Array) -> jax.Array:
  return 0.5 * jnp.square(d)


@register_kl_penalty("low_var_kl")
def _k3(d: jax.Array) -> jax.Array:
  neg = jnp.clip(-d, -_K3_LOG_RATIO_CLAMP, _K3_LOG_RATIO_CLAMP)  # log(ref / pi)
  return jnp.clip(jnp.exp(neg) - neg - 1.0, -_K3_CLAMP, _K3_CLAMP)


def check_kind(kind: str) -> None:
  if kind not in KL_PENALTIES:
    raise ValueError(f"unknown kl penalty {kind!r}; use one of {tuple(KL_PENALTIES)}")


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, kind: str = "low_var_kl") -> jax.Array:
  """Per-token KL estimate (table in the module docstring): float32 `[B, T]`."""
  check_kind(kind)
  return KL_PENALTIES[kind](jnp.asarray(logprobs, jnp.float32) - jnp.asarray(ref_logprobs, jnp.float32))


def compute_kl_loss(logprobs: jax.Array, ref_logprobs: jax.Array, action_mask: jax.Array, *,
                    kind: str = "low_var_kl", loss_agg_mode: str = "token-mean",
                    horizon: int | None = None) -> Aggregate:
  """KL to the reference policy as a loss term (`Aggregate` over the mask; trainer scales by its coef).

  Inputs off the mask are replaced by zeros first, so they get exactly zero gradient.

  Args:
    logprobs: float `[B, T]` current policy (differentiated).
    ref_logprobs: float `[B, T]` reference policy.
    action_mask: 0/1 `[B, T]`.
    kind: one of `KL_PENALTIES`.
    loss_agg_mode: one of `rl.aggregation.LOSS_AGG_MODES`.
    horizon: H of `seq-mean-token-sum-norm` (default T).
  """
  aggregation.check_mode(loss_agg_mode)
  on, logp, ref = zero_off_mask(action_mask, logprobs, ref_logprobs)
  return aggregation.aggregate(kl_penalty(logp, ref, kind), on, loss_agg_mode, horizon)


def apply_kl_penalty(token_level_rewards: jax.Array, logprobs: jax.Array, ref_logprobs: jax.Array,
                     action_mask: jax.Array, beta: float | jax.Array, *,
                     kind: str = "kl") -> tuple[jax.Array, Aggregate]:
  """KL in the reward: `r'_t = r_t - beta * kl_t * m_t`.

  Args:
    token_level_rewards: float `[B, T]`.
    logprobs: float `[B, T]` log-probs of the sampling policy.
    ref_logprobs: float `[B, T]`.
    action_mask: 0/1 `[B, T]`.
    beta: KL coefficient (from a controller's `.value`).
    kind: one of `KL_PENALTIES`.

  Returns:
    `(rewards [B, T] float32, kl)`, where `kl` is an `Aggregate` whose value is the batch mean over rows
    of each row's token-mean KL: feed `kl.value()` to the controller's `update` with `n_steps=B`.
  """
  on, logp, ref = zero_off_mask(action_mask, logprobs, ref_logprobs)
  kl = jnp.where(on, kl_penalty(logp, ref, kind), 0.0)
  rewards = jnp.asarray(token_level_rewards, jnp.float32) - beta * kl
  return rewards, aggregation.aggregate(kl, on, "seq-mean-token-mean")


class FixedKLController:
  """Constant KL coefficient."""

  def __init__(self, kl_coef: float):
    if kl_coef < 0 or not math.isfinite(kl_coef):
      raise ValueError(f"kl_coef must be a finite number >= 0, got {kl_coef}")
    self.value = float(kl_coef)

  def update(self, current_kl: float, n_steps: int) -> None:
    del current_kl, n_steps


class AdaptiveKLController:
  """Adaptive coefficient steering the observed KL towards `target_kl` (Ziegler et al. 2019).

      e     = clip(current_kl / target_kl - 1, -0.2, 0.2)
      beta <- beta * (1 + e * n_steps / horizon)
  """

  def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
    if init_kl_coef < 0 or not math.isfinite(init_kl_coef):
      raise ValueError(f"init_kl_coef must be a finite number >= 0, got {init_kl_coef}")
    if target_kl <= 0:
      raise ValueError(f"target_kl must be > 0 for the adaptive KL controller, got {target_kl}")
    if horizon <= 0:
      raise ValueError(f"horizon must be > 0 for the adaptive KL controller, got {horizon}")
    self.value = float(init_kl_coef)
    self.target = float(target_kl)
    self.horizon = float(horizon)

  def update(self, current_kl: float, n_steps: int) -> None:
    error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
    self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(kind: str, kl_coef: float, target_kl: float | None = None,
                       horizon: float | None = None) -> FixedKLController | AdaptiveKLController:
  """`"fixed"` or `"adaptive"` controller from config values."""
  if kind == "fixed":
    return FixedKLController(kl_coef)
  if kind == "adaptive":
    if target_kl is None or horizon is None:
      raise ValueError("the adaptive KL controller needs target_kl and horizon in the config")
    return AdaptiveKLController(kl_coef, target_kl, horizon)
  raise ValueError(f"unknown KL controller {kind!r}; use one of {KL_CONTROLLERS}")
