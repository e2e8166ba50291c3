"""The slot engine's jitted programs over N decode slots (`sampling.slots.SlotDecoder` places and calls them;
the shapes N, S, V, K, Tb, C are its docstring's).

Programs (each also takes `rows`: None for a call over every slot, or int32 `[D, m]` to compute only those
rows of each batch device, gathered and scattered back by `row_gather`; the per-row inputs and outputs are then
those D m rows'):
  extend  `reset` bool `[N]`, ids/mask `[N, Tb]` right-padded: rows with `reset` are emptied first (valid all
          False, lengths 0, cursor 0: the keys/values left in the row are never read again, every slot past the
          cursor being invalid), then every row's new tokens are appended at its cursor (an incremental prefill;
          a row with nothing to append keeps its cache contents and logits). Prefill of a queued episode and the
          append of an observation are the same call, so one batched extend serves both.
  decode  up to C steps over every row: sample, record, feed the token back. A row with `budgets[b] = 0` is
          inactive (untouched). `fresh[b]` starts a turn: the row's stop window is emptied first; otherwise the
          window carries over from the previous chunk, so a stop sequence split across chunks still ends the turn,
          and the host passes the turn's remaining budget. A row stops within the chunk when its window completes
          a stop sequence (STOP_TOKEN) or it spends its budget (LENGTH); NONE means the chunk ended first.

Randomness is keyed by episode and position, not by slot or call: the token at context position t (= the real
tokens before it = the cache row's `lengths` when it is sampled) of episode e draws its Gumbel noise from
`fold_in(fold_in(rng, e), t)`, so an episode samples the same tokens whichever slot it runs in, whichever other
episodes share the batch, and however its turns are cut into chunks.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from agent_r1_jax.models.kv_cache import KVCache, constrain_kv
from agent_r1_jax.models.paged_attention import HEAD_MULTIPLE
from agent_r1_jax.models.paged_kv_cache import PagedKVCache, init_pools
from agent_r1_jax.models.qwen2 import merge_for_compute
from agent_r1_jax.models.sharding import SAMPLING_RULES, constrain
from agent_r1_jax.sampling import stop_sequences as stops_lib
from agent_r1_jax.sampling.programs import _extend, feed_back, segment_end
from agent_r1_jax.sampling.row_gather import put_cache_rows, put_rows, take_cache_rows, take_rows
from agent_r1_jax.sampling.sample import sample_tokens_per_row


def init_state(*, rows, max_length, layers, kv_width, vocab, window, cache_dtype, kv_heads):
  """Every slot empty: (cache with no valid slot, lengths and cursors 0; logits `[N, V]` 0; windows `[N, K]` -1)."""
  shape = (rows, max_length, kv_width)
  cache = KVCache(k=tuple(constrain_kv(jnp.zeros(shape, cache_dtype), kv_heads) for _ in range(layers)),
                  v=tuple(constrain_kv(jnp.zeros(shape, cache_dtype), kv_heads) for _ in range(layers)),
                  valid=constrain(jnp.zeros((rows, max_length), bool), ("batch", None)),
                  lengths=constrain(jnp.zeros((rows,), jnp.int32), ("batch",)),
                  cursor=constrain(jnp.zeros((rows,), jnp.int32), ("batch",)))
  logits = constrain(jnp.zeros((rows, vocab), jnp.float32), ("batch", None))
  return cache, logits, constrain(jnp.full((rows, window), stops_lib.ABSENT, jnp.int32), ("batch", None))


def init_paged_state(*, config, rows, pages, pages_per_row, page_size, layout, backend, window, cache_dtype):
  """Every slot empty, over a paged cache of `pages` pages (all devices'): (cache with zeroed pools, null page
  tables and lengths 0; logits `[N, V]` 0; windows `[N, K]` -1)."""
  lanes = HEAD_MULTIPLE.get(backend, 1)
  cache = PagedKVCache(pools=init_pools(config, pages, page_size, layout, cache_dtype, lanes),
                       page_table=constrain(jnp.zeros((rows, pages_per_row), jnp.int32), ("batch", None)),
                       lengths=constrain(jnp.zeros((rows,), jnp.int32), ("batch",)), layout=layout, backend=backend)
  logits = constrain(jnp.zeros((rows, config.vocab_size), jnp.float32), ("batch", None))
  return cache, logits, constrain(jnp.full((rows, window), stops_lib.ABSENT, jnp.int32), ("batch", None))


def _extend_rows(graphdef, params, cache, last_logits, reset, ids, mask):
  keep = ~reset
  if isinstance(cache, PagedKVCache):  # a row's pages are the host's to hand out; emptying it is its length
    cache = dataclasses.replace(cache, lengths=jnp.where(keep, cache.lengths, 0))
    return _extend(graphdef, params, cache, last_logits, ids, mask)
  cache = dataclasses.replace(cache, valid=cache.valid & keep[:, None], lengths=jnp.where(keep, cache.lengths, 0),
                              cursor=jnp.where(keep, cache.cursor, 0))
  return _extend(graphdef, params, cache, last_logits, ids, mask)


def _decode_rows(graphdef, params, cache, last_logits, window, budgets, fresh, episodes, stops, rng, *, sampling,
                 chunk, pad_id):
  model = merge_for_compute(graphdef, params, rules=SAMPLING_RULES)  # a no-op on prepared weights
  head = model.head_kernel()
  n = budgets.shape[0]
  window = jnp.where(fresh[:, None], stops_lib.ABSENT, window)
  episode_keys = None if sampling.is_greedy else jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, episodes)
  max_steps = jnp.minimum(jnp.max(budgets), chunk)

  def cond(carry):
    step, done = carry[0], carry[7]
    return (step < max_steps) & ~jnp.all(done)

  def body(carry):
    step, cache, logits, window, tokens, logprobs, count, done, reason = carry
    # Greedy draws no noise, so it needs no keys.
    keys = None if episode_keys is None else jax.vmap(jax.random.fold_in)(episode_keys, cache.lengths)
    token, logprob = sample_tokens_per_row(logits, keys, sampling)
    active = ~done
    token = jnp.where(active, token, pad_id)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, step))
    logprobs = jax.lax.dynamic_update_slice(logprobs, jnp.where(active, logprob, 0.0)[:, None], (0, step))
    count = count + active.astype(jnp.int32)
    window = jnp.where(active[:, None], stops_lib.push(window, token), window)
    stopped, exhausted, reason = segment_end(window, stops, active, count, budgets, reason)
    cache, logits = feed_back(model, head, cache, logits, token, active)
    return step + 1, cache, logits, window, tokens, logprobs, count, done | stopped | exhausted, reason

  init = (jnp.int32(0), cache, last_logits, window, jnp.full((n, chunk), pad_id, jnp.int32),
          jnp.zeros((n, chunk), jnp.float32), jnp.zeros((n,), jnp.int32), budgets <= 0, jnp.zeros((n,), jnp.int32))
  _, cache, logits, window, tokens, logprobs, count, _, reason = jax.lax.while_loop(cond, body, init)
  return cache, logits, window, tokens, logprobs, count, reason, cache.lengths


def _slot_extend(graphdef, params, cache, last_logits, reset, ids, mask, rows, *, kv_heads):
  """`_extend_rows` over every slot (`rows` None), or over the rows `rows` (int32 `[D, m]`, local to each batch
  device) gathered from the slots and scattered back; `reset`, `ids` and `mask` are then those rows' `[D m, ...]`."""
  if rows is None:
    return _extend_rows(graphdef, params, cache, last_logits, reset, ids, mask)
  part, part_logits = _extend_rows(graphdef, params, take_cache_rows(cache, rows, kv_heads),
                                   take_rows(last_logits, rows, ("batch", None)), reset, ids, mask)
  return put_cache_rows(cache, rows, part, kv_heads), put_rows(last_logits, rows, part_logits, ("batch", None))


