"""Qwen2 / Llama building blocks in Flax NNX: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, block.

Parameters are stored in `param_dtype` and cast to `compute_dtype` at use; softmax, RMSNorm statistics
and RoPE tables are float32. Kernel layouts keep heads as their own axis so tensor parallelism can
split them: q `[D, H, hd]`, k/v `[D, K, hd]`, o `[H, hd, D]`, gate/up `[D, F]`, down `[F, D]`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from agent_r1_jax.models.attention import attend, attend_packed, attend_paged
from agent_r1_jax.models.config import Qwen2Config
from agent_r1_jax.models.sharding import constrain


def param(rngs: nnx.Rngs | None, shape: tuple[int, ...], names: tuple[str, ...], dtype,
          init: str = "normal", std: float = 0.02) -> nnx.Param:
  """A parameter with logical axis names in its metadata (sharding is applied later by rules)."""
  if init == "normal":
    value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
  elif init == "ones":
    value = jnp.ones(shape, jnp.float32)
  else:
    value = jnp.zeros(shape, jnp.float32)
  return nnx.Param(value.astype(dtype), out_sharding=names, eager_sharding=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionContext:
  """What every layer needs besides its input, computed once per forward.

  Attributes:
    cos, sin: [B, T, hd] float32 RoPE tables at each token's position.
    query_slots: [B, T] int32 key slot of each new token (its cache slot, or its index without a cache);
      it sees key slot s iff `key_valid[b, s] and s <= query_slots[b, t]` (see `models.attention`).
    key_valid: [B, S] bool, key slot holds a real token (S = cache slots, or T without a cache).
    write_slots: [B, T] int32 cache slots for the new tokens (None without a cache).
    page_table, page_lengths: a paged cache's `[B, n]` page table and `[B]` tokens before this call (None
      otherwise); the new tokens sit at positions `page_lengths[b] + t`.
    paged: (layout, backend) of a paged cache (static; None otherwise), see `models.paged_kv_cache`.
  """

  cos: jax.Array
  sin: jax.Array
  query_slots: jax.Array
  key_valid: jax.Array
  write_slots: jax.Array | None = None
  page_table: jax.Array | None = None
  page_lengths: jax.Array | None = None
  paged: tuple[str, str] | None = dataclasses.field(default=None, metadata=dict(static=True))


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """cos/sin `[B, T, hd]` for the half-split convention: inv_freq_i = theta^(-2i/hd), duplicated."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x * cos + rotate_half(x) * sin with rotate_half([a, b]) = [-b, a]; x `[B, T, N, hd]`."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos = cos[:, :, None, :].astype(x.dtype)
  sin = sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


