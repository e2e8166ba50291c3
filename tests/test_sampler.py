"""KV-cache sampler vs transformers generate, vs a fresh prefill, vs the full forward; properties."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1_jax.models import load_hf_checkpoint, make_mesh
from agent_r1_jax.sampling import (Sampler, SamplingParams, StopReason, allowed_tokens,
                                   compiled_programs, max_logprob_drift, rollout_compile_bound,
                                   sample_tokens)
import padding
from reference_models import random_hf_checkpoint

VOCAB = 96
PAD = 0
CACHE = 96


def make_hf_checkpoint(path, *, vocab=VOCAB, seed=0, std=0.15):
  return random_hf_checkpoint(path, vocab=vocab, rms_norm_eps=1e-6, max_positions=512, norm_spread=0.1, std=std,
                              seed=seed)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(hf_model, graphdef, params) of a random 2-layer model."""
  path = tmp_path_factory.mktemp("sampler_tiny")
  hf = make_hf_checkpoint(path)
  graphdef, params = nnx.split(load_hf_checkpoint(path))
  return hf, graphdef, params


def left_pad(rows, width=None, pad=PAD):
  """Left-padded `[B, width]` ids and their 0/1 mask, PAD by default (also used by test_sampler_multihost)."""
  return padding.left_pad(rows, pad=pad, width=width)


PROMPTS = [[5, 17, 42, 9, 33, 71, 8, 12, 60], [11, 4, 90], [23, 7, 55, 61, 2, 19]]


def hf_greedy(hf, prompt, n, eos=None):
  out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=PAD,
                    min_new_tokens=0)
  return out[0, len(prompt):].tolist()


def test_greedy_matches_transformers_generate(tiny):
  hf, graphdef, params = tiny
  refs = [hf_greedy(hf, p, 12) for p in PROMPTS]
  # A stop id that first appears mid-way in row 0's greedy output (and is not PAD).
  stop = next(t for i, t in enumerate(refs[0]) if i >= 3 and t not in refs[0][:i] and t != PAD)
  refs = [hf_greedy(hf, p, 12, eos=stop) for p in PROMPTS]
  sampler = Sampler(graphdef, max_cache_length=CACHE, stop_token_ids=[stop], pad_id=PAD)
  state = sampler.prefill(params, *left_pad(PROMPTS))
  state, seg = sampler.decode(params, state, np.array([12, 12, 12]), SamplingParams(greedy=True),
                              jax.random.key(0))
  for row, ref in enumerate(refs):
    if stop in ref:  # transformers pads after EOS in a batch; alone it stops at it
      ref = ref[:ref.index(stop) + 1]
    n = seg.lengths[row]
    assert seg.tokens[row, :n].tolist() == ref
    assert (seg.tokens[row, n:] == PAD).all()
    expected = StopReason.STOP_TOKEN if ref[-1] == stop else StopReason.LENGTH
    assert seg.stop_reasons[row] == expected
  assert seg.stop_reasons[0] == StopReason.STOP_TOKEN
  np.testing.assert_array_equal(state.lengths, [len(p) for p in PROMPTS] + seg.lengths)


@nnx.jit
def _forward(model, ids, mask):
  return model(ids, mask)