def _decode_chunk(graphdef, params, cache, last_logits, window, budgets, fresh, episodes, stops, rng, rows, *,
                  sampling, chunk, pad_id, kv_heads):
  """`_decode_rows` over every slot (`rows` None), or over the rows `rows` (int32 `[D, m]`) gathered from the slots
  and scattered back once per chunk; `budgets`, `fresh`, `episodes` and the per-row outputs are then those rows'."""
  run = functools.partial(_decode_rows, graphdef, params, sampling=sampling, chunk=chunk, pad_id=pad_id)
  if rows is None:
    return run(cache, last_logits, window, budgets, fresh, episodes, stops, rng)
  part, part_logits, part_window, *out = run(
      take_cache_rows(cache, rows, kv_heads), take_rows(last_logits, rows, ("batch", None)),
      take_rows(window, rows, ("batch", None)), budgets, fresh, episodes, stops, rng)
  return (put_cache_rows(cache, rows, part, kv_heads), put_rows(last_logits, rows, part_logits, ("batch", None)),
          put_rows(window, rows, part_window, ("batch", None)), *out)


init_jit = jax.jit(init_state, static_argnames=("rows", "max_length", "layers", "kv_width", "vocab", "window",
                                           "cache_dtype", "kv_heads"))
init_paged_jit = jax.jit(init_paged_state, static_argnames=("config", "rows", "pages", "pages_per_row", "page_size",
                                                          "layout", "backend", "window", "cache_dtype"))
slot_extend_jit = jax.jit(_slot_extend, static_argnums=0, donate_argnums=(2, 3), static_argnames=("kv_heads",))
decode_chunk_jit = jax.jit(_decode_chunk, static_argnums=0, donate_argnums=(2, 3, 4),
                           static_argnames=("sampling", "chunk", "pad_id", "kv_heads"))


def compiled_slot_programs() -> int:
  """Slot programs compiled so far in this process (init + extend + decode chunk caches)."""
  return sum(f._cache_size() for f in (init_jit, init_paged_jit, slot_extend_jit, decode_chunk_jit))  # pylint: disable=protected-access


__all__ = ["compiled_slot_programs", "decode_chunk_jit", "init_jit", "init_paged_jit", "init_paged_state", "init_state",
           "slot_extend_jit"]
