"""Backward linear recurrences over time, restricted to masked tokens.

The paper's estimators delete the observation (unmasked) tokens of a row, run a backward recursion over
what is left and scatter the result back. The same result comes without moving data: at an unmasked
position the recursion passes its carry through untouched. All such recursions here are first-order
linear, so each is one

    x_t = a_t * x_{t+1} + b_t,   x_T = 0,   t = T-1, ..., 0          (per row, arrays [B, T])

with `a_t = 1, b_t = 0` off the mask. Two evaluation strategies give the same numbers (up to float32
rounding):

* `"scan"`: `lax.scan` over the T steps with a `[B]` carry (work O(BT), depth T; best on CPU).
* `"associative"`: `lax.associative_scan` on the affine maps `x -> a x + b`, which compose as
  `(a1, b1) o (a2, b2) = (a1 a2, a1 b2 + b1)` (work O(BT log T), depth O(log T); best on GPU/TPU).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from agent_r1_jax.rl.masked import as_float_mask, zero_off_mask

ScanMethod = Literal["scan", "associative"]
SCAN_METHODS: tuple[str, ...] = ("scan", "associative")


def check_method(method: str) -> None:
  if method not in SCAN_METHODS:
    raise ValueError(f"unknown recurrence method {method!r}; use one of {SCAN_METHODS}")


def reverse_linear_recurrence(decay: jax.Array, inputs: jax.Array, method: ScanMethod = "scan") -> jax.Array:
  """Solves `x_t = decay_t * x_{t+1} + inputs_t` backwards along axis 1 with `x_T = 0`.

  Args:
    decay: float32 `[B, T]`.
    inputs: float32 `[B, T]`.
    method: `"scan"` or `"associative"` (see the module docstring).

  Returns:
    float32 `[B, T]`, the solution `x`.
  """
  check_method(method)
  decay = jnp.asarray(decay, jnp.float32)
  inputs = jnp.asarray(inputs, jnp.float32)
  if method == "associative":
    def compose(later, earlier):
      # With reverse=True the scan runs from t = T-1 down; `later` holds the map already accumulated
      # for the positions after t, `earlier` the map of position t: x_t = a_t (A x + B) + b_t.
      a_l, b_l = later
      a_e, b_e = earlier
      return a_e * a_l, a_e * b_l + b_e

    _, x = jax.lax.associative_scan(compose, (decay, inputs), reverse=True, axis=1)
    return x

  def step(carry, ab):
    a, b = ab
    x = a * carry + b
    return x, x

  _, xs = jax.lax.scan(step, jnp.zeros(decay.shape[0], jnp.float32), (decay.T, inputs.T), reverse=True)
  return xs.T


def masked_discounted_returns(rewards: jax.Array, mask: jax.Array, gamma: float | jax.Array,
                              method: ScanMethod = "scan") -> jax.Array:
  """Discounted return over masked positions only, as if unmasked tokens were deleted.

  `G_t = r_t + gamma * G_{next(t)}` at masked t, where `next(t)` is the next masked position of the row
  (`G = 0` after the last one). Rewards at unmasked positions are ignored; the output is 0 there.

  Args:
    rewards: float `[B, T]`.
    mask: 0/1 `[B, T]`.
    gamma: discount factor.
    method: recurrence strategy.

  Returns:
    float32 `[B, T]`.
  """
  m = jnp.asarray(mask).astype(jnp.float32)
  decay = 1.0 - m + m * gamma
  carry = reverse_linear_recurrence(decay, jnp.where(m > 0, rewards, 0.0), method)
  return jnp.where(m > 0, carry, 0.0)


def masked_gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float | jax.Array,
               lam: float | jax.Array, method: ScanMethod = "scan") -> jax.Array:
  """Raw (unwhitened) GAE over masked positions only, as if unmasked tokens were deleted.

  At masked t, with `n(t)` the next masked position of the row:

      delta_t = r_t + gamma * V_{n(t)} - V_t        (V_{n(t)} = 0 after the last masked position)
      A_t     = delta_t + gamma * lam * A_{n(t)}    (A_{n(t)} = 0 likewise)

  The value at the next masked position is itself a backward recurrence, `u_t = V_t` at masked t and
  `u_t = u_{t+1}` elsewhere, and `V_{n(t)} = u_{t+1}`. Rewards and values at unmasked positions are
  ignored; the output is 0 there.

  Args:
    rewards, values: float `[B, T]`.
    mask: 0/1 `[B, T]`.
    gamma, lam: discount and GAE lambda.
    method: recurrence strategy.

  Returns:
    float32 `[B, T]` advantages.
  """
  m = as_float_mask(mask)
  on, r, v = zero_off_mask(m, rewards, values)
  gl_decay = 1.0 - m + m * (gamma * lam)
  if method == "associative":
    u = reverse_linear_recurrence(1.0 - m, v, method)
    next_v = jnp.concatenate([u[:, 1:], jnp.zeros_like(u[:, :1])], axis=1)
    delta = jnp.where(on, r + gamma * next_v - v, 0.0)
    adv = reverse_linear_recurrence(gl_decay, delta, method)
    return jnp.where(on, adv, 0.0)
  check_method(method)

  # One fused pass carrying (value at next masked position, advantage at next masked position).
  def step(carry, xs):
    next_v, next_a = carry
    m_t, r_t, v_t, d_t = xs
    delta = m_t * (r_t + gamma * next_v - v_t)
    a = d_t * next_a + delta
    u = (1.0 - m_t) * next_v + m_t * v_t
    return (u, a), a

  zeros = jnp.zeros(m.shape[0], jnp.float32)
  _, adv = jax.lax.scan(step, (zeros, zeros), (m.T, r.T, v.T, gl_decay.T), reverse=True)
  return jnp.where(on, adv.T, 0.0)
