"""Blocked attention (online softmax over key blocks, query blocks rematerialised) and attention over the KV
cache's packed layout against a float64 NumPy softmax, with padding and ragged visibility; the blocked
gradients against the dense path's; and the model's logits, prefill and extend unchanged by the block size."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.models import KVCache, Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.models.attention import attend, attend_packed


def _reference(q, keys, values, query_slots, key_valid):
  """Plain loops: each query's softmax over the key slots it sees (uniform over all when it sees none)."""
  b, k, g, t, d = q.shape
  s = keys.shape[2]
  out = np.zeros(q.shape)
  for bi in range(b):
    for ti in range(t):
      seen = [si for si in range(s) if key_valid[bi, si] and si <= query_slots[bi, ti]]
      for ki in range(k):
        for gi in range(g):
          if not seen:
            out[bi, ki, gi, ti] = values[bi, ki].mean(0)
            continue
          scores = np.array([q[bi, ki, gi, ti] @ keys[bi, ki, si] for si in seen]) / np.sqrt(d)
          w = np.exp(scores - scores.max())
          out[bi, ki, gi, ti] = (w / w.sum()) @ values[bi, ki, seen]
  return out


def _case(seed, t, s):
  rng = np.random.default_rng(seed)
  b, k, g, d = 2, 2, 2, 8
  q = rng.normal(size=(b, k, g, t, d)).astype(np.float32)
  keys = rng.normal(size=(b, k, s, d)).astype(np.float32)
  values = rng.normal(size=(b, k, s, d)).astype(np.float32)
  key_valid = rng.random((b, s)) < 0.8
  query_slots = np.sort(rng.integers(-1, s, (b, t)), axis=1).astype(np.int32)  # -1: sees nothing
  return q, keys, values, query_slots, key_valid


def _assert_close_where_seen(got, expected, slots, valid):
  """A query that sees no key averages every slot: the blocked path averages its padded slots too, so only
  queries that see a key are compared."""
  t, s = slots.shape[1], valid.shape[1]
  sees = np.array([[(valid[b] & (np.arange(s) <= slots[b, i])).any() for i in range(t)] for b in range(2)])
  where = np.broadcast_to(sees[:, None, None, :, None], got.shape)
  np.testing.assert_allclose(got[where], expected[where], atol=2e-5)


@pytest.mark.parametrize("t,s,chunk", [(1, 37, 8), (13, 37, 8), (24, 24, 8), (40, 19, 16), (5, 5, 0)])
def test_blocked_attention_equals_the_plain_softmax(t, s, chunk):
  q, keys, values, slots, valid = _case(t * 100 + s, t, s)
  expected = _reference(q.astype(np.float64), keys.astype(np.float64), values.astype(np.float64), slots, valid)
  got = np.asarray(jax.jit(lambda *a: attend(*a, chunk=chunk))(q, keys, values, slots, valid))
  _assert_close_where_seen(got, expected, slots, valid)


@pytest.mark.parametrize("t,s", [(1, 37), (3, 16)])
def test_packed_cache_attention_equals_the_plain_softmax(t, s):
  """The cache layout `[B, S, K * d]` (head j in lanes [j d, (j + 1) d)): a query reading another head's
  lanes, or the wrong diagonal block of the output, would mix the two KV heads' values."""
  q, keys, values, slots, valid = _case(t * 100 + s + 1, t, s)
  expected = _reference(q.astype(np.float64), keys.astype(np.float64), values.astype(np.float64), slots, valid)
  b, k, _, d = keys.shape
  pack = lambda a: a.transpose(0, 2, 1, 3).reshape(b, s, k * d)  # [B, K, S, d] -> [B, S, K * d]
  got = np.asarray(jax.jit(attend_packed)(q, pack(keys), pack(values), slots, valid))
  _assert_close_where_seen(got, expected, slots, valid)


def test_blocked_attention_gradients_equal_the_dense_ones():
  q, keys, values, slots, valid = _case(7, 30, 30)
  slots = np.broadcast_to(np.arange(30, dtype=np.int32), (2, 30)).copy()  # causal: every query sees a key
  valid[:, 0] = True
  cot = np.random.default_rng(8).normal(size=q.shape).astype(np.float32)

  def loss(chunk):
    def f(q, k, v):
      return jnp.sum(attend(q, k, v, slots, valid, chunk=chunk) * cot)
    return jax.grad(f, argnums=(0, 1, 2))(q, keys, values)

  for dense, blocked in zip(loss(0), loss(8)):
    np.testing.assert_allclose(np.asarray(blocked), np.asarray(dense), atol=2e-5)


def _model(chunk):
  config = Qwen2Config.tiny(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2)
  return Qwen2ForCausalLM(config, rngs=nnx.Rngs(0), attention_chunk_size=chunk)


def test_model_logits_prefill_and_extend_do_not_depend_on_the_block_size():
  rng = np.random.default_rng(1)
  ids = jnp.asarray(rng.integers(0, 64, (3, 40)), jnp.int32)
  mask = np.ones((3, 40), np.int32)
  mask[0, :11] = 0  # left padding
  mask = jnp.asarray(mask)
  dense, blocked = _model(0), _model(8)
  np.testing.assert_allclose(np.asarray(blocked(ids, mask)), np.asarray(dense(ids, mask)), atol=1e-5)

  def prefill_then_extend(model):
    cache = KVCache.init(model.config, 3, 64)
    hidden_p, cache = model.model(ids[:, :24], mask[:, :24], cache=cache)
    hidden_e, _ = model.model(ids[:, 24:], mask[:, 24:], cache=cache)
    return np.asarray(hidden_p), np.asarray(hidden_e)

  for got, want in zip(prefill_then_extend(blocked), prefill_then_extend(dense)):
    np.testing.assert_allclose(got, want, atol=1e-5)