def write_slots(old: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
  """old `[B, S, ...]` with `new[b, t]` stored at slot `slots[b, t]`; slots beyond S are dropped.

  A scatter touches only the B*T written entries (a select over all S slots was measurably slower per
  decode step on CPU); inside the jitted decode loop XLA performs it in place.
  """
  rows = jnp.arange(old.shape[0])[:, None]
  return old.at[rows, slots].set(new.astype(old.dtype), mode="drop")


class RMSNorm(nnx.Module):
  """y = w * x / sqrt(mean(x^2) + eps), statistics in float32."""

  def __init__(self, dim: int, eps: float, *, param_dtype, compute_dtype):
    self.eps = eps
    self.compute_dtype = compute_dtype
    self.weight = param(None, (dim,), ("norm",), param_dtype, init="ones")

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return normed.astype(self.compute_dtype) * self.weight[...].astype(self.compute_dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with q/k/v biases (only when `config.attention_bias`; a Llama-family
  model has no bias parameters at all), no output bias, optional KV cache.

  With H query heads and K key/value heads, query head h reads key/value head h // (H/K).
  scores = q k^T / sqrt(hd) + mask (float32), weights = softmax over key slots; in blocks of
  `attention_chunk_size` queries and keys when a call is longer (`models.attention.attend`).
  """

  def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype, compute_dtype,
               attention_chunk_size: int = 0):
    d, h, k, hd = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                   config.head_dim)
    self.num_heads, self.num_kv_heads, self.head_dim = h, k, hd
    self.compute_dtype = compute_dtype
    self.attention_chunk_size = attention_chunk_size

    def bias(shape, names):  # no parameter at all (not a zero one) for the Llama family
      return param(rngs, shape, names, param_dtype, init="zeros") if config.attention_bias else None

    self.q_kernel = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), param_dtype)
    self.q_bias = bias((h, hd), ("heads", "head_dim"))
    self.k_kernel = param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), param_dtype)
    self.k_bias = bias((k, hd), ("kv_heads", "head_dim"))
    self.v_kernel = param(rngs, (d, k, hd), ("embed", "kv_heads", "head_dim"), param_dtype)
    self.v_bias = bias((k, hd), ("kv_heads", "head_dim"))
    self.o_kernel = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), param_dtype)

  def _proj(self, x, kernel, bias):
    """x `[B, T, D]` @ kernel `[D, N, hd]` (+ bias `[N, hd]` when there is one) -> `[B, T, N, hd]`."""
    cd = self.compute_dtype
    out = jnp.einsum("btd,dnh->btnh", x, kernel[...].astype(cd))
    return out if bias is None else out + bias[...].astype(cd)

  def __call__(self, x: jax.Array, ctx: AttentionContext,
               cache_kv: tuple[jax.Array, jax.Array] | None = None
               ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
    """x `[B, T, D]` -> `[B, T, D]`; with `cache_kv` (this layer's keys and values, each `[B, S, K * hd]`,
    see `models.kv_cache`) the new keys/values are written at `ctx.write_slots`, attention reads all S
    slots, and the updated pair is returned too; with a paged cache (`ctx.paged`), `cache_kv` is this layer's
    page pool, written and read through `attention.attend_paged`, and the updated pool is returned."""
    b, t, _ = x.shape
    q = apply_rope(self._proj(x, self.q_kernel, self.q_bias), ctx.cos, ctx.sin)
    k = apply_rope(self._proj(x, self.k_kernel, self.k_bias), ctx.cos, ctx.sin)
    v = self._proj(x, self.v_kernel, self.v_bias)
    q = constrain(q, ("batch", "length", "act_heads", "head_dim"))
    q = q.reshape(b, t, self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim)
    o_kernel = self.o_kernel[...].astype(self.compute_dtype)
    # Heads-major operands make q @ keys and weights @ values plain (non-transposed) batched matmuls
    # over (b, k); XLA:CPU ran the token-major or transposed-keys forms several times slower (forward
    # and backward: the [B, K, G, T, S] scores are the largest arrays of a training step). The output
    # projection contracts (head, head_dim) in memory order as one [H*hd, D] matmul, so no per-step
    # transpose of the kernel or the activations.
    q = q.transpose(0, 2, 3, 1, 4)
    if ctx.paged is not None:
      layout, backend = ctx.paged
      out, cache_kv = attend_paged(q, k, v, cache_kv, ctx.page_table, ctx.page_lengths, layout=layout,
                                   backend=backend, chunk=self.attention_chunk_size)
    elif cache_kv is None:
      out = attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), ctx.query_slots, ctx.key_valid,
                   chunk=self.attention_chunk_size)
    else:
      packed = self.num_kv_heads * self.head_dim
      cache_kv = tuple(write_slots(old, new.reshape(b, t, packed), ctx.write_slots)
                       for old, new in zip(cache_kv, (k, v)))
      keys, values = (a.astype(self.compute_dtype) for a in cache_kv)
      if t == 1:  # decode: read the packed cache in place
        out = attend_packed(q, keys, values, ctx.query_slots, ctx.key_valid)
      else:  # several new tokens: their attention outweighs unpacking each layer's cache once per call
        s = keys.shape[1]
        keys, values = (a.reshape(b, s, self.num_kv_heads, self.head_dim).transpose(0, 2, 1, 3)
                        for a in (keys, values))
        out = attend(q, keys, values, ctx.query_slots, ctx.key_valid, chunk=self.attention_chunk_size)
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, t, self.num_heads * self.head_dim)
    return out @ o_kernel.reshape(-1, o_kernel.shape[-1]), cache_kv


class MLP(nnx.Module):
  """SwiGLU: down(silu(x @ gate) * (x @ up))."""

  def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype, compute_dtype):
    d, f = config.hidden_size, config.intermediate_size
    self.compute_dtype = compute_dtype
    self.gate_kernel = param(rngs, (d, f), ("embed", "mlp"), param_dtype)
    self.up_kernel = param(rngs, (d, f), ("embed", "mlp"), param_dtype)
    self.down_kernel = param(rngs, (f, d), ("mlp", "embed"), param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    cd = self.compute_dtype
    gate = x @ self.gate_kernel[...].astype(cd)
    up = x @ self.up_kernel[...].astype(cd)
    hidden = constrain(jax.nn.silu(gate) * up, ("batch", "length", "act_mlp"))
    return hidden @ self.down_kernel[...].astype(cd)


class DecoderBlock(nnx.Module):
  """Pre-norm residual block: x += attn(norm(x)); x += mlp(norm(x))."""

  def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype, compute_dtype,
               attention_chunk_size: int = 0):
    kw = dict(param_dtype=param_dtype, compute_dtype=compute_dtype)
    self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
    self.attn = Attention(config, rngs=rngs, attention_chunk_size=attention_chunk_size, **kw)
    self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
    self.mlp = MLP(config, rngs=rngs, **kw)

  def __call__(self, x: jax.Array, ctx: AttentionContext,
               cache_kv: tuple[jax.Array, jax.Array] | None = None):
    attn_out, cache_kv = self.attn(self.input_norm(x), ctx, cache_kv)
    x = constrain(x + attn_out, ("batch", "length", "act_embed"))
    x = constrain(x + self.mlp(self.post_attn_norm(x)), ("batch", "length", "act_embed"))
    return x, cache_kv
