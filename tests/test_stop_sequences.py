"""Multi-token stop sequences in the jitted decode loop, and the stop sequences derived from a real tokenizer.

The sampler is checked against a plain-Python reference scan of the tokens it sampled: a segment of budget n
ends at the first length m <= n at which the segment's own last tokens equal some stop sequence (STOP_TOKEN),
else at n (LENGTH); a budget of 0 samples nothing (NONE). Tokens before the segment (prompt, earlier segments,
observations) never complete a stop. Two models:

  * a "cycle" model (`add_token_chain`, greedy): after token a it writes succ(a), 1 -> 2 -> 3 -> 4 -> 1, so every
    sampled stream is known in advance and the expected lengths are written in the test;
  * a random 4-token model sampled at temperature 1 (hypothesis): stop sequences over 3 ids of lengths 1-4 then
    complete often, with overlaps (a sequence whose prefix repeats, e.g. 1 1 2 after 1 1 1) and ties.

The last tests use the real SmolLM2 tokenizer (skipped without the shared data): how it spells `</tool_call>`
in context and which stop sequences `turn_stop_sequences` derives from it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_r1_jax.envs import NousToolEnv
from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM, abstract_model
from agent_r1_jax.rollout import stop_strings
from scripted_policy import add_token_chain
from agent_r1_jax.sampling import Sampler, SamplingParams, StopReason
from agent_r1_jax.sampling import stop_sequences as stops_lib
import padding

PAD = 0
GREEDY = SamplingParams(greedy=True)


def reference_stop(stream, stops, budget) -> tuple[int, StopReason]:
  """(length, reason) of a segment of `budget` whose sampled tokens start with `stream`."""
  if budget == 0:
    return 0, StopReason.NONE
  for m in range(1, min(budget, len(stream)) + 1):
    if any(m >= len(s) and tuple(stream[m - len(s):m]) == tuple(s) for s in stops):
      return m, StopReason.STOP_TOKEN
  return budget, StopReason.LENGTH


def check_segment(seg, stops, budgets):
  """Every row of `seg` ends where the reference scan of its own tokens says; padding after the end."""
  for r, budget in enumerate(budgets):
    n = int(seg.lengths[r])
    stream = seg.tokens[r, :n].tolist()
    assert (n, seg.stop_reasons[r]) == reference_stop(stream, stops, int(budget)), (r, stream, stops, budget)
    assert (seg.tokens[r, n:] == PAD).all() and (seg.logprobs[r, n:] == 0).all()


def left_pad(rows):
  return padding.left_pad(rows, pad=PAD)


def tiny_model(vocab: int, seed: int) -> Qwen2ForCausalLM:
  """A random 1-layer model (norm weights 1, everything else N(0, 0.1^2)), filled from numpy: initialising
  it eagerly would compile an init program per shape (about 10 s for SmolLM2's vocabulary)."""
  config = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)
  model = abstract_model(config)
  rng = np.random.default_rng(seed)

  def fill(path, x):
    if "norm" in jax.tree_util.keystr(path):
      return jnp.ones(x.shape, x.dtype)
    return jnp.asarray(rng.normal(0.0, 0.1, x.shape), x.dtype)

  nnx.update(model, jax.tree_util.tree_map_with_path(fill, nnx.state(model)))
  return model


# -- the window on its own ---------------------------------------------------------------------------------


def _scan_window(stream, seqs):
  """Step numbers (1-based) at which `completed` fires while `stream` is pushed into an empty window."""
  packed = jnp.asarray(stops_lib.pack(seqs))
  window = stops_lib.empty_window(1, packed)
  hits = []
  for step, token in enumerate(stream, 1):
    window = stops_lib.push(window, jnp.asarray([token]))
    if bool(stops_lib.completed(window, packed)[0]):
      hits.append(step)
  return hits


def test_window_matches_overlapping_and_mixed_length_sequences():
  """Defects caught: a matcher that restarts after a partial match (misses 1 1 2 inside 1 1 1 2), that lets
  -1 padding or the empty window's -1 slots match, or that compares the wrong end of the window."""
  assert _scan_window([1, 1, 1, 2], [(1, 1, 2)]) == [4]
  assert _scan_window([3, 1, 3, 1, 3], [(3, 1, 3)]) == [3, 5]  # overlapping occurrences
  assert _scan_window([2, 5, 4, 1], [(5,), (2, 5, 4, 1)]) == [2, 4]  # lengths 1 and 4 in one [4, 4] table
  assert _scan_window([4, 1, 2], [(9, 4, 1)]) == []  # a prefix that was never sampled does not match
  packed = stops_lib.pack([(7,), (1, 2, 3)])
  assert packed.shape == (4, 4) and (packed[2:] == -1).all() and packed[1].tolist() == [-1, 1, 2, 3]


