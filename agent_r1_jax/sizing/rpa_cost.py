"""What one call of TPU Ragged Paged Attention reads from HBM and computes, from the kernel's own arithmetic.

`Compiled.cost_analysis()` does not see inside a Pallas kernel (a `tpu_custom_call`): the dry run's figure for a
paged program is the compiler's count outside the kernel plus this count of the kernel (`call_cost`), per layer
and per device. It follows `jax.experimental.pallas.ops.tpu.ragged_paged_attention` (jax 0.10.2) as
`models.paged_attention` calls it (`_ragged_paged`):

  blocks   the call's Q query tokens (every row's, concatenated: `cu_q_lens`) in blocks of
           qb = min(RPA_QUERIES_PER_BLOCK, Q); keys in blocks of ppb = max(1, min(n, RPA_KV_POSITIONS_PER_BLOCK /
           page_size)) pages, Bt = ppb x page_size positions (n = pages per row);
  visits   query block j runs every row whose queries overlap it: row r (queries [c_r, c_r + q_r)) is visited
           floor((c_r + q_r - 1) / qb) - floor(c_r / qb) + 1 times (once per decode call, T / qb times for an
           append of T tokens at a block boundary);
  reads    per visit the row's kv_len positions in ceil(kv_len / Bt) blocks, and every block copies all ppb pages
           (`MultiPageAsyncCopyDescriptor`: a page past the row's end is its first page again), each
           page_size x 2K' x hd' x bytes(cache) (K' stored heads of width hd': `KernelShape.of`):
           ceil(kv_len / Bt) x Bt x 2K' x hd' bytes(cache);
           per query block its q block in and its output block out, 2 x qb x H x hd' x bytes(q); the scalar
           prefetch (kv_lens, page table, cu_q_lens, 3 words) once, 4 bytes each;
  FLOPs    per visited key block and KV head, q (qb x G query rows, the whole query block) . k^T and the
           scores . v over Bt positions: 4 qb H Bt hd' (masked rows and positions are computed all the same).

Shapes per device (heads split over `tensor` the way the pool is). Totals do not depend on how the kernel splits
heads into blocks (each head block reads its heads' slice of every page once).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from agent_r1_jax.models.paged_attention import (HEAD_MULTIPLE, RPA_KV_POSITIONS_PER_BLOCK,
                                                 RPA_QUERIES_PER_BLOCK)
from agent_r1_jax.models.paged_kv_cache import stored_heads


@dataclasses.dataclass(frozen=True)
class Cost:
  """HBM bytes one kernel call reads and writes, its FLOPs, and the pages its DMAs copy."""
  bytes: float = 0.0
  flops: float = 0.0
  pages: float = 0.0

  def __add__(self, other: Cost) -> Cost:
    return Cost(self.bytes + other.bytes, self.flops + other.flops, self.pages + other.pages)

  def __mul__(self, k: float) -> Cost:
    return Cost(self.bytes * k, self.flops * k, self.pages * k)


@dataclasses.dataclass(frozen=True)
class KernelShape:
  """One device's call, one layer: H query heads and K' stored KV heads of the pages' width hd' (the model's K heads
  of width hd packed or padded into the kernel's 128 lanes, `of`), pages of `page_size` positions, n =
  `pages_per_row` per row's table."""
  heads: int
  kv_heads: int
  head_width: int
  page_size: int
  pages_per_row: int
  kv_itemsize: int
  q_itemsize: int

  @classmethod
  def of(cls, *, heads: int, kv_heads: int, head_dim: int, tensor: int, page_size: int, pages_per_row: int,
         kv_itemsize: int, q_itemsize: int) -> KernelShape:
    """The per-device shape of a model's call: heads split over `tensor` when whole KV heads divide (as
    `models.paged_kv_cache.pool_axes` splits the pool), the stored KV heads and their width as the pages hold them
    (`models.paged_kv_cache.stored_heads` in rows of `HEAD_MULTIPLE['ragged_paged']` lanes: Qwen2.5-0.5B's two
    64-wide heads packed into one 128-wide stored head, widths that do not pack zero-padded); every query head is
    passed at the stored width."""
    split = tensor if kv_heads % tensor == 0 else 1
    stored, width = stored_heads(kv_heads // split, head_dim, HEAD_MULTIPLE["ragged_paged"])
    return cls(heads=heads // split, kv_heads=stored, head_width=width, page_size=page_size,
               pages_per_row=pages_per_row, kv_itemsize=kv_itemsize, q_itemsize=q_itemsize)

  @property
  def pages_per_block(self) -> int:
    """ppb, as `models.paged_attention._ragged_paged` passes `num_kv_pages_per_block`."""
    return max(1, min(self.pages_per_row, RPA_KV_POSITIONS_PER_BLOCK // self.page_size))

  @property
  def block_positions(self) -> int:
    return self.pages_per_block * self.page_size

  @property
  def page_bytes(self) -> int:
    """One page of one layer: page_size x 2K' x hd' x bytes(cache)."""
    return self.page_size * 2 * self.kv_heads * self.head_width * self.kv_itemsize

  def queries_per_block(self, queries: int) -> int:
    """qb, as `models.paged_attention._ragged_paged` passes `num_queries_per_block`."""
    return min(RPA_QUERIES_PER_BLOCK, queries)


def call_cost(shape: KernelShape, q_lens, kv_lens) -> Cost:
  """The module docstring's count for one call over rows with `q_lens` queries and `kv_lens` positions each
  (int arrays `[b]`, every entry >= 1: the slot programs give each row T >= 1 queries and kv_len = length + T)."""
  q_lens, kv_lens = np.asarray(q_lens, np.int64), np.asarray(kv_lens, np.int64)
  if q_lens.shape != kv_lens.shape or q_lens.ndim != 1 or (q_lens < 1).any() or (kv_lens < 1).any():
    raise ValueError(f"q_lens and kv_lens must be [b] arrays of positive counts, got {q_lens!r} and {kv_lens!r}")
  if (kv_lens > shape.pages_per_row * shape.page_size).any():
    raise ValueError(f"a kv_len exceeds a row's {shape.pages_per_row} pages of {shape.page_size}")
  rows, queries = len(q_lens), int(q_lens.sum())
  qb = shape.queries_per_block(queries)
  starts = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
  visits = (starts + q_lens - 1) // qb - starts // qb + 1
  blocks = -(-kv_lens // shape.block_positions)
  pages = float((visits * blocks).sum() * shape.pages_per_block)
  query_blocks = -(-queries // qb)
  q_out = 2 * query_blocks * qb * shape.heads * shape.head_width * shape.q_itemsize
  prefetch = 4 * (rows + rows * shape.pages_per_row + rows + 1 + 3)
  flops = float((visits * blocks).sum()) * 4 * qb * shape.heads * shape.block_positions * shape.head_width
  return Cost(bytes=pages * shape.page_bytes + q_out + prefetch, flops=flops, pages=pages)


def attended_bytes(kv_lens, *, kv_heads: int, head_width: int, kv_itemsize: int) -> float:
  """Bytes of the keys and values the rows attend over, one layer: sum(kv_len) x 2 x kv_heads x head_width x
  bytes(cache) (the must-read: the model's K x hd, or the pages' stored K' x hd')."""
  return float(np.asarray(kv_lens, np.int64).sum()) * 2 * kv_heads * head_width * kv_itemsize


__all__ = ["Cost", "KernelShape", "attended_bytes", "call_cost"]
