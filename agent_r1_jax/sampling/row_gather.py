"""Per-device row gather and scatter: the slot engine's compacted calls (`sampling.slots`).

An array `x` `[N, ...]` whose rows are split over the D batch devices (data x fsdp; device d holds rows
[d N / D, (d + 1) N / D)) is viewed as `[D, N / D, ...]`; `rows` int32 `[D, m]` names, per device, m of its own rows
(local indices). `take_rows` gathers them into `[D m, ...]`, block d being device d's, and `put_rows` writes such a
block array back. Both are a vmap over the device axis, so with the view and the result constrained to the rows'
sharding each device reads and writes only its own rows: no communication.

Example (N = 8 rows on D = 4 devices, 2 each; m = 1): rows = [[1], [0], [1], [1]] takes global rows 1, 2, 5, 7.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

import dataclasses

from agent_r1_jax.models.kv_cache import KVCache, kv_axes
from agent_r1_jax.models.paged_kv_cache import PagedKVCache
from agent_r1_jax.models.sharding import constrain


def _rows_view(x: jax.Array, devices: int, names: Sequence[str | None]) -> jax.Array:
  """`x` `[N, ...]` (rows over the batch devices) as `[D, N / D, ...]`: device d's rows in block d."""
  view = x.reshape(devices, x.shape[0] // devices, *x.shape[1:])
  return constrain(view, (names[0], None, *names[1:]))


def take_rows(x: jax.Array, rows: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """`[D m, ...]`: device d's local rows `rows[d]` (int32 `[D, m]`, indices into its N / D rows) of `x` `[N, ...]`,
  gathered where they live (block d of the result is device d's); `names` are `x`'s logical axes."""
  devices, m = rows.shape
  picked = jax.vmap(lambda block, index: block[index])(_rows_view(x, devices, names), rows)
  return constrain(picked.reshape(devices * m, *x.shape[1:]), names)


def put_rows(x: jax.Array, rows: jax.Array, values: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """`x` with device d's local rows `rows[d]` set to block d of `values` `[D m, ...]` (the inverse of `take_rows`;
  `rows[d]` must not repeat an index)."""
  devices, m = rows.shape
  updated = jax.vmap(lambda block, index, new: block.at[index].set(new, unique_indices=True))(
      _rows_view(x, devices, names), rows, values.reshape(devices, m, *values.shape[1:]))
  return constrain(updated.reshape(x.shape), names)


def take_cache_rows(cache: KVCache | PagedKVCache, rows: jax.Array, kv_heads: int) -> KVCache | PagedKVCache:
  """The cache's rows `rows` (`take_rows` of every layer's keys and values and of the bookkeeping): `[D m, ...]`.
  A paged cache's pools are shared by its rows and stay whole: only the page tables and lengths are taken."""
  if isinstance(cache, PagedKVCache):
    return dataclasses.replace(cache, page_table=take_rows(cache.page_table, rows, ("batch", None)),
                               lengths=take_rows(cache.lengths, rows, ("batch",)))
  kv = _kv_names(kv_heads)
  return KVCache(k=tuple(take_rows(a, rows, kv) for a in cache.k), v=tuple(take_rows(a, rows, kv) for a in cache.v),
                 valid=take_rows(cache.valid, rows, ("batch", None)),
                 lengths=take_rows(cache.lengths, rows, ("batch",)), cursor=take_rows(cache.cursor, rows, ("batch",)))


def put_cache_rows(cache: KVCache | PagedKVCache, rows: jax.Array, part: KVCache | PagedKVCache, kv_heads: int
                   ) -> KVCache | PagedKVCache:
  """`cache` with its rows `rows` replaced by `part` (`take_cache_rows`' inverse)."""
  if isinstance(cache, PagedKVCache):  # the part's pools are the whole updated pools
    return dataclasses.replace(cache, pools=part.pools, lengths=put_rows(cache.lengths, rows, part.lengths, ("batch",)))
  kv = _kv_names(kv_heads)
  return KVCache(k=tuple(put_rows(a, rows, b, kv) for a, b in zip(cache.k, part.k)),
                 v=tuple(put_rows(a, rows, b, kv) for a, b in zip(cache.v, part.v)),
                 valid=put_rows(cache.valid, rows, part.valid, ("batch", None)),
                 lengths=put_rows(cache.lengths, rows, part.lengths, ("batch",)),
                 cursor=put_rows(cache.cursor, rows, part.cursor, ("batch",)))


def _kv_names(kv_heads: int) -> tuple[str | None, ...]:
  """A layer's cache axes under the ambient mesh (`kv_cache.kv_axes`)."""
  mesh = jax.sharding.get_abstract_mesh()
  return kv_axes(kv_heads, 1 if mesh.empty else dict(mesh.shape).get("tensor", 1))


__all__ = ["put_cache_rows", "put_rows", "take_cache_rows", "take_rows"]
