"""The sampler's three jitted programs, shared by every `Sampler` (the model is `(graphdef static, params)`).

  sampling_weights  the parameters cast and gathered once per rollout (every program reads them);
  prefill  `[Bb, Pb]` left-padded prompts -> fresh cache + next-token logits of every row;
  extend   `[Bb, Tb]` right-padded ragged new tokens appended at each row's cursor (incremental
           prefill: only the new tokens are encoded; the context is read from the cache);
  decode   one `lax.while_loop` per segment: sample -> record -> feed the token back, until every row
           completed a stop sequence (a single stop token is a sequence of one; see `stop_sequences`)
           or spent its budget.

Cache and logits are donated to extend/decode. `sampler.Sampler` validates inputs on the host, buckets the
shapes and places the arrays before calling these.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from agent_r1_jax.models.kv_cache import KVCache
from agent_r1_jax.models.qwen2 import merge_for_compute
from agent_r1_jax.models.sharding import SAMPLING_RULES
from agent_r1_jax.sampling import stop_sequences as stops_lib
from agent_r1_jax.sampling.params import StopReason
from agent_r1_jax.sampling.sample import sample_tokens


def _sampling_weights(graphdef, params):
  """The policy's parameters as the sampler's programs read them: the backbone (and an untied LM head) in the
  compute dtype, whole on every device of the fsdp axis (`SAMPLING_RULES`). Made once per rollout, so the
  decode loop neither casts nor gathers; the programs below accept raw parameters too (and then do both)."""
  return nnx.split(merge_for_compute(graphdef, params, rules=SAMPLING_RULES))[1]


def _prefill(graphdef, params, ids, mask, *, max_length, cache_dtype):
  model = merge_for_compute(graphdef, params, rules=SAMPLING_RULES)
  # The prompt attends over its own Pb slots only; the empty rest of the cache is appended afterwards.
  cache = KVCache.init(model.config, ids.shape[0], ids.shape[1], cache_dtype)
  hidden, cache = model.model(ids, mask, cache=cache)
  # Left padding: the last column is real.
  return cache.padded(max_length, model.config.num_key_value_heads), model.logits(hidden[:, -1])


def _extend(graphdef, params, cache, last_logits, ids, mask):
  model = merge_for_compute(graphdef, params, rules=SAMPLING_RULES)
  hidden, cache = model.model(ids, mask, cache=cache)
  n = mask.sum(axis=1)
  last_hidden = hidden[jnp.arange(ids.shape[0]), jnp.maximum(n - 1, 0)]
  logits = jnp.where((n > 0)[:, None], model.logits(last_hidden), last_logits)
  return cache, logits


def segment_end(window, stops, active, count, budgets, reason):
  """Which `active` rows end their segment at this step: `stopped` (their window completes a stop sequence) or
  else `exhausted` (`count` reached `budgets`), bool `[B]` each, and `reason` `[B]` updated for them."""
  stopped = active & stops_lib.completed(window, stops)
  exhausted = active & ~stopped & (count >= budgets)
  reason = jnp.where(stopped, int(StopReason.STOP_TOKEN), jnp.where(exhausted, int(StopReason.LENGTH), reason))
  return stopped, exhausted, reason


def feed_back(model, head, cache, logits, token, active):
  """One decode step's model call: `token` `[B]` of the `active` rows written into the cache at each row's cursor,
  and their next-token logits `[B, V]` (other rows keep theirs). Also for the last token of a segment, so the
  next turn continues from a cache that holds it and from its logits."""
  hidden, cache = model.model(token[:, None], active[:, None].astype(jnp.int32), cache=cache)
  return cache, jnp.where(active[:, None], model.logits(hidden[:, 0], head), logits)


def _decode(graphdef, params, cache, last_logits, budgets, stops, rng, *, sampling,
            width, pad_id):
  """One segment. `stops` int32 `[N, K]` packed stop sequences (`stop_sequences.pack`); each row's window of
  its last K tokens of this segment starts empty, so only this segment's tokens can complete a stop."""
  model = merge_for_compute(graphdef, params, rules=SAMPLING_RULES)  # a no-op on `_sampling_weights`' output
  head = model.head_kernel()
  b = budgets.shape[0]
  max_steps = jnp.max(budgets)

  def cond(carry):
    step, _, _, _, _, _, done, _, _ = carry
    return (step < max_steps) & ~jnp.all(done)

  def body(carry):
    step, cache, logits, tokens, logprobs, count, done, reason, window = carry
    token, logprob = sample_tokens(logits, jax.random.fold_in(rng, step), sampling)
    active = ~done
    token = jnp.where(active, token, pad_id)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, step))
    logprobs = jax.lax.dynamic_update_slice(
        logprobs, jnp.where(active, logprob, 0.0)[:, None], (0, step))
    count = count + active.astype(jnp.int32)
    window = stops_lib.push(window, token)
    stopped, exhausted, reason = segment_end(window, stops, active, count, budgets, reason)
    cache, logits = feed_back(model, head, cache, logits, token, active)
    return step + 1, cache, logits, tokens, logprobs, count, done | stopped | exhausted, reason, window

  init = (jnp.int32(0), cache, last_logits, jnp.full((b, width), pad_id, jnp.int32),
          jnp.zeros((b, width), jnp.float32), jnp.zeros((b,), jnp.int32), budgets <= 0,
          jnp.zeros((b,), jnp.int32), stops_lib.empty_window(b, stops))
  _, cache, logits, tokens, logprobs, count, _, reason, _ = jax.lax.while_loop(cond, body, init)
  return cache, logits, tokens, logprobs, count, reason


sampling_weights_jit = jax.jit(_sampling_weights, static_argnums=0)
prefill_jit = jax.jit(_prefill, static_argnums=0, static_argnames=("max_length", "cache_dtype"))
extend_jit = jax.jit(_extend, static_argnums=0, donate_argnums=(2, 3))
decode_jit = jax.jit(_decode, static_argnums=0, donate_argnums=(2, 3),
                      static_argnames=("sampling", "width", "pad_id"))


def compiled_programs() -> int:
  """Sampler programs compiled so far in this process (prefill + extend + decode caches).

  The jitted functions are shared by all `Sampler`s, so samplers over the same model and shapes reuse
  each other's programs; count one rollout's compilations as a difference.
  """
  jitted = (prefill_jit, extend_jit, decode_jit)
  return sum(f._cache_size() for f in jitted)  # pylint: disable=protected-access
