"""Attention of new queries over one device's paged KV cache (`models.paged_kv_cache`), by the maintained kernels.

Inputs (one device's rows): q `[b, K, G, T, hd]` after RoPE, the rows' T new tokens at positions `lengths[b] + t`,
whose keys and values are already in the pool; `page_table` `[b, n]`; `lengths` `[b]` the tokens before this
call. Query t of row b sees positions 0 .. lengths[b] + t (causal over the row's context):

    out[b, k, g, t] = softmax_s(q[b, k, g, t] . key[b, k, s] / sqrt(hd), s <= lengths[b] + t) . value[b, k, s]

A row's padded tail (an append shorter than T) gives queries whose outputs the caller drops; their keys sit past
every real query's position, so no real query sees them.

Backends (`BACKENDS`; `default_backend` picks by platform, `model.paged_attention` overrides):

  xla                every position of the rows' tables gathered, then `attention.attend` (dense, or in blocks
                     of `chunk`): any platform, either layout; the reference and the CPU path.
  ragged_paged       `pallas.ops.tpu.ragged_paged_attention` (TPU; combined layout): reads only the pages up to
                     each row's length, for decode and for appends (the queries flattened, T per row).
  pallas_gpu_decode  `pallas.ops.gpu.paged_attention` (GPU; head_major layout) for decode (T = 1); appends take
                     the xla path. Off a GPU it runs in Pallas interpret mode (tests).
  pallas_tpu_decode  `pallas.ops.tpu.paged_attention` (TPU; head_major layout) for decode; appends take the xla
                     path. Under `pltpu.force_tpu_interpret_mode()` it runs on CPU (tests).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agent_r1_jax.models import paged_kv_cache

BACKENDS = ("xla", "ragged_paged", "pallas_gpu_decode", "pallas_tpu_decode")
# The lane width each backend's pages store heads in (`paged_kv_cache.stored_heads`: narrower heads packed or padded).
HEAD_MULTIPLE = {"ragged_paged": 128}
_LAYOUT = {"ragged_paged": "combined", "pallas_gpu_decode": "head_major", "pallas_tpu_decode": "head_major"}

# Ragged Paged Attention's blocks: ~1024 key positions and 32 queries per step (its autotuner's defaults for
# current chips; the tuner itself asks the host device for a TPU version, which a CPU host compiling for a TPU
# slice does not have).
RPA_KV_POSITIONS_PER_BLOCK = 1024
RPA_QUERIES_PER_BLOCK = 32


def default_backend(platform: str | None = None) -> str:
  """The kernel for `platform` (default: JAX's default backend): TPU ragged_paged, GPU pallas_gpu_decode, else xla."""
  platform = platform or jax.default_backend()
  return {"tpu": "ragged_paged", "gpu": "pallas_gpu_decode", "cuda": "pallas_gpu_decode"}.get(platform, "xla")


def layout_of(backend: str, *, xla_layout: str = "combined") -> str:
  """The pool layout `backend` reads (the xla backend reads either; `xla_layout` then)."""
  if backend not in BACKENDS:
    raise ValueError(f"paged attention backend must be one of {list(BACKENDS)}, got {backend!r}")
  return _LAYOUT.get(backend, xla_layout)


def attend(q: jax.Array, pool: tuple[jax.Array, ...], layout: str, page_table: jax.Array, lengths: jax.Array, *,
           backend: str, chunk: int = 0) -> jax.Array:
  """`[b, K, G, T, hd]` in q's dtype: the module docstring's attention through `backend`."""
  t = q.shape[3]
  if backend == "ragged_paged":
    return _ragged_paged(q, pool[0], page_table, lengths)
  if backend in ("pallas_gpu_decode", "pallas_tpu_decode") and t == 1:
    return _paged_decode(q, pool, page_table, lengths, gpu=backend == "pallas_gpu_decode")
  return _gathered(q, pool, layout, page_table, lengths, chunk)


def _gathered(q, pool, layout, page_table, lengths, chunk):
  from agent_r1_jax.models.attention import attend as attend_dense  # pylint: disable=import-outside-toplevel
  keys, values = paged_kv_cache.gather(pool, layout, page_table, q.shape[1], q.shape[-1])
  b, t = q.shape[0], q.shape[3]
  query_slots = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  key_valid = jnp.ones((b, keys.shape[2]), bool)  # causality (s <= query slot) bounds every row
  return attend_dense(q, keys.astype(q.dtype), values.astype(q.dtype), query_slots, key_valid, chunk=chunk)


def _ragged_paged(q, pages, page_table, lengths):
  from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa  # pylint: disable=import-outside-toplevel
  b, k, g, t, hd = q.shape
  n, page_size, stored, width = page_table.shape[1], pages.shape[1], pages.shape[2] // 2, pages.shape[3]
  # Query head k g + j reads key/value head k. Packed pages (stored < k): head k sits in lanes (k mod p) hd of stored
  # head k // p, so its queries go there too, zero elsewhere, and read those lanes of the output.
  pack = k // stored
  q = q.transpose(0, 3, 1, 2, 4)  # [b, t, K, G, hd]
  if pack > 1:
    spread = jnp.eye(pack, dtype=q.dtype)[jnp.arange(k) % pack]  # [K, p]: head k's lane block
    q = (q[..., None, :] * spread[:, None, :, None]).reshape(b, t, k, g, pack * hd)
  flat = paged_kv_cache.to_stored(q.reshape(b * t, k * g, q.shape[-1])[..., None, :], width)[..., 0, :]
  kv_lens = jnp.minimum(lengths + t, n * page_size).astype(jnp.int32)
  cu_q_lens = (jnp.arange(b + 1, dtype=jnp.int32) * t)
  out = rpa.ragged_paged_attention(
      flat, pages.astype(q.dtype), kv_lens, page_table.astype(jnp.int32), cu_q_lens, jnp.array([b], jnp.int32),
      sm_scale=hd ** -0.5, num_kv_pages_per_block=max(1, min(n, RPA_KV_POSITIONS_PER_BLOCK // page_size)),
      num_queries_per_block=min(RPA_QUERIES_PER_BLOCK, b * t))
  out = out.reshape(b, t, k, g, width)
  if pack > 1:  # each head's own lane block
    out = jnp.einsum("btkgpe,kp->btkge", out[..., :pack * hd].reshape(b, t, k, g, pack, hd),
                     jnp.eye(pack, dtype=out.dtype)[jnp.arange(k) % pack])
  return out[..., :hd].transpose(0, 2, 3, 1, 4)


def _paged_decode(q, pool, page_table, lengths, *, gpu):
  """One new token per row; the Pallas paged decode kernels scale neither q nor the scores, so q is pre-scaled."""
  b, k, g, _, hd = q.shape
  n = page_table.shape[1]
  flat = (q[:, :, :, 0] * (hd ** -0.5)).reshape(b, k * g, hd)
  keys, values = (a.astype(q.dtype) for a in pool)
  if gpu:
    from jax.experimental.pallas.ops.gpu import paged_attention as kernel  # pylint: disable=import-outside-toplevel
    per_block = _divisor_at_most(n, 8)
    out = kernel.paged_attention(flat, keys, values, page_table, lengths + 1, block_h=16,
                                 pages_per_compute_block=per_block, k_splits=_divisor_at_most(n // per_block, 16),
                                 interpret=jax.default_backend() != "gpu")
  else:
    from jax.experimental.pallas.ops.tpu import paged_attention as kernel  # pylint: disable=import-outside-toplevel
    out = kernel.paged_attention(flat, keys, values, lengths + 1, page_table,
                                 pages_per_compute_block=_divisor_at_most(n, 8))
  return out.reshape(b, k, g, 1, hd).astype(q.dtype)


def _divisor_at_most(n: int, cap: int) -> int:
  """The largest divisor of n that is <= cap (the kernels split a row's pages into equal blocks)."""
  return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


__all__ = ["BACKENDS", "HEAD_MULTIPLE", "attend", "default_backend", "layout_of"]