# -- the sampler with a known stream ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cycle_model():
  """Greedy: after token a (1..4) the model writes succ(a) = a % 4 + 1; tokens 5, 6 only appear in prompts."""
  model = tiny_model(vocab=8, seed=0)
  add_token_chain(model, {1: {2: 20.0}, 2: {3: 20.0}, 3: {4: 20.0}, 4: {1: 20.0}})
  return nnx.split(model)


CYCLE_STOPS = ((2, 3, 4), (4, 1))


def test_multi_token_stops_end_rows_where_they_complete(cycle_model):
  """Two segments over rows that stop on the longer or the shorter sequence, exactly at the budget, run out of
  budget, or are inactive; the prompt / previous segment / observation ends with a prefix of a stop sequence
  in several rows, which must not count.

  Defects caught: a window seeded from the context (rows 0, 2, 6 would stop after 2, 1, 1 tokens in segment
  1; rows 2, 4, 5 after 1, 2, 1 tokens in segment 2), a window not reset between segments, a stop at the
  budget reported as LENGTH, an inactive row that samples, and stop tokens left out of the segment."""
  graphdef, params = cycle_model
  sampler = Sampler(graphdef, max_cache_length=64, stop_sequences=CYCLE_STOPS, pad_id=PAD)
  assert sampler.stop_sequences == CYCLE_STOPS and sampler.stop_token_ids == ()
  prompts = [[5, 1, 2], [5, 3], [5, 4], [6, 6], [5, 1], [5, 1], [5, 2, 3]]
  budgets = np.array([10, 10, 10, 0, 3, 2, 10])
  state = sampler.prefill(params, *left_pad(prompts))
  state, seg = sampler.decode(params, state, budgets, GREEDY, jax.random.key(0))
  expected = [[3, 4, 1], [4, 1], [1, 2, 3, 4], [], [2, 3, 4], [2, 3], [4, 1]]
  assert [seg.tokens[r, :n].tolist() for r, n in enumerate(seg.lengths)] == expected
  stop, length, none = StopReason.STOP_TOKEN, StopReason.LENGTH, StopReason.NONE
  assert seg.stop_reasons.tolist() == [stop, stop, stop, none, stop, length, stop]
  check_segment(seg, CYCLE_STOPS, budgets)

  observations = [[], [], [], [], [2], [], []]
  budgets = np.array([10, 10, 10, 0, 10, 10, 0])
  state, seg = sampler.continue_(params, state, observations, budgets, GREEDY, jax.random.key(1))
  expected = [[2, 3, 4], [2, 3, 4], [1, 2, 3, 4], [], [3, 4, 1], [4, 1], []]
  assert [seg.tokens[r, :n].tolist() for r, n in enumerate(seg.lengths)] == expected
  assert seg.stop_reasons.tolist() == [stop, stop, stop, none, stop, stop, none]
  check_segment(seg, CYCLE_STOPS, budgets)
  assert state.lengths.tolist() == [9, 7, 10, 2, 9, 6, 5]  # prompt + segment 1 + observation + segment 2


def test_single_ids_and_sequences_share_one_mechanism(cycle_model):
  """stop_token_ids and one-id stop_sequences are the same condition; mixing them with longer sequences keeps
  every one. Defect caught: single ids dropped (or matched on the wrong window slot) once K > 1."""
  graphdef, params = cycle_model
  sampler = Sampler(graphdef, max_cache_length=64, stop_token_ids=[3], stop_sequences=[(4, 1, 2, 3, 4), (3,)],
                    pad_id=PAD)
  assert sampler.stop_sequences == ((3,), (4, 1, 2, 3, 4)) and sampler.stop_token_ids == (3,)
  state = sampler.prefill(params, *left_pad([[5, 1], [5, 3], [5, 2]]))
  _, seg = sampler.decode(params, state, np.array([8, 8, 8]), GREEDY, jax.random.key(0))
  assert [seg.tokens[r, :n].tolist() for r, n in enumerate(seg.lengths)] == [[2, 3], [4, 1, 2, 3], [3]]
  check_segment(seg, sampler.stop_sequences, [8, 8, 8])


