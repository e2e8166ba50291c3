"""Masked grouped-query attention, dense or in blocks, without ever holding a `[B, H, T, S]` score array
when blocks are asked for.

Shapes: q `[B, K, G, T, d]` (K key/value heads, G query heads per KV head), keys `[B, K, S, d]` or
`[B, K, d, S]` (the KV cache's key-major layout), values `[B, K, S, d]`. A query in slot `q` may attend to
key slot `s` iff `key_valid[b, s] and s <= q`:

    scores = q k^T / sqrt(d) + bias,  bias = 0 where visible, -1e30 elsewhere (finite: a query with no
                                      visible key, e.g. a pad, gets uniform weights instead of NaN)
    out    = softmax(scores) v

Dense: the whole `[B, K, G, T, S]` float32 score array at once (decode's T = 1, and every call whose T and
S fit one block). Blocked (`chunk` = C): queries in blocks of C (a `lax.map`, each block rematerialised in
the backward pass), and within a block the keys in blocks of C with the online softmax

    m' = max(m, max_s scores_j)      l' = l e^(m - m') + sum_s e^(scores_j - m')
    acc' = acc e^(m - m') + e^(scores_j - m') v_j                  out = acc / l

so one step holds `[B, K, G, C, C]` scores: at T = S = 8192 that is 256x less than dense. Equal to the dense
result up to float rounding (tested).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30


def visibility_bias(query_slots: jax.Array, key_valid: jax.Array, first_key_slot: jax.Array | int = 0
                    ) -> jax.Array:
  """float32 `[B, 1, 1, T, S]`: 0 where query slot `query_slots[b, t]` sees key slot `first_key_slot + s`."""
  key_slots = first_key_slot + jnp.arange(key_valid.shape[1], dtype=jnp.int32)
  visible = key_valid[:, None, :] & (key_slots[None, None, :] <= query_slots[:, :, None])
  return jnp.where(visible, 0.0, NEG_INF).astype(jnp.float32)[:, None, None, :, :]


def _scores(q: jax.Array, keys: jax.Array, keys_major: bool) -> jax.Array:
  spec = "bkgth,bkhs->bkgts" if keys_major else "bkgth,bksh->bkgts"
  return jnp.einsum(spec, q, keys, preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)


def _dense(q, keys, values, query_slots, key_valid, keys_major):
  scores = _scores(q, keys, keys_major) + visibility_bias(query_slots, key_valid)
  weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  return jnp.einsum("bkgts,bksh->bkgth", weights, values)


def _key_blocks(q, keys, values, query_slots, key_valid, keys_major, chunk):
  """Online softmax over key blocks of `chunk` slots (S is a multiple of `chunk`)."""
  b, k, g, t, d = q.shape
  key_axis = 3 if keys_major else 2

  def step(carry, j):
    m, l, acc = carry
    start = j * chunk
    k_j = jax.lax.dynamic_slice_in_dim(keys, start, chunk, axis=key_axis)
    v_j = jax.lax.dynamic_slice_in_dim(values, start, chunk, axis=2)
    valid_j = jax.lax.dynamic_slice_in_dim(key_valid, start, chunk, axis=1)
    s = _scores(q, k_j, keys_major) + visibility_bias(query_slots, valid_j, start)
    # The running max only shifts the exponentials (the result does not depend on it): no gradient.
    m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(s, axis=-1)))
    correction = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[..., None])
    l = l * correction + jnp.sum(p, axis=-1)
    pv = jnp.einsum("bkgts,bksh->bkgth", p.astype(q.dtype), v_j, preferred_element_type=jnp.float32)
    return (m_new, l, acc * correction[..., None] + pv), None

  init = (jnp.full((b, k, g, t), -jnp.inf, jnp.float32), jnp.zeros((b, k, g, t), jnp.float32),
          jnp.zeros((b, k, g, t, d), jnp.float32))
  (_, l, acc), _ = jax.lax.scan(step, init, jnp.arange(key_valid.shape[1] // chunk))
  return (acc / l[..., None]).astype(q.dtype)


def _pad_axis(x: jax.Array, axis: int, multiple: int, value=0) -> jax.Array:
  extra = -x.shape[axis] % multiple
  if not extra:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def attend(q: jax.Array, keys: jax.Array, values: jax.Array, query_slots: jax.Array, key_valid: jax.Array, *,
           keys_major: bool, chunk: int = 0) -> jax.Array:
  """softmax(q k^T / sqrt(d) + visibility bias) v, `[B, K, G, T, d]` in q's dtype (see the module docstring).

  Args:
    q: `[B, K, G, T, d]` queries (after RoPE).
    keys: `[B, K, d, S]` if `keys_major` else `[B, K, S, d]`.
    values: `[B, K, S, d]`.
    query_slots: int32 `[B, T]`, the slot of each query (its position among the call's key slots).
    key_valid: bool `[B, S]`, slot holds a real token.
    keys_major: the layout of `keys`.
    chunk: block size C for queries and keys (0: always dense). Calls with T = 1 (decode) or with T and S
      both <= C are dense.
  """
  t, s = q.shape[3], key_valid.shape[1]
  if not chunk or t == 1 or (t <= chunk and s <= chunk):
    return _dense(q, keys, values, query_slots, key_valid, keys_major)
  if s > chunk:  # padded key slots are invalid, so they take no weight
    keys = _pad_axis(keys, 3 if keys_major else 2, chunk)
    values = _pad_axis(values, 2, chunk)
    key_valid = _pad_axis(key_valid, 1, chunk, False)

  def block(q_c, slots_c):
    if key_valid.shape[1] <= chunk:
      return _dense(q_c, keys, values, slots_c, key_valid, keys_major)
    return _key_blocks(q_c, keys, values, slots_c, key_valid, keys_major, chunk)

  if t <= chunk:
    return block(q, query_slots)
  b, k, g, _, d = q.shape
  n = -(-t // chunk)
  # Padded queries see no key (slot -1): uniform weights, finite, dropped below.
  q_blocks = _pad_axis(q, 3, chunk).reshape(b, k, g, n, chunk, d).transpose(3, 0, 1, 2, 4, 5)
  slot_blocks = _pad_axis(query_slots, 1, chunk, -1).reshape(b, n, chunk).transpose(1, 0, 2)
  out = jax.lax.map(lambda xs: jax.checkpoint(block)(*xs), (q_blocks, slot_blocks))
  return out.transpose(1, 2, 3, 0, 4, 5).reshape(b, k, g, n * chunk, d)[:, :, :, :t]
