"""Parallel tool calls end to end: the trainer's sampler (learner.build.build_sampler) on a tiny Qwen2 made to write
two tool calls in one turn, the rollout driver and NousToolEnv; and the up-front check that the sampler's stop
tokens fit the env's setting.

The policy is a random model edited with `add_token_chain` (greedy decoding), so after the assistant header it
writes, token by token,

  <tool_call>  CALL1_BODY  </tool_call>  CALL2  <|im_end|>

where `<tool_call>` / `</tool_call>` / `<|im_end|>` are the real special tokens and CALL1_BODY, CALL2 are single
added tokens: CALL2 is the whole second call (`\\n<tool_call>\\n{...}\\n</tool_call>` as text), because a chain
cannot give the same source token (`<tool_call>`) two different successors. The sampler stops on the real
special tokens only, which is what is under test.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.envs import NousToolEnv
from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.rollout import EpisodeStop, run_episodes, stop_strings, validation
from scripted_policy import add_token_chain, byte_tokenizer, chain_bonus
from agent_r1_jax.sampling import SamplingParams
from agent_r1_jax.tools import BaseTool, ToolResult
from agent_r1_jax.learner import build
from agent_r1_jax.trainer.config import base_config

CALL1_BODY = '\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
CALL2 = '\n<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}}\n</tool_call>'
TOK = byte_tokenizer(pieces=(CALL1_BODY, CALL2))
PROMPT = "<|im_start|>user\nAdd 2 and 3, then echo hi.<|im_end|>\n<|im_start|>assistant\n"


def tid(token: str) -> int:
  return int(TOK.convert_tokens_to_ids(token))


def ids(text: str) -> list[int]:
  return TOK.encode(text, add_special_tokens=False)


OPEN, CLOSE, IM_END = tid("<tool_call>"), tid("</tool_call>"), tid("<|im_end|>")
TURN = [OPEN, tid(CALL1_BODY), CLOSE, tid(CALL2), IM_END]  # what the policy writes after "\n"


class AddTool(BaseTool):
  name = "add"
  description = "Add two integers."
  parameters = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"]}

  def execute(self, args):
    return ToolResult(str(args["a"] + args["b"]), True)


class EchoTool(BaseTool):
  name = "echo"
  description = "Echo a text."
  parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

  def execute(self, args):
    return ToolResult(args["text"], True)


class RecordingSampler:
  """Forwards to the real sampler and keeps every segment's tokens (copied)."""

  def __init__(self, sampler):
    self.inner = sampler
    self.max_cache_length = sampler.max_cache_length
    self.stop_token_ids = sampler.stop_token_ids
    self.segments = []

  def prefill(self, *args):
    return self.inner.prefill(*args)

  def _keep(self, out):
    state, seg = out
    self.segments.append([np.asarray(seg.tokens)[b, :n].tolist() for b, n in enumerate(np.asarray(seg.lengths))])
    return state, seg

  def decode(self, *args):
    return self._keep(self.inner.decode(*args))

  def continue_(self, *args):
    return self._keep(self.inner.continue_(*args))


def _config(parallel: bool):
  c = base_config("grpo", "tiny")
  c.env.parallel_tool_calls = parallel
  c.rollout.update(dict(max_turns=2, max_prompt_length=64, max_new_tokens_per_turn=8, max_response_length=192,
                        max_context_length=256, max_observation_tokens=None))
  return c


@pytest.fixture(scope="module")
def policy():
  config = Qwen2Config(vocab_size=len(TOK), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16)
  model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))
  add_token_chain(model, chain_bonus([ids("\n")[0]] + TURN, 20.0))
  return nnx.split(model)


def _rollout(policy, parallel: bool):
  graphdef, params = policy
  c = _config(parallel)
  rcfg = build.rollout_config(c, TOK)
  sampler = RecordingSampler(build.build_sampler(c, graphdef, TOK, rcfg, build.build_mesh(c)))
  env = NousToolEnv([AddTool(), EchoTool()], parallel_tool_calls=c.env.parallel_tool_calls)
  batch = run_episodes(sampler, params, env, TOK, [PROMPT], rcfg, SamplingParams(greedy=True), jax.random.key(0),
                       samples_per_prompt=2)
  return sampler, batch


