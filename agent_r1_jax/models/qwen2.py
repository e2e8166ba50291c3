"""Qwen2 / Qwen2.5 decoder-only transformer (Flax NNX): backbone, causal LM head, value head.

The same classes compute the Llama family (e.g. SmolLM2): a config with `attention_bias=False` builds the
model without q/k/v biases (see `models.config`).

One forward serves three uses, chosen by the `cache` argument:
  * full forward (training / scoring): no cache; keys are the call's own tokens;
  * prefill / incremental prefill: new tokens are written into a `KVCache` at each row's cursor;
  * one-token decode: the same as incremental prefill with T = 1.
Positions (RoPE indices) are "number of real tokens before this one in its row":
`cache.lengths + cumsum(mask) - 1`, so left padding, right padding and ragged continuation all give a
token the position it would have in its row's unpadded sequence.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from agent_r1_jax.models.config import Qwen2Config
from agent_r1_jax.models.kv_cache import KVCache, constrain_kv
from agent_r1_jax.models.paged_kv_cache import PagedKVCache, constrain_pool
from agent_r1_jax.models.layers import AttentionContext, DecoderBlock, RMSNorm, param, rope_tables, write_slots
from agent_r1_jax.models.sharding import LogicalRules, constrain, constrain_state, variable_names


def _context(config: Qwen2Config, mask: jax.Array, cache: KVCache | None):
  """RoPE tables, attention visibility and cache bookkeeping for new tokens with 0/1 `mask` `[B, T]`.

  Returns (ctx, new_cache_meta) where new_cache_meta = (valid, lengths, cursor) or None.
  """
  b, t = mask.shape
  mask = mask.astype(jnp.int32)
  before = jnp.cumsum(mask, axis=1) - mask  # real tokens before each token within this call
  if isinstance(cache, PagedKVCache):  # right-padded appends: token t of row b at position lengths[b] + t
    positions = cache.lengths[:, None] + before
    cos, sin = rope_tables(positions, config.head_dim, config.rope_theta)
    ctx = AttentionContext(cos=cos, sin=sin, query_slots=positions, key_valid=mask.astype(bool),
                           page_table=cache.page_table, page_lengths=cache.lengths,
                           paged=(cache.layout, cache.backend))
    return ctx, cache.lengths + mask.sum(axis=1)
  if cache is None:
    positions = before
    slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    key_valid = mask.astype(bool)
    meta = None
  else:
    positions = cache.lengths[:, None] + before
    slots = cache.cursor[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    key_valid = write_slots(cache.valid, mask.astype(bool), slots)
    # The cursor moves past the last real token, so trailing (right) padding leaves its slots free
    # while leading (left) padding of a prompt keeps its slots, as invalid.
    extent = jnp.max(jnp.where(mask > 0, jnp.arange(1, t + 1, dtype=jnp.int32), 0), axis=1)
    meta = (key_valid, cache.lengths + mask.sum(axis=1), cache.cursor + extent)
  cos, sin = rope_tables(positions, config.head_dim, config.rope_theta)
  ctx = AttentionContext(cos=cos, sin=sin, query_slots=slots, key_valid=key_valid,
                         write_slots=None if cache is None else slots)
  return ctx, meta


class Qwen2Model(nnx.Module):
  """Embedding -> L decoder blocks -> final RMSNorm; returns hidden states `[B, T, D]`.

  Runtime options (not architecture): `compute_dtype` of activations, `remat` (each block's activations
  recomputed in the backward pass), `scan_layers` (a call without a cache runs the blocks as one `lax.scan`
  over their stacked weights, see `_scanned`), `attention_chunk_size` (attention of longer calls in blocks of
  this many queries and keys, so no `[B, H, T, S]` scores exist; 0: always dense; see `models.attention`).
  """

  def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype=jnp.float32,
               compute_dtype=jnp.float32, remat: bool = False, scan_layers: bool = False,
               attention_chunk_size: int = 0):
    self.config = config
    self.compute_dtype = compute_dtype
    self.remat = remat
    self.scan_layers = scan_layers
    kw = dict(param_dtype=param_dtype, compute_dtype=compute_dtype)
    self.embed = param(rngs, (config.vocab_size, config.hidden_size), ("vocab", "embed"),
                       param_dtype)
    self.layers = nnx.List([DecoderBlock(config, rngs=rngs, attention_chunk_size=attention_chunk_size, **kw)
                            for _ in range(config.num_hidden_layers)])
    self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
               cache: KVCache | PagedKVCache | None = None) -> tuple[jax.Array, KVCache | PagedKVCache | None]:
    """input_ids int `[B, T]`, attention_mask 0/1 `[B, T]` (default all ones; with a `PagedKVCache`, right-padded:
    each row's real tokens first).

    Returns (hidden `[B, T, D]` in compute dtype, updated cache or None).
    """
    if attention_mask is None:
      attention_mask = jnp.ones(input_ids.shape, jnp.int32)
    ctx, meta = _context(self.config, attention_mask, cache)
    x = jnp.take(self.embed[...], input_ids, axis=0).astype(self.compute_dtype)
    x = constrain(x, ("batch", "length", "act_embed"))
    if cache is None:
      return self.norm(self._blocks(x, ctx)), None
    if isinstance(cache, PagedKVCache):
      pools = []
      for block, pool in zip(self.layers, cache.pools):
        x, pool = block(x, ctx, pool)
        pools.append(tuple(constrain_pool(a, cache.layout, self.config.num_key_value_heads) for a in pool))
      return self.norm(x), dataclasses.replace(cache, pools=tuple(pools), lengths=meta)
    keys, values = [], []
    for i, block in enumerate(self.layers):
      x, (k, v) = block(x, ctx, (cache.k[i], cache.v[i]))
      keys.append(constrain_kv(k, self.config.num_key_value_heads))
      values.append(constrain_kv(v, self.config.num_key_value_heads))
    valid, lengths, cursor = meta
    return self.norm(x), KVCache(k=tuple(keys), v=tuple(values), valid=valid, lengths=lengths, cursor=cursor)

  def _blocks(self, x: jax.Array, ctx: AttentionContext) -> jax.Array:
    """`x` `[B, T, D]` through every block without a cache (training and scoring)."""
    if self.scan_layers:
      return _scanned(self.layers, x, ctx, remat=self.remat, compute_dtype=self.compute_dtype)
    for block in self.layers:
      x = _rematerialised(block, x, ctx) if self.remat else block(x, ctx)[0]
    return x


def _rematerialised(block: DecoderBlock, x: jax.Array, ctx: AttentionContext) -> jax.Array:
  """`block(x, ctx)` whose activations the backward pass recomputes instead of saving (only `x` is kept).

  A pure function of the block's state under `jax.checkpoint` (not `nnx.remat`): the block's parameters may
  be tracers of an enclosing transform (a `lax.map` over micro-batches), which nnx refuses to update inside
  its own transforms.
  """
  graphdef, state = nnx.split(block)
  run = lambda s, h, c: nnx.merge(graphdef, s)(h, c)[0]
  return jax.checkpoint(run)(state, x, ctx)


def _scanned(blocks: nnx.List, x: jax.Array, ctx: AttentionContext, *, remat: bool, compute_dtype) -> jax.Array:
  """`x` through every block as one `lax.scan` over their weights stacked on a leading layer axis.

  The stack is taken in `compute_dtype` (every block casts its weights to it at use, so the math is the same)
  and keeps each weight's own sharding on the other axes. Inside the loop body the all-gather of an
  FSDP-sharded weight then serves one layer: unrolled, XLA:TPU scheduled the gathers of many layers ahead
  of their use and held them all (a 3B forward on v5e:4x8 kept ~0.4 GiB per layer live). With `remat` the
  body is rematerialised, so the backward pass keeps only each layer's input `[L, B, T, D]`.
  """
  graphdef, _ = nnx.split(blocks[0])

  def stacked(*variables):
    names = variable_names(variables[0])
    value = jnp.stack([v.get_value().astype(compute_dtype) if jnp.issubdtype(v.dtype, jnp.floating)
                       else v.get_value() for v in variables])
    return variables[0].replace(constrain(value, ("layers", *names)))

  is_variable = lambda v: isinstance(v, nnx.Variable)
  weights = jax.tree.map(stacked, *[nnx.state(block) for block in blocks], is_leaf=is_variable)

  def body(h, layer_weights):
    return nnx.merge(graphdef, layer_weights)(h, ctx)[0], None

  x, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, x, weights)
  return x


class Qwen2ForCausalLM(nnx.Module):
  """Qwen2 backbone + LM head (tied to the embedding when `config.tie_word_embeddings`).

  `model(input_ids, attention_mask)` -> float32 logits `[B, T, V]`;
  `model(input_ids, attention_mask, cache=cache)` -> (logits, updated cache).
  """

  def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype=jnp.float32,
               compute_dtype=jnp.float32, remat: bool = False, scan_layers: bool = False,
               attention_chunk_size: int = 0):
    self.config = config
    self.compute_dtype = compute_dtype
    self.model = Qwen2Model(config, rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype,
                            remat=remat, scan_layers=scan_layers, attention_chunk_size=attention_chunk_size)
    if not config.tie_word_embeddings:
      self.lm_head = param(rngs, (config.hidden_size, config.vocab_size), ("embed", "vocab"),
                           param_dtype)

  def logits(self, hidden: jax.Array, head: jax.Array | None = None) -> jax.Array:
    """hidden `[..., D]` -> float32 logits `[..., V]` (accumulated in float32).

    Args:
      head: `self.head_kernel()`, when the caller has it (a decode loop computes it once).
    """
    cd = self.compute_dtype
    if head is not None:
      out = jnp.einsum("...d,dv->...v", hidden, head, preferred_element_type=jnp.float32)
    elif self.config.tie_word_embeddings:
      out = jnp.einsum("...d,vd->...v", hidden, self.model.embed[...].astype(cd),
                       preferred_element_type=jnp.float32)
    else:
      out = jnp.einsum("...d,dv->...v", hidden, self.lm_head[...].astype(cd),
                       preferred_element_type=jnp.float32)
    return out.astype(jnp.float32)

  def head_kernel(self) -> jax.Array:
    """The LM head `[D, V]` in compute dtype: the embedding transposed when tied.

    Taken once outside a decode loop, it makes every step's logits a plain matmul; with the tied
    `[V, D]` embedding XLA:CPU re-packed the whole matrix on every step.
    """
    if self.config.tie_word_embeddings:
      return self.model.embed[...].astype(self.compute_dtype).T
    return self.lm_head[...].astype(self.compute_dtype)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
               cache: KVCache | None = None):
    hidden, new_cache = self.model(input_ids, attention_mask, cache=cache)
    logits = constrain(self.logits(hidden), ("batch", "length", "act_vocab"))
    return logits if cache is None else (logits, new_cache)


class Qwen2ValueModel(nnx.Module):
  """PPO critic: Qwen2 backbone -> scalar per token, V(s_t) = h_t . w + b, float32 `[B, T]`.

  The head is freshly initialised (w ~ N(0, value_head_std^2), b = 0); the backbone loads from the same
  HF checkpoint as the policy (`load_hf_checkpoint(path, head="value")`).
  """

  def __init__(self, config: Qwen2Config, *, rngs: nnx.Rngs, param_dtype=jnp.float32,
               compute_dtype=jnp.float32, remat: bool = False, scan_layers: bool = False,
               attention_chunk_size: int = 0,
               value_head_std: float = 0.02):
    self.config = config
    # The head draws the first key of the stream, so a loader can re-create it without a backbone.
    self.value_kernel = value_head_kernel(rngs, config, param_dtype, value_head_std)
    self.value_bias = value_head_bias(param_dtype)
    self.model = Qwen2Model(config, rngs=rngs, param_dtype=param_dtype, compute_dtype=compute_dtype,
                            remat=remat, scan_layers=scan_layers, attention_chunk_size=attention_chunk_size)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None) -> jax.Array:
    hidden, _ = self.model(input_ids, attention_mask)
    values = jnp.einsum("btd,d->bt", hidden.astype(jnp.float32),
                        self.value_kernel[...].astype(jnp.float32))
    return values + self.value_bias[...].astype(jnp.float32)


def value_head_kernel(rngs: nnx.Rngs, config: Qwen2Config, param_dtype,
                      std: float = 0.02) -> nnx.Param:
  """Value-head weight w `[D]` ~ N(0, std^2)."""
  return param(rngs, (config.hidden_size,), ("embed",), param_dtype, std=std)


def value_head_bias(param_dtype) -> nnx.Param:
  """Value-head bias b (scalar), 0."""
  return param(None, (), (), param_dtype, init="zeros")


def merge_for_compute(graphdef: nnx.GraphDef, params: nnx.State, *, rules: LogicalRules | None = None
                      ) -> nnx.Module:
  """`nnx.merge(graphdef, params)` with the backbone's weights (and an untied LM head) cast to the compute
  dtype first, and, with `rules`, every weight then constrained to the sharding those rules give it.

  Every layer casts its weights to the compute dtype at use, so the values are the same; what changes is
  where the cast happens: on each device's shard, before XLA all-gathers FSDP-sharded weights for a matmul,
  so the gathered copies (and the gather's traffic) are compute-dtype, not float32. The value head stays in
  its parameter dtype (it is applied in float32). Sampling passes `SAMPLING_RULES`: the weights are gathered
  once, before its decode loop, instead of inside it on every step.
  """
  model = nnx.merge(graphdef, params)
  dtype = model.model.compute_dtype
  cast = jax.tree.map(lambda x: x, params)
  for key in ("model", "lm_head"):
    if key in cast:
      cast[key] = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, cast[key])
  if rules is not None:
    cast = constrain_state(cast, rules)
  return nnx.merge(graphdef, cast)


def abstract_model(config: Qwen2Config, *, head: str = "lm", param_dtype=jnp.float32,
                   compute_dtype=jnp.float32, remat: bool = False, scan_layers: bool = False,
                   attention_chunk_size: int = 0) -> nnx.Module:
  """The model with `jax.ShapeDtypeStruct` leaves (no memory), for shapes, counts and memory plans."""
  cls = _head_class(head)
  return nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0), param_dtype=param_dtype, compute_dtype=compute_dtype,
                                    remat=remat, scan_layers=scan_layers,
                                    attention_chunk_size=attention_chunk_size))


def count_params(model_or_state) -> int:
  """Total parameter elements of a model, its state, or an abstract (eval_shape) model."""
  state = (model_or_state if isinstance(model_or_state, nnx.State)
           else nnx.state(model_or_state, nnx.Param))
  return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


def _head_class(head: str):
  if head == "lm":
    return Qwen2ForCausalLM
  if head == "value":
    return Qwen2ValueModel
  raise ValueError(f"head must be 'lm' (policy) or 'value' (critic), got {head!r}")
