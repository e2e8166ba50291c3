"""Preallocated key/value cache shared by prefill, incremental prefill and decode.

Layout: one array per layer in `k` and in `v`, each `[batch, max_length, kv_heads * head_dim]`: slot-major,
with a slot's heads packed side by side in the minor axis (head j's vector at `[j * hd, (j + 1) * hd)`).
Slots are filled left to right per row; `cursor[b]` is the next free slot of row b and every slot at or
beyond it is invalid, so rows can be at different lengths (multi-turn continuation appends a different
number of tokens per row). `valid[b, s]` marks slots holding a real token (left padding of a prompt occupies
slots that stay invalid). `lengths[b]` counts the real tokens, which is also the RoPE position of the next
token. Attention from a query in slot q may use key slot s iff `valid[b, s] and s <= q`: slots are written in
token order, so this is exactly causal attention over the row's real tokens.

Why this layout (the TPU compiler decides it; `--config.dry_run_topology` shows its figures):

  * Slot-major: writing one token per row is one contiguous row of K * hd values, an in-place scatter
    inside the decode loop, in the layout the loop carries. With the slot as the minor axis (the previous
    `[B, K, hd, S]` keys) the TPU compiler re-laid every layer's cache out around each step's scatter: 48
    copies of a layer's cache per step at Qwen2.5-0.5B, 8.5x the bytes a step must read.
  * Heads packed in the minor axis: a TPU tile is 128 lanes wide, and a head_dim of 64 (Qwen2.5-0.5B) in
    its own minor axis fills half of each tile, doubling the cache's footprint; K * hd (128 at 0.5B, 256
    at 1.5B and 3B) fills whole tiles. Decode reads the packed array directly (`attention.attend_packed`);
    calls with several new tokens unpack it to `[B, K, S, hd]` once per layer per call.

Each layer's array is its own loop carry of the decode loop (a stacked `[L, ...]` array made XLA copy every
layer's slice on every step).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from agent_r1_jax.models.config import Qwen2Config
from agent_r1_jax.models.sharding import constrain


def kv_axes(num_kv_heads: int, tensor: int) -> tuple[str | None, ...]:
  """Logical names of a layer's cache `[B, S, K * hd]` on a mesh whose tensor axis has `tensor` devices: the
  packed axis is split over tensor only in whole heads (K divisible by it), as the k/v projections are."""
  return ("batch", "cache_length", "act_kv_heads" if num_kv_heads % tensor == 0 else None)


def constrain_kv(x: jax.Array, num_kv_heads: int) -> jax.Array:
  """A layer's cache constrained to its `kv_axes` under the ambient mesh (a no-op without one)."""
  mesh = jax.sharding.get_abstract_mesh()
  tensor = 1 if mesh.empty else dict(mesh.shape).get("tensor", 1)
  return constrain(x, kv_axes(num_kv_heads, tensor))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Per-layer keys/values plus per-row bookkeeping (a pytree; donate it to jitted updates).

  Attributes:
    k: L arrays `[B, S, K * hd]`, keys (after RoPE), cache dtype.
    v: L arrays `[B, S, K * hd]`, values, cache dtype.
    valid: bool [B, S], slot holds a real token.
    lengths: int32 [B], real tokens stored per row (= position of the row's next token).
    cursor: int32 [B], next slot to write per row (>= lengths; the difference is left padding).
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  valid: jax.Array
  lengths: jax.Array
  cursor: jax.Array

  @classmethod
  def init(cls, config: Qwen2Config, batch: int, max_length: int,
           dtype: jnp.dtype = jnp.float32) -> KVCache:
    """An empty cache with capacity `max_length` slots per row."""
    shape = (batch, max_length, config.num_key_value_heads * config.head_dim)
    layers = range(config.num_hidden_layers)
    return cls(k=tuple(jnp.zeros(shape, dtype) for _ in layers), v=tuple(jnp.zeros(shape, dtype) for _ in layers),
               valid=jnp.zeros((batch, max_length), bool),
               lengths=jnp.zeros((batch,), jnp.int32), cursor=jnp.zeros((batch,), jnp.int32))

  def padded(self, max_length: int, num_kv_heads: int) -> KVCache:
    """This cache with empty (invalid) slots appended up to `max_length` slots per row."""
    extra = ((0, 0), (0, max_length - self.max_length), (0, 0))
    k = tuple(constrain_kv(jnp.pad(a, extra), num_kv_heads) for a in self.k)
    v = tuple(constrain_kv(jnp.pad(a, extra), num_kv_heads) for a in self.v)
    valid = jnp.pad(self.valid, extra[:2])
    return dataclasses.replace(self, k=k, v=v, valid=valid)

  @property
  def max_length(self) -> int:
    return self.valid.shape[1]

  @property
  def batch_size(self) -> int:
    return self.valid.shape[0]
