"""Masked grouped-query attention, dense or in blocks, without ever holding a `[B, H, T, S]` score array
when blocks are asked for.

Shapes: q `[B, K, G, T, d]` (K key/value heads, G query heads per KV head), keys and values `[B, K, S, d]`
(`attend`), or the KV cache's packed `[B, S, K * d]` (`attend_packed`). A query in slot `q` may attend to key
slot `s` iff `key_valid[b, s] and s <= q`:

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

Paged (`attend_paged`, the slot engine's cache `models.paged_kv_cache`): the new tokens' keys and values are
written into the rows' pages, then a kernel reads the pages (`models.paged_attention`: the TPU Ragged Paged
Attention kernel, the Pallas paged decode kernels, or an XLA gather), per device: under a mesh, one `shard_map`
over the batch devices (rows and their pages live on the same device) and, when whole KV heads divide it, the
tensor axis.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from agent_r1_jax.models import paged_attention, paged_kv_cache
from agent_r1_jax.models.sharding import SAMPLING_RULES, logical_to_spec

NEG_INF = -1e30


def visibility_bias(query_slots: jax.Array, key_valid: jax.Array, first_key_slot: jax.Array | int = 0
                    ) -> jax.Array:
  """float32 `[B, 1, 1, T, S]`: 0 where query slot `query_slots[b, t]` sees key slot `first_key_slot + s`."""
  key_slots = first_key_slot + jnp.arange(key_valid.shape[1], dtype=jnp.int32)
  visible = key_valid[:, None, :] & (key_slots[None, None, :] <= query_slots[:, :, None])
  return jnp.where(visible, 0.0, NEG_INF).astype(jnp.float32)[:, None, None, :, :]


def _scores(q: jax.Array, keys: jax.Array) -> jax.Array:
  return jnp.einsum("bkgth,bksh->bkgts", q, keys, preferred_element_type=jnp.float32) * (q.shape[-1] ** -0.5)


def _dense(q, keys, values, query_slots, key_valid):
  scores = _scores(q, keys) + visibility_bias(query_slots, key_valid)
  weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
  return jnp.einsum("bkgts,bksh->bkgth", weights, values)


def _key_blocks(q, keys, values, query_slots, key_valid, chunk):
  """Online softmax over key blocks of `chunk` slots (S is a multiple of `chunk`)."""
  b, k, g, t, d = q.shape

  def step(carry, j):
    m, l, acc = carry
    start = j * chunk
    k_j = jax.lax.dynamic_slice_in_dim(keys, start, chunk, axis=2)
    v_j = jax.lax.dynamic_slice_in_dim(values, start, chunk, axis=2)
    valid_j = jax.lax.dynamic_slice_in_dim(key_valid, start, chunk, axis=1)
    s = _scores(q, k_j) + visibility_bias(query_slots, valid_j, start)
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
           chunk: int = 0) -> jax.Array:
  """softmax(q k^T / sqrt(d) + visibility bias) v, `[B, K, G, T, d]` in q's dtype (see the module docstring).

  Args:
    q: `[B, K, G, T, d]` queries (after RoPE).
    keys: `[B, K, S, d]`.
    values: `[B, K, S, d]`.
    query_slots: int32 `[B, T]`, the slot of each query (its position among the call's key slots).
    key_valid: bool `[B, S]`, slot holds a real token.
    chunk: block size C for queries and keys (0: always dense). Calls with T = 1 (decode) or with T and S
      both <= C are dense.
  """
  t, s = q.shape[3], key_valid.shape[1]
  if not chunk or t == 1 or (t <= chunk and s <= chunk):
    return _dense(q, keys, values, query_slots, key_valid)
  if s > chunk:  # padded key slots are invalid, so they take no weight
    keys = _pad_axis(keys, 2, chunk)
    values = _pad_axis(values, 2, chunk)
    key_valid = _pad_axis(key_valid, 1, chunk, False)

  def block(q_c, slots_c):
    if key_valid.shape[1] <= chunk:
      return _dense(q_c, keys, values, slots_c, key_valid)
    return _key_blocks(q_c, keys, values, slots_c, key_valid, chunk)

  if t <= chunk:
    return block(q, query_slots)
  b, k, g, _, d = q.shape
  n = -(-t // chunk)
  # Padded queries see no key (slot -1): uniform weights, finite, dropped below.
  q_blocks = _pad_axis(q, 3, chunk).reshape(b, k, g, n, chunk, d).transpose(3, 0, 1, 2, 4, 5)
  slot_blocks = _pad_axis(query_slots, 1, chunk, -1).reshape(b, n, chunk).transpose(1, 0, 2)
  out = jax.lax.map(lambda xs: jax.checkpoint(block)(*xs), (q_blocks, slot_blocks))
  return out.transpose(1, 2, 3, 0, 4, 5).reshape(b, k, g, n * chunk, d)[:, :, :, :t]


def attend_packed(q: jax.Array, keys: jax.Array, values: jax.Array, query_slots: jax.Array,
                  key_valid: jax.Array) -> jax.Array:
  """Dense attention over the KV cache's packed layout, read in place: `[B, K, G, T, d]` in q's dtype.

  With keys and values `[B, S, K * d]` (head j in lanes `[j d, (j + 1) d)`), each query is spread over the K
  head blocks with zeros outside its own, q'[b, k, g, t, (j, e)] = [j = k] q[b, k, g, t, e], so that

      scores[b, k, g, t, s] = sum_c q'[b, k, g, t, c] keys[b, s, c] / sqrt(d)     (only block k is nonzero)
      y[b, k, g, t, (j, e)] = sum_s softmax(scores)[b, k, g, t, s] values[b, s, (j, e)]
      out[b, k, g, t, e]    = y[b, k, g, t, (k, e)]                               (the diagonal block)

  This costs K times the attention flops of `attend` and reads the cache once in the layout the decode loop
  writes it in: at T = 1 a step is bound by the bytes it reads, not by these flops, and unpacking the cache
  to `[B, K, S, d]` would copy it on every step.
  """
  b, k, g, t, d = q.shape
  eye = jnp.eye(k, dtype=q.dtype)
  spread = (q[:, :, :, :, None, :] * eye[None, :, None, None, :, None]).reshape(b, k, g, t, k * d)
  scores = jnp.einsum("bkgtc,bsc->bkgts", spread, keys, preferred_element_type=jnp.float32) * (d ** -0.5)
  scores = scores + visibility_bias(query_slots, key_valid)
  # The softmax is normalised after the value product, on the [.., K * d] output instead of the [.., S] weights:
  # one pass less over the float32 scores, which are the largest arrays of a decode step after the cache.
  e = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  blocks = jnp.einsum("bkgts,bsc->bkgtc", e.astype(q.dtype), values, preferred_element_type=jnp.float32)
  blocks = (blocks / jnp.sum(e, axis=-1, keepdims=True)).reshape(b, k, g, t, k, d)
  return jnp.einsum("bkgtje,kj->bkgte", blocks, eye.astype(blocks.dtype)).astype(q.dtype)


def attend_paged(q: jax.Array, keys: jax.Array, values: jax.Array, pool: tuple[jax.Array, ...], page_table: jax.Array,
                 lengths: jax.Array, *, layout: str, backend: str, chunk: int = 0
                 ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """New tokens written into a paged cache, then their attention over it: (out `[B, K, G, T, d]`, updated pool).

  Args:
    q: `[B, K, G, T, d]` queries of the rows' T new tokens (after RoPE), at positions `lengths[b] + t`.
    keys: `[B, T, K, d]` their keys (after RoPE); values: `[B, T, K, d]`.
    pool: one layer's page pool (`paged_kv_cache.pool_shapes`), split over the batch devices.
    page_table: int32 `[B, n]` local page ids; lengths: int32 `[B]`, tokens before this call.
    layout, backend: the pool's layout and the kernel that reads it (`models.paged_attention`).
    chunk: block size of the xla path's attention (`attend`).
  """
  t = q.shape[3]

  def local(q, keys, values, pool, page_table, lengths):
    positions = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    pool = paged_kv_cache.write(pool, layout, keys, values, page_table, positions)
    return paged_attention.attend(q, pool, layout, page_table, lengths, backend=backend, chunk=chunk), pool

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or math.prod(mesh.shape.values()) == 1:
    return local(q, keys, values, pool, page_table, lengths)
  k = q.shape[1]
  heads = "act_kv_heads" if k % dict(mesh.shape).get("tensor", 1) == 0 else None
  spec = lambda x, names: logical_to_spec(x.shape, names, mesh, SAMPLING_RULES)  # noqa: E731
  pool_names = paged_kv_cache.pool_axes(layout, k, dict(mesh.shape).get("tensor", 1))
  in_specs = (spec(q, ("batch", heads, None, None, None)), spec(keys, ("batch", None, heads, None)),
              spec(values, ("batch", None, heads, None)), tuple(spec(a, pool_names) for a in pool),
              spec(page_table, ("batch", None)), spec(lengths, ("batch",)))
  out_specs = (in_specs[0], in_specs[3])
  # Pallas kernels carry no varying-axes annotations, hence check_vma=False.
  return jax.shard_map(local, in_specs=in_specs, out_specs=out_specs, check_vma=False)(
      q, keys, values, pool, page_table, lengths)
