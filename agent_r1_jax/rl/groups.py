"""Per-group statistics of per-row scores with segment reductions (static shapes under jit).

Rows that share a group id are the responses sampled for the same prompt. Group ids are arbitrary
non-negative integers, neither contiguous nor sorted; they are relabelled inside the jitted program to
dense indices in `[0, B)` with `jnp.unique(..., size=B)`, so a batch of B rows always has at most B
segments and the program compiles once per batch size.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class GroupStats(NamedTuple):
  """Statistics of each row's group, broadcast back to rows (all `[B]`)."""
  size: jax.Array   # n, float32
  mean: jax.Array   # (1/n) sum_j s_j
  std: jax.Array    # sqrt(sum_j (s_j - mean)^2 / (n - 1)); 0 when n == 1


def dense_group_index(group_ids: jax.Array) -> jax.Array:
  """Relabels arbitrary integer ids `[B]` to dense int32 indices in `[0, B)` (equal ids, equal index)."""
  group_ids = jnp.asarray(group_ids)
  batch = group_ids.shape[0]
  _, inverse = jnp.unique(group_ids, size=batch, return_inverse=True)
  return inverse.reshape(batch).astype(jnp.int32)


def group_stats(scores: jax.Array, group_ids: jax.Array) -> GroupStats:
  """Size, mean and unbiased standard deviation of the scores in each row's group.

  Args:
    scores: float `[B]`.
    group_ids: int `[B]`.

  Returns:
    `GroupStats`, each field `[B]` float32 and read at the row's own group.
  """
  scores = jnp.asarray(scores, jnp.float32)
  batch = scores.shape[0]
  index = dense_group_index(group_ids)

  def per_row(x):
    return jax.ops.segment_sum(x, index, num_segments=batch)[index]

  size = per_row(jnp.ones_like(scores))
  mean = per_row(scores) / size
  sum_sq = per_row(jnp.square(scores - mean))
  std = jnp.sqrt(sum_sq / jnp.maximum(size - 1.0, 1.0))
  return GroupStats(size=size, mean=mean, std=std)
