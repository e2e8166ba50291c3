"""Preallocated key/value cache shared by prefill, incremental prefill and decode.

Layout: one array per layer in `k` (`[batch, kv_heads, head_dim, max_length]`) and `v`
(`[batch, kv_heads, max_length, head_dim]`). Slots are filled left
to right per row; `cursor[b]` is the next free slot of row b and every slot at or beyond it is invalid, so
rows can be at different lengths (multi-turn continuation appends a different number of tokens per row).
`valid[b, s]` marks slots holding a real token (left padding of a prompt occupies slots that stay
invalid). `lengths[b]` counts the real tokens, which is also the RoPE position of the next token.
Attention from a query in slot q may use key slot s iff `valid[b, s] and s <= q`: slots are written in
token order, so this is exactly causal attention over the row's real tokens.

Why one array per layer, in these layouts: inside the decode loop each layer's array is its own loop
carry, so writing one token is an in-place scatter of B * K * hd values, and the layouts are the plain
batched-matmul operands of attention (batch dims (B, K) leading): scores = q @ k, out = weights @ v. A
stacked `[L, B, S, K, hd]` array made XLA:CPU copy and transpose every layer's whole slice on every
decode step, and slot-major keys made q @ k^T pack the whole key cache per step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from agent_r1_jax.models.config import Qwen2Config
from agent_r1_jax.models.sharding import constrain

KEY_AXES = ("batch", "act_kv_heads", "head_dim", "cache_length")
VALUE_AXES = ("batch", "act_kv_heads", "cache_length", "head_dim")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Per-layer keys/values plus per-row bookkeeping (a pytree; donate it to jitted updates).

  Attributes:
    k: L arrays `[B, K, hd, S]`, keys (after RoPE), cache dtype.
    v: L arrays `[B, K, S, hd]`, values, cache dtype.
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
    k_shape = (batch, config.num_key_value_heads, config.head_dim, max_length)
    v_shape = (batch, config.num_key_value_heads, max_length, config.head_dim)
    layers = range(config.num_hidden_layers)
    return cls(k=tuple(jnp.zeros(k_shape, dtype) for _ in layers),
               v=tuple(jnp.zeros(v_shape, dtype) for _ in layers),
               valid=jnp.zeros((batch, max_length), bool),
               lengths=jnp.zeros((batch,), jnp.int32), cursor=jnp.zeros((batch,), jnp.int32))

  def padded(self, max_length: int) -> KVCache:
    """This cache with empty (invalid) slots appended up to `max_length` slots per row."""
    extra = max_length - self.max_length
    k = tuple(constrain(jnp.pad(a, ((0, 0), (0, 0), (0, 0), (0, extra))), KEY_AXES) for a in self.k)
    v = tuple(constrain(jnp.pad(a, ((0, 0), (0, 0), (0, extra), (0, 0))), VALUE_AXES) for a in self.v)
    valid = jnp.pad(self.valid, ((0, 0), (0, extra)))
    return dataclasses.replace(self, k=k, v=v, valid=valid)

  @property
  def max_length(self) -> int:
    return self.valid.shape[1]

  @property
  def batch_size(self) -> int:
    return self.valid.shape[0]