def test_continue_equals_fresh_prefill_and_logprobs_equal_full_forward(tiny):
  """Two turns with ragged observations; compare with re-encoding everything and with the learner."""
  _, graphdef, params = tiny
  model = nnx.merge(graphdef, params)
  sampler = Sampler(graphdef, max_cache_length=CACHE, stop_token_ids=[7], pad_id=PAD)
  sampling = SamplingParams(temperature=0.8, top_k=20, top_p=0.95)
  state = sampler.prefill(params, *left_pad(PROMPTS))
  state, seg1 = sampler.decode(params, state, np.array([6, 4, 6]), sampling, jax.random.key(1))
  observations = [[3, 14, 15, 92, 65], [], [27, 18]]
  state = sampler.extend(params, state, observations)
  contexts = [PROMPTS[r] + seg1.tokens[r, :seg1.lengths[r]].tolist() + observations[r]
              for r in range(3)]
  # Fresh prefill of the whole context must give the same next-token logits.
  fresh = sampler.prefill(params, *left_pad(contexts))
  np.testing.assert_allclose(np.asarray(state.last_logits)[:3], np.asarray(fresh.last_logits)[:3],
                             atol=1e-4, rtol=0)
  # The next segments are token-identical on both paths (same key, same logits up to 1e-4);
  # decode consumes (donates) the state it is given, so each path decodes its own.
  budgets = np.array([6, 6, 0])
  state, seg2 = sampler.decode(params, state, budgets, sampling, jax.random.key(4))
  _, seg_fresh = sampler.decode(params, fresh, budgets, sampling, jax.random.key(4))
  np.testing.assert_array_equal(seg2.tokens, seg_fresh.tokens)
  np.testing.assert_allclose(seg2.logprobs, seg_fresh.logprobs, atol=1e-4)
  assert seg2.lengths[2] == 0 and seg2.stop_reasons[2] == StopReason.NONE
  p_ids, p_mask = left_pad(PROMPTS)
  responses, action, sampled_lp = [], [], []
  for r in range(3):
    t1 = seg1.tokens[r, :seg1.lengths[r]].tolist()
    t2 = seg2.tokens[r, :seg2.lengths[r]].tolist()
    responses.append(t1 + observations[r] + t2)
    action.append([1] * len(t1) + [0] * len(observations[r]) + [1] * len(t2))
    sampled_lp.append(list(seg1.logprobs[r, :len(t1)]) + [0.0] * len(observations[r])
                      + list(seg2.logprobs[r, :len(t2)]))
  width = max(len(x) for x in responses)
  r_ids = np.full((3, width), PAD, np.int32)
  r_mask = np.zeros((3, width), np.int32)
  act = np.zeros((3, width), np.int32)
  old_lp = np.zeros((3, width), np.float32)
  for r in range(3):
    n = len(responses[r])
    r_ids[r, :n], r_mask[r, :n], act[r, :n], old_lp[r, :n] = (responses[r], 1, action[r],
                                                              sampled_lp[r])
  ids = np.concatenate([p_ids, r_ids], 1)
  mask = np.concatenate([p_mask, r_mask], 1)
  np.testing.assert_array_equal(mask.sum(1), state.lengths)
  logits = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)), np.float64)
  p = p_ids.shape[1]
  scaled = logits[:, p - 1:-1] / sampling.temperature  # position t predicts token t + 1
  logp = scaled - scaled.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  learner = np.take_along_axis(logp, r_ids[..., None], -1)[..., 0]
  drift = max_logprob_drift(old_lp, learner, act)
  assert drift <= 1e-4, drift


# -- sampling rules: property tests over random logits ----------------------------------------------

# Rounded to 1e-3: near-denormal logits would become denormal after temperature scaling, and XLA:CPU
# flushes those to zero (a float-format effect, not a sampling property).
LOGITS = st.lists(st.floats(-6, 6, allow_nan=False).map(lambda x: round(x, 3)),
                  min_size=3 * 12, max_size=3 * 12)


@settings(max_examples=25, deadline=None)
@given(values=LOGITS, k=st.integers(1, 12), seed=st.integers(0, 2**31 - 1),
       temperature=st.sampled_from([0.5, 1.0, 1.7]))
def test_top_k_never_samples_outside_k_best(values, k, seed, temperature):
  logits = np.asarray(values, np.float32).reshape(3, 12)
  params = SamplingParams(temperature=temperature, top_k=k)
  tokens, logprobs = sample_tokens(jnp.asarray(logits), jax.random.key(seed), params)
  for row, tok in zip(logits, np.asarray(tokens)):
    kth = np.sort(row)[::-1][k - 1]
    assert row[tok] >= kth
  scaled = logits.astype(np.float64) / temperature
  ref = scaled - scaled.max(1, keepdims=True)
  ref = ref - np.log(np.exp(ref).sum(1, keepdims=True))
  np.testing.assert_allclose(np.asarray(logprobs), ref[np.arange(3), np.asarray(tokens)], atol=1e-5)


@settings(max_examples=15, deadline=None)
@given(values=LOGITS, p=st.floats(0.05, 0.99), seed=st.integers(0, 2**31 - 1))
def test_top_p_never_samples_outside_nucleus(values, p, seed):
  """The kept set is the smallest most-likely set whose mass reaches p (tie order is free)."""
  logits = np.asarray(values, np.float32).reshape(3, 12)
  params = SamplingParams(temperature=1.0, top_p=p)
  keep = np.asarray(allowed_tokens(jnp.asarray(logits), params))
  probs = np.exp(logits - logits.max(1, keepdims=True)).astype(np.float64)
  probs /= probs.sum(1, keepdims=True)
  for row in range(3):
    kept, dropped = probs[row][keep[row]], probs[row][~keep[row]]
    assert kept.size >= 1
    if dropped.size:
      assert kept.min() >= dropped.max() - 1e-6      # only most-likely tokens are kept
      assert kept.sum() >= p - 1e-5                  # the kept mass reaches p ...
    assert kept.sum() - kept.min() < p + 1e-5        # ... and no smaller top set would
  tokens, _ = sample_tokens(jnp.asarray(logits), jax.random.key(seed), params)
  for row, tok in enumerate(np.asarray(tokens)):
    assert keep[row, tok]


