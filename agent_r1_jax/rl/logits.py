"""Quantities read off policy logits: per-token log-probs and entropy, in float32.

Logits are `[B, T, V]` (any float dtype; upcast to float32 first). Both functions use the max-shifted
log-softmax, so large logits do not overflow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agent_r1_jax.rl import aggregation
from agent_r1_jax.rl.aggregation import Aggregate


def token_log_probs(logits: jax.Array, token_ids: jax.Array, temperature: float = 1.0) -> jax.Array:
  """`log softmax(logits / temperature)[token]`: float32 `[B, T]` from logits `[B, T, V]`, ids `[B, T]`."""
  logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32) / temperature, axis=-1)
  return jnp.take_along_axis(logp, jnp.asarray(token_ids)[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy_from_logits(logits: jax.Array) -> jax.Array:
  """Entropy of `softmax(logits)` per position: `H = logsumexp(z) - sum_v p_v z_v`, float32 `[B, T]`.

  Written with the shifted `z - max(z)` so that it is exact for large logits; logits must be finite.
  """
  z = jnp.asarray(logits, jnp.float32)
  z = z - jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
  lse = jax.nn.logsumexp(z, axis=-1)
  p = jax.nn.softmax(z, axis=-1)
  return lse - jnp.sum(p * z, axis=-1)


def compute_entropy_loss(logits: jax.Array, action_mask: jax.Array, *, loss_agg_mode: str = "token-mean",
                         horizon: int | None = None) -> Aggregate:
  """Masked entropy of the policy, `Aggregate` of `entropy_from_logits` over the mask.

  The trainer adds `- entropy_coeff * entropy` to the loss. Logits at unmasked positions are replaced
  by zeros before the softmax, so they receive exactly zero gradient.

  Args:
    logits: `[B, T, V]`.
    action_mask: 0/1 `[B, T]`.
    loss_agg_mode: one of `rl.aggregation.LOSS_AGG_MODES`.
    horizon: H of `seq-mean-token-sum-norm` (default T).
  """
  aggregation.check_mode(loss_agg_mode)
  on = jnp.asarray(action_mask).astype(jnp.float32) > 0
  z = jnp.where(on[..., None], jnp.asarray(logits, jnp.float32), 0.0)
  return aggregation.aggregate(entropy_from_logits(z), on, loss_agg_mode, horizon)
