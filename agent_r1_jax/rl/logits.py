"""Quantities read off policy logits: per-token log-probs and entropy, in float32.

Logits are `[B, T, V]` (any float dtype; upcast to float32 first). Both functions use the max-shifted
log-softmax, so large logits do not overflow.

`chunked_logprobs` computes the same two quantities from hidden states `[B, T, D]` and the LM head
without ever holding the `[B, T, V]` logits: at a real vocabulary (V = 151,936) and response length
(T = 7,168) one row's float32 logits are 4.4 GB, more than the rest of a learner step.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from agent_r1_jax.rl import aggregation
from agent_r1_jax.rl.aggregation import Aggregate
from agent_r1_jax.rl.masked import zero_off_mask


def token_logprobs(logits: jax.Array, token_ids: jax.Array, temperature: float = 1.0) -> jax.Array:
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
  on, z = zero_off_mask(action_mask, logits)
  return aggregation.aggregate(entropy_from_logits(z), on, loss_agg_mode, horizon)


def chunked_logprobs(hidden: jax.Array, token_ids: jax.Array, logits_fn: Callable[[jax.Array], jax.Array], *,
                      chunk_size: int, temperature: float = 1.0,
                      with_entropy: bool = False) -> tuple[jax.Array, jax.Array | None]:
  """`token_logprobs` and `entropy_from_logits` of `logits_fn(hidden) / temperature`, block by block.

  The T positions are cut into `n = ceil(T / C)` blocks of C = `chunk_size` (T is padded up to n * C; the
  padding is dropped from the result). A `lax.map` over the blocks computes, for block c,

      z_c = logits_fn(hidden[:, cC:(c+1)C]) / temperature             [B, C, V] float32
      logp[:, cC:(c+1)C] = z_c[token] - logsumexp(z_c)
      entropy[:, cC:(c+1)C] = logsumexp(z_c) - sum_v softmax(z_c)_v z_cv

  and keeps only the `[B, C]` results, so at most one block's `[B, C, V]` logits exist at a time. The block
  function is rematerialised (`jax.checkpoint`): the backward pass recomputes each block's logits from its
  `[B, C, D]` hidden slice instead of saving all n blocks' logits. The result equals the unchunked
  computation up to float rounding; with `chunk_size` <= 0 or >= T it is the unchunked computation.

  Args:
    hidden: float `[B, T, D]` hidden states, position t predicting `token_ids[:, t]`.
    token_ids: int `[B, T]`.
    logits_fn: `[B, C, D]` -> float32 `[B, C, V]` (the LM head).
    chunk_size: C, positions per block.
    temperature: logits are divided by it (the sampler's temperature, so log-probs match the sampler's).
    with_entropy: also return the per-token entropy (else None).

  Returns:
    `(logprobs [B, T], entropy [B, T] or None)`, float32.
  """
  def block(h, ids):
    z = logits_fn(h).astype(jnp.float32) / temperature
    logp = token_logprobs(z, ids)
    return logp, (entropy_from_logits(z) if with_entropy else jnp.zeros_like(logp))

  b, t = token_ids.shape
  if chunk_size <= 0 or chunk_size >= t:
    logp, entropy = block(hidden, token_ids)
    return logp, (entropy if with_entropy else None)
  n = -(-t // chunk_size)
  pad = n * chunk_size - t
  hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
  token_ids = jnp.pad(token_ids, ((0, 0), (0, pad)))
  # [B, n*C, ...] -> [n, B, C, ...]: the mapped axis is new, so the batch axis keeps its sharding.
  blocks = (hidden.reshape(b, n, chunk_size, hidden.shape[-1]).swapaxes(0, 1),
            token_ids.reshape(b, n, chunk_size).swapaxes(0, 1))
  logp, entropy = jax.lax.map(lambda args: jax.checkpoint(block)(*args), blocks)
  unblock = lambda x: x.swapaxes(0, 1).reshape(b, n * chunk_size)[:, :t]
  return unblock(logp), (unblock(entropy) if with_entropy else None)
