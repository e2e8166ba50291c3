"""End to end: the real sampler on a random tiny Qwen2, the real NousToolEnv and a BM25 `search` tool.

The random model is made to call tools with `add_token_chain` (after the assistant header it opens
`<tool_call>` or `<answer>`, a sampled branch, then follows a fixed call or answer), so episodes really
alternate sampled segments with retrieval observations. The sampler and the env are wrapped in recorders;
the test checks the driver's batch against what they recorded and against one full forward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.envs import NousToolEnv
from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.retrieval import BM25Index, Passage
from agent_r1_jax.rollout import EpisodeStop, RolloutConfig, run_episodes
from scripted_policy import add_token_chain, byte_tokenizer, chain_bonus, merge_bonus
from agent_r1_jax.sampling import Sampler, SamplingParams
from agent_r1_jax.tools import WikiSearchTool

CALL_HEAD = '{"name": "search", "arguments": {"query": "'
CALL_TAIL = '"}}'
TOK = byte_tokenizer(pieces=(CALL_HEAD, CALL_TAIL))
CALL = "<tool_call>" + CALL_HEAD + "paris" + CALL_TAIL + "</tool_call>"
ANSWER = "<answer>lyon</answer><|im_end|>"
PASSAGES = [
    Passage("1", "Paris", "Paris is the capital and most populous city of France."),
    Passage("2", "Lyon", "Lyon is the third-largest city of France, on the Rhone."),
    Passage("3", "Seine", "The Seine is a river that flows through Paris."),
    Passage("4", "Bern", "Bern is the de facto capital of Switzerland."),
]


def ids(text: str) -> list[int]:
  return TOK.encode(text, add_special_tokens=False)


class RecordingSampler:
  """Forwards to the real sampler and keeps every segment it returned (copied)."""

  def __init__(self, sampler):
    self.inner = sampler
    self.max_cache_length = sampler.max_cache_length
    self.stop_token_ids = sampler.stop_token_ids
    self.segments = []  # per call: (tokens [B,S], logprobs [B,S], lengths [B])

  def prefill(self, *args):
    return self.inner.prefill(*args)

  def _keep(self, out):
    state, seg = out
    self.segments.append((np.array(seg.tokens), np.array(seg.logprobs), np.array(seg.lengths)))
    return state, seg

  def decode(self, *args):
    return self._keep(self.inner.decode(*args))

  def continue_(self, *args):
    return self._keep(self.inner.continue_(*args))


class RecordingEnv:
  def __init__(self, env):
    self.inner = env
    self.calls = []  # (texts, results)

  def batch_step(self, texts):
    results = self.inner.batch_step(texts)
    self.calls.append((list(texts), results))
    return results


@pytest.fixture(scope="module")
def policy():
  config = Qwen2Config(vocab_size=len(TOK), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16)
  model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))
  branch = {ids("\n")[0]: {ids(CALL)[0]: 13.0, ids(ANSWER)[0]: 11.5}}  # p(call) ~ 0.8 per turn
  add_token_chain(model, merge_bonus(branch, chain_bonus(ids(CALL), 12.0), chain_bonus(ids(ANSWER), 12.0)),
                  block_gain=4.0)
  return model


def test_rollout_with_real_sampler_env_and_search(policy):
  graphdef, params = nnx.split(policy)
  config = RolloutConfig(max_prompt_length=60, max_response_length=400, max_turns=3, max_new_tokens_per_turn=24)
  stops = [TOK.convert_tokens_to_ids(t) for t in ("<|im_end|>", "</tool_call>")]
  sampler = RecordingSampler(Sampler(graphdef, max_cache_length=config.cache_length, stop_token_ids=stops,
                                     pad_id=TOK.pad_token_id))
  env = RecordingEnv(NousToolEnv([WikiSearchTool(BM25Index(PASSAGES), top_k=2)]))
  prompts = [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
             for q in ("Capital of France?", "Where is the Seine river, which city?", "Third city?")]
  batch = run_episodes(sampler, params, env, TOK, prompts, config, SamplingParams(temperature=1.0),
                       jax.random.key(1), samples_per_prompt=2, ground_truths=["Paris", "Paris", "Lyon"])
  B = batch.batch_size  # noqa: N806

  # Per row, rebuild the episode from the recordings: the segments it sampled and the observations the env
  # returned for them; the observation after a row's last turn is not part of the response.
  env_calls = env.calls[1:]  # the first call is the driver's up-front probe
  texts = [""] * B
  actions = [[] for _ in range(B)]
  taken = np.zeros(B, int)
  last_called = np.zeros(B, bool)  # did the row's last turn hold a tool call (per the env)?
  last_closed = np.zeros(B, bool)  # did it end on a stop token?
  for turn, (tokens, _, lengths) in enumerate(sampler.segments):
    rows = np.nonzero(lengths > 0)[0]
    seen, results = env_calls[turn]
    assert seen == [TOK.decode(tokens[b, :lengths[b]].tolist(), skip_special_tokens=False) for b in rows]
    for b, text, (observation, _, active) in zip(rows, seen, results):
      taken[b] += 1
      actions[b] += tokens[b, :lengths[b]].tolist()
      last_called[b], last_closed[b] = active, tokens[b, lengths[b] - 1] in stops
      last = taken[b] == batch.num_turns[b]
      texts[b] += text + ("" if last else observation)
  assert taken.tolist() == batch.num_turns.tolist()
  for b in range(B):
    n = int(batch.response_mask[b].sum())
    assert batch.response_text[b] == texts[b] == TOK.decode(batch.response_ids[b, :n].tolist())
    assert batch.response_ids[b, batch.action_mask[b] == 1].tolist() == actions[b]

  # Sampler log-probs at action positions = log_softmax of one full forward over [prompt, response].
  logits = policy(jnp.asarray(batch.input_ids), jnp.asarray(batch.attention_mask))
  logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))
  P = batch.prompt_length  # noqa: N806
  rows, cols = np.nonzero(batch.action_mask)
  reference = logp[rows, P + cols - 1, batch.response_ids[rows, cols]]
  np.testing.assert_allclose(batch.sampler_logprobs[rows, cols], reference, atol=1e-4, rtol=0)
  assert np.ptp(reference) > 0.5  # the check covers branch points, not only near-certain tokens

  # The episodes exercised both paths: searches that found Paris, and answers; reasons follow the turns.
  assert (batch.stop_reason == EpisodeStop.MAX_TURNS).any() and (batch.stop_reason == EpisodeStop.ANSWER).any()
  assert batch.num_tool_errors.sum() == 0
  assert any('Doc 1 (Title: "Paris")' in text for text in batch.response_text)
  for b in range(B):
    if last_called[b]:
      reason = EpisodeStop.MAX_TURNS
    else:  # (the chain is followed with high probability, not always: a garbled turn is an answer too)
      reason = EpisodeStop.ANSWER if last_closed[b] else EpisodeStop.TRUNCATED_TURN
    assert batch.stop_reason[b] == reason
    assert batch.action_mask[b, batch.last_action_index[b]] == 1
    if reason == EpisodeStop.MAX_TURNS:  # still calling tools: the reward slot is its last </tool_call>
      assert batch.num_tool_calls[b] == config.max_turns
      assert batch.response_ids[b, batch.last_action_index[b]] == stops[1]
      assert batch.token_level_rewards(np.ones(B))[b, batch.last_action_index[b]] == 1.0
