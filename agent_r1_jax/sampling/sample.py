"""Token selection from logits: greedy, temperature, top-k, top-p (all float32)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agent_r1_jax.sampling.params import SamplingParams

_MASKED = -jnp.inf


def allowed_tokens(scaled: jax.Array, params: SamplingParams) -> jax.Array:
  """bool `[B, V]`: tokens the truncated distribution may emit, for temperature-scaled logits.

  top-k keeps tokens whose logit >= the k-th largest (ties at the boundary are kept). top-p then keeps,
  in descending probability order, every token whose preceding cumulative mass is < top_p (the most
  likely token is always kept), i.e. the smallest prefix reaching mass top_p.
  """
  keep = jnp.ones(scaled.shape, bool)
  if params.top_k and params.top_k < scaled.shape[-1]:
    kth = jax.lax.top_k(scaled, params.top_k)[0][..., -1:]
    keep &= scaled >= kth
  if params.top_p < 1.0:
    masked = jnp.where(keep, scaled, _MASKED)
    order = jnp.argsort(-masked, axis=-1)
    sorted_logits = jnp.take_along_axis(masked, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = mass_before < params.top_p
    keep_sorted = keep_sorted.at[..., 0].set(True)
    rows = jnp.arange(scaled.shape[0])[:, None]
    keep &= jnp.zeros(scaled.shape, bool).at[rows, order].set(keep_sorted)
  return keep


def first_argmax(x: jax.Array) -> jax.Array:
  """int32 `[B]`: the first index of each row's maximum of `x` `[B, V]` (jnp.argmax's tie rule).

  Computed as min{i : x_i = max_j x_j} with two plain reductions, which XLA:CPU runs several times
  faster than argmax's paired (value, index) reduction. A row without a match (NaN) gives V - 1.
  """
  best = jnp.max(x, axis=-1, keepdims=True)
  index = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x == best, index, x.shape[-1] - 1), axis=-1)


def _select(logits: jax.Array, params: SamplingParams, gumbel) -> tuple[jax.Array, jax.Array]:
  """`sample_tokens` with the Gumbel noise drawn by `gumbel(shape, dtype)` (one key, or one per row)."""
  logits = logits.astype(jnp.float32)
  scaled = logits if params.logprob_temperature == 1.0 else logits / params.logprob_temperature
  if params.is_greedy:
    tokens = first_argmax(logits)
  else:
    # Gumbel-max, exactly what jax.random.categorical draws for this key, with the faster argmax.
    masked = jnp.where(allowed_tokens(scaled, params), scaled, _MASKED)
    tokens = first_argmax(gumbel(masked.shape, masked.dtype) + masked)
  # log_softmax(z)[tok] = z[tok] - logsumexp(z): two reductions instead of a [B, V] log-softmax.
  picked = jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0]
  return tokens, picked - jax.nn.logsumexp(scaled, axis=-1)


def sample_tokens(logits: jax.Array, rng: jax.Array, params: SamplingParams
                  ) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row.

  Args:
    logits: float `[B, V]` next-token logits z.
    rng: PRNG key.
    params: static sampling settings.

  Returns:
    tokens int32 `[B]`; logprobs float32 `[B]` = log_softmax(z / T)[token] with T the
    `logprob_temperature` (untruncated distribution).
  """
  return _select(logits, params, lambda shape, dtype: jax.random.gumbel(rng, shape, dtype))


def sample_tokens_per_row(logits: jax.Array, keys: jax.Array, params: SamplingParams
                          ) -> tuple[jax.Array, jax.Array]:
  """`sample_tokens` with row b's noise drawn from its own key: `keys` is a `[B]` array of PRNG keys.

  Row b's token depends only on `logits[b]` and `keys[b]` (the noise is `gumbel(keys[b], [V])`), so a row
  samples the same token whichever other rows share its batch and wherever it sits in it.
  """
  return _select(logits, params,
                 lambda shape, dtype: jax.vmap(lambda key: jax.random.gumbel(key, shape[1:], dtype))(keys))