@settings(max_examples=15, deadline=None)
@given(values=LOGITS, seed=st.integers(0, 2**31 - 1))
def test_greedy_and_temperature_zero_are_argmax(values, seed):
  logits = np.asarray(values, np.float32).reshape(3, 12)
  for params in (SamplingParams(greedy=True, temperature=0.3, top_k=2), SamplingParams(temperature=0.0)):
    tokens, logprobs = sample_tokens(jnp.asarray(logits), jax.random.key(seed), params)
    assert (logits[np.arange(3), np.asarray(tokens)] == logits.max(1)).all()
    ref = logits - logits.max(1, keepdims=True)
    ref = ref - np.log(np.exp(ref).sum(1, keepdims=True))  # temperature 1 log-probs
    np.testing.assert_allclose(np.asarray(logprobs), ref[np.arange(3), np.asarray(tokens)],
                               atol=1e-5)


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
  """A 12-token model so stop tokens are sampled often."""
  path = tmp_path_factory.mktemp("sampler_v12")
  make_hf_checkpoint(path, vocab=12, seed=1, std=0.3)
  graphdef, params = nnx.split(load_hf_checkpoint(path))
  return graphdef, params


@settings(max_examples=12, deadline=None)
@given(budgets=st.lists(st.integers(0, 8), min_size=3, max_size=3).filter(lambda b: max(b) > 0),
       stops=st.sets(st.integers(1, 11), min_size=1, max_size=3), seed=st.integers(0, 1000))
def test_stop_tokens_and_budgets(small_vocab, budgets, stops, seed):
  graphdef, params = small_vocab
  sampler = Sampler(graphdef, max_cache_length=32, stop_token_ids=sorted(stops), pad_id=PAD)
  state = sampler.prefill(params, *left_pad([[1, 2, 3], [4, 5], [6]]))
  budgets = np.array(budgets)
  _, seg = sampler.decode(params, state, budgets, SamplingParams(temperature=1.0),
                          jax.random.key(seed))
  assert seg.tokens.shape == (3, budgets.max())
  for r in range(3):
    n = seg.lengths[r]
    row = seg.tokens[r].tolist()
    assert n <= budgets[r]
    assert all(t not in stops for t in row[:max(n - 1, 0)])  # nothing stops before the end
    assert all(t == PAD for t in row[n:]) and (seg.logprobs[r, n:] == 0).all()
    if budgets[r] == 0:
      assert n == 0 and seg.stop_reasons[r] == StopReason.NONE
    elif row[n - 1] in stops:
      assert seg.stop_reasons[r] == StopReason.STOP_TOKEN
    else:
      assert n == budgets[r] and seg.stop_reasons[r] == StopReason.LENGTH


# -- static shapes, mesh, errors --------------------------------------------------------------------


def test_five_turn_rollout_compiles_a_bounded_set_of_programs(tiny):
  """5 turns with observation lengths 0..19 and budgets 1..9 stay within the documented bound."""
  _, graphdef, params = tiny
  # A cache size no other test uses, so every program this rollout needs is compiled here.
  sampler = Sampler(graphdef, max_cache_length=136, stop_token_ids=[7], pad_id=PAD)
  rng = np.random.RandomState(0)
  sampling = SamplingParams(temperature=1.0)
  obs_lengths, budget_list = [], []

  def rollout(seed):
    state = sampler.prefill(params, *left_pad(PROMPTS))
    state, _ = sampler.decode(params, state, np.array([10, 10, 10]), sampling,
                              jax.random.key(seed))
    budget_list.append(10)
    for turn in range(4):
      obs = [rng.randint(1, VOCAB, size=rng.randint(0, 20)).tolist() for _ in range(3)]
      obs_lengths.append(max(len(o) for o in obs))
      budgets = np.array([rng.randint(1, 10) for _ in range(3)])
      budget_list.append(int(budgets.max()))
      state, _ = sampler.continue_(params, state, obs, budgets, sampling,
                                   jax.random.key(seed * 10 + turn))

  before = compiled_programs()
  rollout(0)
  rollout(1)  # a second episode, other observation lengths
  compiled = compiled_programs() - before
  bound = rollout_compile_bound([9], budget_list, obs_lengths)
  # 1 prefill + decode buckets {8, 16} + extend buckets within {8, 16, 32}: at most 6 programs,
  # for 10 segments and 8 extensions of 2 episodes.
  assert bound <= 6
  assert compiled <= bound, (compiled, bound)