def _check_layout(batch, turn: list[int], observation: str):
  """Every row: turn, observation (mask 0), turn, then padding; the last turn's observation is not appended."""
  obs = ids(observation)
  expected_ids = turn + obs + turn
  expected_action = [1] * len(turn) + [0] * len(obs) + [1] * len(turn)
  n = len(expected_ids)
  for b in range(batch.batch_size):
    assert batch.response_ids[b, :n].tolist() == expected_ids
    assert batch.action_mask[b].tolist() == expected_action + [0] * (batch.response_length - n)
    assert batch.response_mask[b].tolist() == [1] * n + [0] * (batch.response_length - n)
    assert TOK.decode(batch.response_ids[b, len(turn):len(turn) + len(obs)].tolist()) == observation
  assert (batch.num_turns == 2).all() and (batch.stop_reason == EpisodeStop.MAX_TURNS).all()
  assert (batch.num_tool_errors == 0).all()


def test_parallel_calls_share_one_turn_and_one_observation(policy):
  """Defects caught: a parallel-calls sampler that still stops on </tool_call> (the turn would end after the
  first call), an env running only the first call or answering in separate turns or out of call order, and an
  action mask that covers observation tokens or misses sampled ones."""
  sampler, batch = _rollout(policy, parallel=True)
  assert tid("</tool_call>") not in sampler.stop_token_ids and IM_END in sampler.stop_token_ids
  # One segment per turn, each holding both calls and ending on the turn end.
  assert sampler.segments == [[TURN, TURN], [TURN, TURN]]
  text = TOK.decode(TURN)
  assert text.count("<tool_call>") == 2 and text.count("</tool_call>") == 2 and text.endswith("<|im_end|>")
  # The turn closed itself, so the observation opens no second <|im_end|>; results in call order: add, echo.
  observation = ("\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\nhi\n</tool_response>"
                 "<|im_end|>\n<|im_start|>assistant\n")
  _check_layout(batch, TURN, observation)
  assert (batch.num_tool_calls == 4).all()  # two calls in each of two turns


def test_without_parallel_calls_the_same_policy_stops_after_the_first_call(policy):
  """Defect caught: a one-call-per-turn sampler that does not stop on </tool_call> (the segment would run on into
  the second call, which the env then ignores while the policy is trained on it)."""
  sampler, batch = _rollout(policy, parallel=False)
  first_call = TURN[:3]  # <tool_call> body </tool_call>
  assert sampler.segments == [[first_call, first_call], [first_call, first_call]]
  observation = ("<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
                 "<|im_start|>assistant\n")
  _check_layout(batch, first_call, observation)
  assert (batch.num_tool_calls == 2).all()


def test_check_sampler_refuses_stop_tokens_that_do_not_fit_the_env(policy):
  """Defects caught: a check that lets a parallel-calls env run with a sampler stopping on </tool_call> (a turn
  could never hold a second call) or a one-call env with a sampler that does not stop there."""
  graphdef, params = policy
  special = stop_strings.standalone_ids(TOK)
  samplers = {}
  for parallel in (True, False):
    c = _config(parallel)
    rcfg = build.rollout_config(c, TOK)
    samplers[parallel] = build.build_sampler(c, graphdef, TOK, rcfg, build.build_mesh(c))
  for parallel in (True, False):  # each sampler fits its own setting
    validation.check_sampler(samplers[parallel], rcfg, special, parallel_tool_calls=parallel)
  with pytest.raises(ValueError, match="parallel tool calls but the sampler stops on </tool_call>"):
    validation.check_sampler(samplers[False], rcfg, special, parallel_tool_calls=True)
  with pytest.raises(ValueError, match=r"lack </tool_call>"):
    validation.check_sampler(samplers[True], rcfg, special, parallel_tool_calls=False)
  # The driver takes the setting from the env, and refuses before generating anything.
  for parallel in (True, False):
    env = NousToolEnv([AddTool(), EchoTool()], parallel_tool_calls=parallel)
    with pytest.raises(ValueError, match="</tool_call>"):
      run_episodes(samplers[not parallel], params, env, TOK, [PROMPT], rcfg, SamplingParams(greedy=True),
                   jax.random.key(0))
