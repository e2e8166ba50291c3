"""Loss aggregation as (sum, denominator) pairs, so micro-batches add up to the full batch exactly.

A per-token loss `L [B, T]` with mask `m [B, T]` (n_i = sum_t m_it tokens in row i, and "rows" below
means rows with n_i > 0; rows with no masked token, e.g. batch padding, take no part) is reduced by
one of four modes:

    mode                       total                        denominator      full-batch loss
    token-mean                 sum_it L m                   sum_i n_i        token mean
    seq-mean-token-mean        sum_i (sum_t L m) / n_i      #rows            mean over rows of row means
    seq-mean-token-sum         sum_it L m                   #rows            mean over rows of row sums
    seq-mean-token-sum-norm    sum_it L m                   #rows * H        row sums / H, mean over rows
                                                                             (Dr. GRPO; H = horizon,
                                                                              default T)

Every total and denominator is a sum over rows, so for micro-batches k of one batch

    full-batch loss = (sum_k total_k) / (sum_k denominator_k)

exactly: add the `Aggregate`s (`accumulate`) and divide once (`Aggregate.value`, `finalize`).

Gradients with micro-batching: the denominator depends only on masks, known before the update, so
compute `D = loss_denominator(full_batch_mask, mode)` first and differentiate `total_k / D` on each
micro-batch; the micro-batch gradients then sum to the full-batch gradient.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from agent_r1_jax.rl import masked

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                   "seq-mean-token-sum-norm")


class Aggregate(NamedTuple):
  """A scalar sum and the count it is to be divided by (both float32 scalars)."""
  total: jax.Array
  denominator: jax.Array

  def value(self) -> jax.Array:
    """`total / denominator`, 0 when the denominator is 0 (nothing was masked in)."""
    return jnp.where(self.denominator > 0, self.total / jnp.where(self.denominator > 0, self.denominator, 1.0),
                     0.0)


def _is_aggregate(x: Any) -> bool:
  return isinstance(x, Aggregate)


def accumulate(a: Any, b: Any) -> Any:
  """Adds two pytrees of `Aggregate`s (e.g. two micro-batches' loss outputs) leaf by leaf."""
  return jax.tree.map(jnp.add, a, b)


def finalize(tree: Any) -> Any:
  """Replaces every `Aggregate` in a pytree by its value `total / denominator`."""
  return jax.tree.map(lambda agg: agg.value(), tree, is_leaf=_is_aggregate)


def check_mode(mode: str) -> None:
  if mode not in LOSS_AGG_MODES:
    raise ValueError(f"unknown loss_agg_mode {mode!r}; use one of {LOSS_AGG_MODES}")


def loss_denominator(mask: jax.Array, mode: str, horizon: int | None = None) -> jax.Array:
  """The denominator of `aggregate(., mask, mode, horizon)` alone (float32 scalar); see module doc."""
  check_mode(mode)
  m = masked.as_float_mask(mask)
  if mode == "token-mean":
    return jnp.sum(m)
  rows = jnp.sum((jnp.sum(m, axis=-1) > 0).astype(jnp.float32))
  if mode == "seq-mean-token-sum-norm":
    return rows * float(m.shape[-1] if horizon is None else horizon)
  return rows


def aggregate(loss: jax.Array, mask: jax.Array, mode: str, horizon: int | None = None) -> Aggregate:
  """Reduces a per-token loss `[B, T]` over the mask to an `Aggregate` (see the module table).

  Entries of `loss` off the mask are never read (even NaN/inf there cannot reach the result or its
  gradient).

  Args:
    loss: float `[B, T]` per-token loss.
    mask: 0/1 `[B, T]`.
    mode: one of `LOSS_AGG_MODES`.
    horizon: H of `seq-mean-token-sum-norm` (default: T, the padded response length). Fix it in the
      config when T varies between batches (length buckets) so the loss scale does not.

  Returns:
    `Aggregate(total, denominator)`.
  """
  check_mode(mode)
  m = masked.as_float_mask(mask)
  row_sums = masked.masked_sum(loss, m, axis=-1)
  if mode == "seq-mean-token-mean":
    total = jnp.sum(row_sums / jnp.maximum(jnp.sum(m, axis=-1), 1.0))
  else:
    total = jnp.sum(row_sums)
  return Aggregate(total=total, denominator=loss_denominator(m, mode, horizon))


def token_mean(x: jax.Array, mask: jax.Array) -> Aggregate:
  """`Aggregate` of a per-token metric averaged over masked tokens."""
  return aggregate(x, mask, "token-mean")