def test_sharded_sampling_matches_single_device(tiny):
  _, graphdef, params = tiny
  greedy = SamplingParams(greedy=True)
  prompts = PROMPTS + [[9, 9, 1]]
  single = Sampler(graphdef, max_cache_length=CACHE, stop_token_ids=[7], pad_id=PAD)
  state = single.prefill(params, *left_pad(prompts))
  state = single.extend(params, state, [[4, 4], [], [8], [1, 2, 3]])
  _, ref = single.decode(params, state, np.array([6, 6, 6, 6]), greedy, jax.random.key(0))
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  from agent_r1_jax.models import state_shardings
  sharded_params = jax.device_put(params, state_shardings(params, mesh))
  sampler = Sampler(graphdef, max_cache_length=CACHE, stop_token_ids=[7], pad_id=PAD, mesh=mesh)
  state = sampler.prefill(sharded_params, *left_pad(prompts))
  state = sampler.extend(sharded_params, state, [[4, 4], [], [8], [1, 2, 3]])
  spec = state.cache.k[0].sharding.spec  # [B, S, K * hd]: rows over (data, fsdp), whole KV heads over tensor
  assert spec[0] == ("data", "fsdp") and spec[1] is None and spec[2] == "tensor", spec
  _, seg = sampler.decode(sharded_params, state, np.array([6, 6, 6, 6]), greedy, jax.random.key(0))
  np.testing.assert_array_equal(seg.tokens, ref.tokens)
  np.testing.assert_allclose(seg.logprobs, ref.logprobs, atol=1e-5)


def test_bad_input_raises_before_compiling(tiny):
  _, graphdef, params = tiny
  with pytest.raises(ValueError, match=r"unknown stop token id\(s\) \[96\]"):
    Sampler(graphdef, max_cache_length=32, stop_token_ids=[96], pad_id=PAD)
  sampler = Sampler(graphdef, max_cache_length=32, stop_token_ids=[7], pad_id=PAD)
  before = compiled_programs()
  with pytest.raises(ValueError, match="longer than the cache"):
    sampler.prefill(params, *left_pad([list(range(1, 40))]))
  with pytest.raises(ValueError, match=r"empty prompt in row\(s\) \[1\]"):
    sampler.prefill(params, np.ones((2, 4), np.int32), np.array([[1, 1, 1, 1], [0, 0, 0, 0]]))
  with pytest.raises(ValueError, match="empty prompt batch"):
    sampler.prefill(params, np.zeros((2, 0), np.int32), np.zeros((2, 0), np.int32))
  with pytest.raises(ValueError, match="not left-padded"):
    sampler.prefill(params, np.ones((1, 4), np.int32), np.array([[1, 1, 0, 0]]))
  assert compiled_programs() == before
  state = sampler.prefill(params, *left_pad([[1, 2], [3]]))
  compiled = compiled_programs()
  for budgets, pattern in [([-1, 3], "must be >= 0"), ([20, 1], "row 0 would overflow the KV cache")]:
    with pytest.raises(ValueError, match=pattern):
      sampler.decode(params, state, np.array(budgets), SamplingParams(), jax.random.key(0))
  with pytest.raises(ValueError, match=r"row 1: token ids must be in \[0, 96\)"):
    sampler.extend(params, state, [[], [100]])
  with pytest.raises(ValueError, match="top_p must be in"):
    SamplingParams(top_p=0.0)
  assert compiled_programs() == compiled


def test_prepared_weights_sample_exactly_what_raw_parameters_sample(tmp_path):
  """`Sampler.prepare` (bf16 compute over float32 parameters: cast once per rollout) against the programs casting
  the raw parameters themselves, on a 2 x 2 x 2 mesh where it also gathers over fsdp: the same tokens and the same
  log-probs, bit for bit; the prepared weights are bf16 and whole over fsdp."""
  make_hf_checkpoint(tmp_path)
  graphdef, params = nnx.split(load_hf_checkpoint(tmp_path, compute_dtype=jnp.bfloat16))
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  from agent_r1_jax.models import state_shardings  # pylint: disable=import-outside-toplevel
  params = jax.device_put(params, state_shardings(params, mesh))
  sampler = Sampler(graphdef, max_cache_length=CACHE, stop_token_ids=[7], pad_id=PAD, mesh=mesh,
                    cache_dtype=jnp.bfloat16)
  prepared = sampler.prepare(params)
  q = prepared["model"]["layers"][0]["attn"]["q_kernel"][...]
  assert q.dtype == jnp.bfloat16 and "fsdp" not in str(q.sharding.spec), q.sharding.spec
  prompts = PROMPTS + [[9, 9, 1]]
  segments = []
  for weights in (params, prepared):
    state = sampler.prefill(weights, *left_pad(prompts))
    state, first = sampler.decode(weights, state, np.array([5, 5, 5, 5]), SamplingParams(temperature=1.0),
                                  jax.random.key(4))
    _, second = sampler.continue_(weights, state, [[4, 4], [], [8], [1, 2, 3]], np.array([5, 5, 5, 5]),
                                  SamplingParams(temperature=1.0), jax.random.key(5))
    segments.append((first, second))
  for raw, ready in zip(*segments):
    np.testing.assert_array_equal(ready.tokens, raw.tokens)
    np.testing.assert_array_equal(ready.logprobs, raw.logprobs)
