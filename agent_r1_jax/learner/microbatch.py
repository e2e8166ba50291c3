"""Micro-batching: a batch walked `m` rows at a time, for a forward pass or for a summed gradient.

Every learner pass (old and reference log-probs, values, the actor and critic updates) goes through here, so
one micro-batch's activations exist at a time and memory does not grow with the batch.

Shapes: a batch is a dict of arrays sharing a leading row axis `[M, ...]`; `n = num_micro` divides `M` and
`m = M / n` rows make one micro-batch.

    split_micro           [M, ...]     -> [n, m, ...]   micro-batch k = rows k, k + n, k + 2n, ...
    merge_micro           [n, m, ...]  -> [M, ...]      its inverse: rows back in their order
    map_micro             fn(params, [m, ...]) -> [m, ...] on each micro-batch, outputs `[M, ...]`
    accumulate_gradients  summed gradients (the params' tree), finalised metrics (scalars), per-token `[M, ...]`

The split is strided, not contiguous: with the rows sharded in contiguous blocks over `d` batch devices,
micro-batch k holds `m / d` rows of every device, so every device works on every micro-batch and no rows
move between devices (a contiguous split would put micro-batch k on one device).

Gradient accumulation. A mini-batch's loss is `L = (T_1 + ... + T_n) / D`, where `T_k` is micro-batch k's
summed term (`rl.aggregate`'s total) and `D` the denominator of the whole mini-batch (`rl.loss_denominator`:
its token count, row count or rows x horizon, by `loss_agg_mode`). Each micro-batch's loss function returns
`T_k / D`, so

    grad L = grad(T_1 / D) + ... + grad(T_n / D)

is the full mini-batch's gradient whatever `n` is. Metrics are `rl.Aggregate` (total, denominator) pairs,
summed over the micro-batches and divided once at the end (`rl.finalize`), so they too are the mini-batch's.

Both loops are one `lax.scan` whose body is compiled once. The parameters enter each iteration through
`in_loop`, so FSDP-sharded weights are all-gathered inside the loop (layer by layer), never all at once.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from agent_r1_jax import rl

Batch = dict[str, jax.Array]


def split_micro(batch: Batch, num_micro: int) -> Batch:
  """`[M, ...]` -> `[num_micro, M / num_micro, ...]`, micro-batch k holding rows k, k + num_micro, ...

  Strided rather than contiguous: `x.reshape(m, num_micro, ...)` keeps the row axis's contiguous device
  blocks on the new `m` axis, so each micro-batch is spread over all batch devices (a contiguous split
  would put micro-batch k on one device and make XLA move rows).
  """
  def split(x):
    if x.shape[0] % num_micro:
      raise ValueError(f"a batch of {x.shape[0]} rows does not split into {num_micro} micro-batches")
    return x.reshape((x.shape[0] // num_micro, num_micro) + x.shape[1:]).swapaxes(0, 1)
  return jax.tree.map(split, batch)


def merge_micro(x: jax.Array) -> jax.Array:
  """Inverse of `split_micro` for one array: `[num_micro, m, ...]` -> `[num_micro * m, ...]` in row order."""
  return x.swapaxes(0, 1).reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def map_micro(fn: Callable[[Any, Batch], Any], params: Any, batch: Batch, num_micro: int) -> Any:
  """`fn(params, micro_batch)` on each micro-batch in turn, outputs `[m, ...]` put back in row order.

  The parameters enter each iteration through `in_loop` (see there), so FSDP-sharded weights are gathered
  inside the loop, layer by layer, and never all at once.
  """
  def body(step, mb):
    p, step = in_loop(params, step)
    return step + 1, fn(p, mb)

  _, out = jax.lax.scan(body, jnp.zeros((), jnp.int32), split_micro(batch, num_micro))
  return jax.tree.map(merge_micro, out)


def in_loop(params: Any, carry: Any) -> tuple[Any, Any]:
  """`(params, carry)` unchanged, but tied to a loop-carried value by an `optimization_barrier`.

  Loop-invariant code motion would otherwise hoist everything that depends only on the parameters out of
  a micro-batch loop, including the all-gather of every FSDP-sharded weight: each device would then hold
  the whole unsharded model (and its compute-dtype copy) for the length of the loop.
  """
  return jax.lax.optimization_barrier((params, carry))


def accumulate_gradients(loss_fn: Callable, params: nnx.State, batch: Batch, denominator: jax.Array,
                         num_micro: int) -> tuple[nnx.State, dict[str, jax.Array], dict[str, jax.Array]]:
  """Sum over micro-batches of `grad(loss_fn)` and of its `Aggregate` metrics (finalised).

  `loss_fn(params, micro_batch, denominator) -> (total_k / D, (metrics, per_token))`; because `D` is the
  whole mini-batch's denominator, the sum of the micro-batch gradients is the mini-batch gradient. One
  `lax.scan` body holds the forward and backward pass, so it is compiled once whatever `num_micro` is.

  `per_token` is a dict (possibly empty) of `[m, ...]` arrays of the micro-batch's rows; they come back as
  `[M, ...]` in row order. Returns `(grads, finalised metrics, per_token)`.
  """
  micro = split_micro(batch, num_micro)
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  one = jax.tree.map(lambda x: x[0], micro)
  _, (metric_shapes, _) = jax.eval_shape(loss_fn, params, one, denominator)
  zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), tree)

  def body(carry, mb):
    p, (grads, metrics) = in_loop(params, carry)
    (_, (m, rows)), g = grad_fn(p, mb, denominator)
    return (jax.tree.map(jnp.add, grads, g), rl.accumulate(metrics, m)), rows

  (grads, metrics), rows = jax.lax.scan(body, (zeros(params), zeros(metric_shapes)), micro)
  return grads, rl.finalize(metrics), jax.tree.map(merge_micro, rows)
