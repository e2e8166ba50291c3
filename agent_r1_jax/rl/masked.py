"""Masked reductions and whitening over `[B, T]` token arrays.

A mask is 1 (or True) at the tokens that take part and 0 elsewhere. Every reduction here is global over
the whole array it is given (all rows together), which under `jax.jit` on a sharded batch is a
cross-device reduction that XLA inserts; the results do not depend on how the batch is sharded.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

WHITEN_EPS = 1e-8


def as_float_mask(mask: jax.Array) -> jax.Array:
  """A bool/int/float 0-1 mask as float32."""
  return jnp.asarray(mask).astype(jnp.float32)


def masked_sum(x: jax.Array, mask: jax.Array, axis: int | tuple[int, ...] | None = None) -> jax.Array:
  """`sum(x * mask)`, with `x` read only where the mask is 1 (NaN/inf elsewhere cannot leak in)."""
  m = as_float_mask(mask)
  return jnp.sum(jnp.where(m > 0, x, 0.0) * m, axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis: int | tuple[int, ...] | None = None) -> jax.Array:
  """`sum(x * mask) / sum(mask)`; 0 where the mask is empty (instead of 0/0)."""
  m = as_float_mask(mask)
  count = jnp.sum(m, axis=axis)
  return masked_sum(x, m, axis) / jnp.maximum(count, 1.0)


def masked_var(x: jax.Array, mask: jax.Array, unbiased: bool = True) -> jax.Array:
  """Variance over all masked entries: `sum(m * (x - mean)^2) / (n - 1)` (or `/ n` if not unbiased).

  With n <= 1 masked entries the sum of squares is 0 and so is the result.
  """
  m = as_float_mask(mask)
  n = jnp.sum(m)
  mean = masked_mean(x, m)
  sq = masked_sum(jnp.square(x - mean), m)
  dof = jnp.maximum(n - 1.0, 1.0) if unbiased else jnp.maximum(n, 1.0)
  return sq / dof


def masked_whiten(x: jax.Array, mask: jax.Array, shift_mean: bool = True) -> jax.Array:
  """Whitening over the masked tokens of the whole batch, exactly 0 off the mask.

  `y = (x - mu) * rsqrt(var + 1e-8)` on the mask (without `- mu` when `shift_mean` is False), where
  `mu` is the masked mean and `var` the unbiased masked variance of `x`; `y = 0` off the mask.

  Args:
    x: float `[B, T]`.
    mask: 0/1 `[B, T]`.
    shift_mean: subtract the mean (True) or only rescale (False).

  Returns:
    float32 `[B, T]`.
  """
  m = as_float_mask(mask)
  x = jnp.where(m > 0, jnp.asarray(x, jnp.float32), 0.0)
  mean = masked_mean(x, m)
  var = masked_var(x, m, unbiased=True)
  centred = x - mean if shift_mean else x
  return jnp.where(m > 0, centred * jax.lax.rsqrt(var + WHITEN_EPS), 0.0)


def zero_off_mask(mask: jax.Array, *arrays: jax.Array) -> tuple[jax.Array, ...]:
  """`(on, x_1, ..., x_n)`: `on = mask > 0` (bool `[B, T]`) and every `x_i` as float32 with exactly 0 off the mask.

  The prologue of every masked loss: `jnp.where`, not a product, so NaN/inf off the mask cannot leak in and
  the entries off the mask get exactly zero gradient. An `x_i` with a trailing axis more than the mask (logits
  `[B, T, V]`) is zeroed along it too.
  """
  on = as_float_mask(mask) > 0
  zeroed = []
  for x in arrays:
    x = jnp.asarray(x, jnp.float32)
    zeroed.append(jnp.where(on if x.ndim == on.ndim else on[..., None], x, 0.0))
  return (on, *zeroed)
