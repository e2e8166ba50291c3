"""A paged key/value cache: fixed-size pages in one pool per device, a page table per row.

A row's context (its real tokens, written from position 0, no padding) lives in pages of `page_size` tokens:
position p of row b is offset `p % page_size` of page `page_table[b, p // page_size]`. Page ids are local to the
row's device (rows and pages are split over the same batch devices, data x fsdp, so a row's pages are where the
row is); page 0 of every device is the null page, never handed out: table entries of pages a row has not been
given point at it, so writes past a row's pages (the padded tail of an append, the masked token of a row that
takes no part in a decode step) land there and every page a kernel reads exists. Which pages a row holds is
the host's business (`sampling.page_pool.PagePool`); the device programs only read the table.

Two layouts, each the one its kernels read (`models.paged_attention`):

  combined    one array per layer `[P, page_size, 2K, hd]`, key head j at index 2j and value head j at 2j + 1:
              the TPU Ragged Paged Attention kernel's (prefill, extend and decode in one call);
  head_major  two arrays per layer, keys and values, each `[K, P, page_size, hd]`: the Pallas paged decode
              kernels' (GPU `pallas.ops.gpu.paged_attention`, TPU `pallas.ops.tpu.paged_attention`).

P = devices x pages per device (the pool's page axis is split over the batch devices).

Lanes (`lanes`, 128 for the TPU kernel, which works on whole 128-lane rows; 1 otherwise): heads narrower than a lane
row are stored packed, g = lanes / hd of them side by side in one stored head of width `lanes` (K' = K / g stored
heads; Qwen2.5-0.5B's two 64-wide heads fill one 128-lane row, as the dense cache packs them), when g divides K;
otherwise zero-padded to a multiple of `lanes`. A packed stored head is read by every query head of its g KV heads,
each with its q zero outside its own hd lanes, so q' . k' = q . k of its own head and its output is its own lanes of
the weighted values (`models.paged_attention`). Neither costs HBM over the logical cache when packing applies.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from agent_r1_jax.models.config import Qwen2Config
from agent_r1_jax.models.sharding import constrain

LAYOUTS = ("combined", "head_major")
NULL_PAGE = 0


def pool_axes(layout: str, num_kv_heads: int, tensor: int) -> tuple[str | None, ...]:
  """Logical names of one pool array: pages over the batch devices, heads over tensor when whole heads divide."""
  heads = "act_kv_heads" if num_kv_heads % tensor == 0 else None
  return ("batch", None, heads, None) if layout == "combined" else (heads, "batch", None, None)


def constrain_pool(x: jax.Array, layout: str, num_kv_heads: int) -> jax.Array:
  """One pool array constrained to its `pool_axes` under the ambient mesh (a no-op without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  tensor = 1 if mesh.empty else dict(mesh.shape).get("tensor", 1)
  return constrain(x, pool_axes(layout, num_kv_heads, tensor))


def stored_heads(num_kv_heads: int, head_dim: int, lanes: int = 1) -> tuple[int, int]:
  """(K', hd'): the stored heads and their width for K heads of width hd in rows of `lanes` (module docstring)."""
  if head_dim % lanes == 0:
    return num_kv_heads, head_dim
  group = lanes // head_dim
  if lanes % head_dim == 0 and num_kv_heads % group == 0:
    return num_kv_heads // group, lanes
  return num_kv_heads, -(-head_dim // lanes) * lanes


def pool_shapes(config: Qwen2Config, pages: int, page_size: int, layout: str, lanes: int = 1
                ) -> tuple[tuple[int, ...], ...]:
  """The arrays of one layer's pool: combined `([P, ps, 2K', hd'],)`, head_major `([K', P, ps, hd'],) * 2`, with
  (K', hd') = `stored_heads(K, hd, lanes)`."""
  k, hd = stored_heads(config.num_key_value_heads, config.head_dim, lanes)
  if layout not in LAYOUTS:
    raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
  if layout == "combined":
    return ((pages, page_size, 2 * k, hd),)
  return ((k, pages, page_size, hd),) * 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PagedKVCache:
  """Per-layer page pools plus per-row page tables and lengths (a pytree; donate it to jitted updates).

  Attributes:
    pools: L tuples of pool arrays (`pool_shapes`), cache dtype.
    page_table: int32 `[N, pages_per_row]`, row b's pages in order (local ids; NULL_PAGE where it has none).
    lengths: int32 `[N]`, real tokens per row (= the position of its next token and the slot it is written to).
    layout: "combined" | "head_major" (static).
    backend: how attention reads the pages, `models.paged_attention.BACKENDS` (static).
  """

  pools: tuple[tuple[jax.Array, ...], ...]
  page_table: jax.Array
  lengths: jax.Array
  layout: str = dataclasses.field(metadata=dict(static=True), default="combined")
  backend: str = dataclasses.field(metadata=dict(static=True), default="xla")

  @property
  def cursor(self) -> jax.Array:
    """The next slot to write: rows hold no padding, so their length."""
    return self.lengths

  @property
  def page_size(self) -> int:
    return self.pools[0][0].shape[1 if self.layout == "combined" else 2]

  @property
  def pages_per_row(self) -> int:
    return self.page_table.shape[1]

  @property
  def max_length(self) -> int:
    """Positions a row's table can address."""
    return self.pages_per_row * self.page_size

  @property
  def batch_size(self) -> int:
    return self.page_table.shape[0]


def init_pools(config: Qwen2Config, pages: int, page_size: int, layout: str, dtype, lanes: int = 1
               ) -> tuple[tuple[jax.Array, ...], ...]:
  """Zeroed pools for every layer (`pool_shapes`), constrained to `pool_axes`."""
  shapes = pool_shapes(config, pages, page_size, layout, lanes)
  kv = config.num_key_value_heads
  return tuple(tuple(constrain_pool(jnp.zeros(s, dtype), layout, kv) for s in shapes)
               for _ in range(config.num_hidden_layers))


def token_pages(page_table: jax.Array, positions: jax.Array, page_size: int) -> tuple[jax.Array, jax.Array]:
  """(page, offset), int32 `[b, T]` each, of positions `[b, T]`; positions past the table go to the null page."""
  index = positions // page_size
  inside = index < page_table.shape[1]
  page = jnp.take_along_axis(page_table, jnp.minimum(index, page_table.shape[1] - 1), axis=1)
  return jnp.where(inside, page, NULL_PAGE), positions % page_size


def write(pool: tuple[jax.Array, ...], layout: str, keys: jax.Array, values: jax.Array, page_table: jax.Array,
          positions: jax.Array) -> tuple[jax.Array, ...]:
  """One device's layer pool with `keys`, `values` `[b, T, K, hd]` stored at `positions` `[b, T]` of their rows."""
  page_size = pool[0].shape[1 if layout == "combined" else 2]
  page, offset = token_pages(page_table, positions, page_size)
  width = pool[0].shape[-1]
  keys, values = (to_stored(x, width) for x in (keys, values))
  if layout == "combined":
    b, t, k, hd = keys.shape
    pairs = jnp.stack([keys, values], axis=3).reshape(b, t, 2 * k, hd)  # key j at 2j, value j at 2j + 1
    return (pool[0].at[page, offset].set(pairs.astype(pool[0].dtype)),)
  # head_major `[K, P, ps, hd]`: the heads axis leads, so index pages and offsets under it.
  return tuple(a.at[:, page, offset].set(new.transpose(2, 0, 1, 3).astype(a.dtype))
               for a, new in zip(pool, (keys, values)))


def to_stored(x: jax.Array, width: int) -> jax.Array:
  """Heads `[..., K, hd]` as stored heads of width `width` (`stored_heads`): packed side by side when width is a
  multiple of hd (a reshape: head j in lanes (j mod g) hd of stored head j // g), else zero-padded."""
  *lead, k, hd = x.shape
  if width == hd:
    return x
  if width % hd == 0 and k % (width // hd) == 0:
    return x.reshape(*lead, k * hd // width, width)
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - hd)])


def from_stored(x: jax.Array, num_kv_heads: int, head_dim: int) -> jax.Array:
  """`to_stored`'s inverse: stored heads `[..., K', hd']` back to `[..., K, hd]`."""
  if x.shape[-1] == head_dim:
    return x
  if x.shape[-2] != num_kv_heads:
    return x.reshape(*x.shape[:-2], num_kv_heads, head_dim)
  return x[..., :head_dim]


def gather(pool: tuple[jax.Array, ...], layout: str, page_table: jax.Array, num_kv_heads: int, head_dim: int
           ) -> tuple[jax.Array, jax.Array]:
  """Every position of one device's rows, keys and values `[b, K, S', hd]` with S' = pages_per_row x page_size
  (positions at or past a row's length hold whatever their page holds: the caller masks them)."""
  b, n = page_table.shape
  if layout == "combined":
    pages = pool[0][page_table]  # [b, n, ps, 2K', hd']
    ps, two_k, width = pages.shape[2:]
    pages = pages.reshape(b, n * ps, two_k // 2, 2, width)
    return tuple(from_stored(pages[..., i, :], num_kv_heads, head_dim).transpose(0, 2, 1, 3) for i in (0, 1))
  out = []
  for a in pool:  # [K', P, ps, hd'] -> [K', b, n, ps, hd'] -> [b, n ps, K', hd'] -> [b, K, n ps, hd]
    k, _, ps, width = a.shape
    stored = a[:, page_table].reshape(k, b, n * ps, width).transpose(1, 2, 0, 3)
    out.append(from_stored(stored, num_kv_heads, head_dim).transpose(0, 2, 1, 3))
  return out[0], out[1]


__all__ = ["LAYOUTS", "NULL_PAGE", "PagedKVCache", "constrain_pool", "from_stored", "gather", "init_pools",
           "pool_axes", "pool_shapes", "stored_heads", "to_stored", "token_pages", "write"]