def test_bad_stop_sequences_raise():
  graphdef, _ = nnx.split(tiny_model(vocab=8, seed=0))
  for kwargs, pattern in [({}, "no stop condition"),
                          ({"stop_sequences": [(1, 2), ()]}, r"stop_sequences \[1\] are empty"),
                          ({"stop_sequences": [1, 2]}, "bare id"),
                          ({"stop_sequences": [(1, 8)]}, r"unknown stop token id\(s\) \[8\]")]:
    with pytest.raises(ValueError, match=pattern):
      Sampler(graphdef, max_cache_length=16, pad_id=PAD, **kwargs)


# -- the sampler on random streams -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_model():
  return nnx.split(tiny_model(vocab=4, seed=3))


STOP_SEQS = st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple), min_size=1, max_size=3,
                     unique=True)


@settings(max_examples=20, deadline=None)
@given(stops=STOP_SEQS, budgets=st.lists(st.integers(0, 8), min_size=6, max_size=6), seed=st.integers(0, 10**6))
def test_random_streams_stop_as_the_reference_scan(random_model, stops, budgets, seed):
  """Temperature-1 sampling from a 4-token model: two segments (the second after random observations), each
  row's length and stop reason equal the reference scan of its own tokens."""
  graphdef, params = random_model
  rng = np.random.default_rng(seed)
  sampler = Sampler(graphdef, max_cache_length=64, stop_sequences=stops, pad_id=PAD)
  prompts = [rng.integers(1, 4, size=rng.integers(1, 6)).tolist() for _ in range(6)]
  state = sampler.prefill(params, *left_pad(prompts))
  state, seg = sampler.decode(params, state, np.array(budgets), SamplingParams(temperature=1.0),
                              jax.random.key(seed))
  check_segment(seg, stops, budgets)
  observations = [rng.integers(1, 4, size=rng.integers(0, 4)).tolist() for _ in range(6)]
  budgets2 = rng.integers(0, 9, size=6)  # budgets <= 8: one segment bucket, so only K varies the program
  state, seg = sampler.continue_(params, state, observations, budgets2, SamplingParams(temperature=1.0),
                                 jax.random.key(seed + 1))
  check_segment(seg, stops, budgets2)


# -- stop sequences of the real SmolLM2 tokenizer ---------------------------------------------------------

CLOSE = ("</", "tool", "_", "call", ">")  # SmolLM2's pieces of the standalone `</tool_call>`


def _pieces(tok, text):
  return tok.convert_ids_to_tokens(tok.encode(text, add_special_tokens=False))


def test_smollm2_spells_tool_call_close_in_five_tokens(smollm2_tokenizer):
  """What the derivation has to cover: standalone and after a newline `</tool_call>` is `</ tool _ call >`;
  after a space the first piece absorbs it (`Ġ</`), before punctuation the last piece does (`>.`)."""
  tok = smollm2_tokenizer
  assert _pieces(tok, "</tool_call>") == list(CLOSE)
  assert _pieces(tok, "<tool_call>") == ["<", "tool", "_", "call", ">"]
  assert _pieces(tok, '"a": 1}}\n</tool_call>')[-6:] == ["Ċ", *CLOSE]
  assert _pieces(tok, '"a": 1}}</tool_call>')[-6:] == ["}}", *CLOSE]
  assert _pieces(tok, "}}\n</tool_call><|im_end|>")[-6:] == [*CLOSE, "<|im_end|>"]
  assert _pieces(tok, "}}\n</tool_call>\n")[-2:] == [">", "Ċ"]
  assert _pieces(tok, "}} </tool_call>")[-5:] == ["Ġ</", *CLOSE[1:]]
  assert _pieces(tok, "}}\n</tool_call>.")[-2:] == ["call", ">."]
  # The call NousToolEnv renders (how a well-behaved model writes it) ends on the standalone spelling.
  call = NousToolEnv.render_call("search", {"query": "capital of France"})
  assert _pieces(tok, call)[-5:] == list(CLOSE) and _pieces(tok, call)[:6] == ["<", "tool", "_", "call", ">", "Ċ"]


def test_smollm2_turn_stop_sequences(smollm2_tokenizer):
  """Defects caught: `</tool_call>` looked up as one token (SmolLM2 has none: convert_tokens_to_ids gives the
  unknown id), the in-context spellings missing, or `</tool_call>` kept with parallel tool calls."""
  tok = smollm2_tokenizer
  im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
  assert (im_end, eot) == (2, 0)
  close = tuple(tok.convert_tokens_to_ids(list(CLOSE)))
  seqs = stop_strings.turn_stop_sequences(tok, parallel_tool_calls=False)
  assert seqs[:2] == ((im_end,), close) and seqs[-1] == (eot,)
  spellings = set(seqs[1:-1])
  for text in ("}}\n</tool_call>", "}}</tool_call>", "}} </tool_call>", "}}\n</tool_call>.", "x></tool_call>",
               "}}\n</tool_call>,"):
    ids = tuple(tok.encode(text, add_special_tokens=False))
    assert any(ids[-len(s):] == s for s in spellings), text
  assert all(len(s) == 5 and s[1:4] == close[1:4] for s in spellings)
  firsts = {tok.convert_ids_to_tokens(s[0]) for s in spellings}
  assert firsts == {"</", "Ġ</", "></"}  # every SmolLM2 piece ending with "</"
  assert stop_strings.turn_stop_sequences(tok, parallel_tool_calls=True) == ((im_end,), (eot,))
  assert stop_strings.standalone_ids(tok) == {"<|im_end|>": (im_end,), "</tool_call>": close}


def test_smollm2_rollout_stops_on_the_multi_token_close(smollm2_tokenizer):
  """The trainer's sampler (`build.build_sampler`) over SmolLM2's vocabulary, driven by `run_episodes`: a tiny
  random model edited to write `</ tool _ call >` then `<|im_end|>` after the assistant header (`Ċ`), and
  `Ġ</ tool _ call >` after `ok`. With one call per turn each segment ends on the close (the standalone and the
  space-merged spelling), with parallel calls on `<|im_end|>`.

  Defects caught: build_sampler looking `</tool_call>` up as one token, the rollout's up-front check refusing
  a tokenizer whose `</tool_call>` is several tokens, the variant spelling missing on device."""
  from agent_r1_jax.rollout import EpisodeStop, run_episodes  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.learner import build  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.trainer.config import base_config  # pylint: disable=import-outside-toplevel

  tok = smollm2_tokenizer
  pid = tok.convert_tokens_to_ids
  chain = [("Ċ", "</"), ("ok", "Ġ</"), ("</", "tool"), ("Ġ</", "tool"), ("tool", "_"), ("_", "call"), ("call", ">"),
           (">", "<|im_end|>")]
  model = tiny_model(vocab=len(tok), seed=0)
  add_token_chain(model, {pid(a): {pid(b): 20.0} for a, b in chain})
  graphdef, params = nnx.split(model)
  header = "<|im_start|>user\nLook it up.<|im_end|>\n<|im_start|>assistant\n"
  prompts_text = [header, header + "ok"]
  assert tok.convert_ids_to_tokens(tok.encode(prompts_text[1], add_special_tokens=False))[-1] == "ok"
  close = [pid(p) for p in CLOSE]
  for parallel, turns in ((False, [close, [pid("Ġ</")] + close[1:]]),
                          (True, [close + [2], [pid("Ġ</")] + close[1:] + [2]])):
    c = base_config("grpo", "tiny")
    c.env.parallel_tool_calls = parallel
    c.rollout.update(dict(max_turns=1, max_prompt_length=32, max_new_tokens_per_turn=8, max_response_length=16,
                          max_context_length=64, max_observation_tokens=None))
    rcfg = build.rollout_config(c, tok)
    sampler = build.build_sampler(c, graphdef, tok, rcfg, build.build_mesh(c))
    env = NousToolEnv([], parallel_tool_calls=parallel)
    batch = run_episodes(sampler, params, env, tok, prompts_text, rcfg, GREEDY, jax.random.key(0))
    for b, turn in enumerate(turns):
      n = int(batch.response_mask[b].sum())
      assert batch.response_ids[b, :n].tolist() == turn, (parallel, b)
    assert (batch.stop_reason == EpisodeStop.ANSWER).all() and (batch.num_tool_calls == 0).all()
