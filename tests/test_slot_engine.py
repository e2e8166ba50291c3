"""The slot engine (`rollout.slot_engine`) against the lockstep driver, on a tiny random Qwen2 in float32.

The policy is steered, so episodes have a known shape while every token and log-prob is still the real network's:
`add_token_chain` makes the token after a steering letter start a fixed chain, and the env ends each observation
with the letter of the next turn. After

  C  the model calls `paris`, R  `rome`, B  `bad` (a tool error), A  answers, S  branches (any of the four, chosen
     by the network's context-dependent logits), X  writes whatever the random network writes (a turn that usually
     runs out of its budget);

and the env answers `paris` -> R, `rome` -> B, `bad` -> A. So a C episode calls paris, rome, bad and then answers
(MAX_TURNS at max_turns = 3), R three turns, B two, A one. In this tokenizer `</tool_call>` is three tokens
(`</`, `tool`, `_call>`): every call turn ends on a multi-token stop sequence, which a chunk of 1 or 2 tokens
splits across chunks.

References are independent of the code under test: the lockstep driver (`run_episodes`) for greedy decoding, and
for sampling another run of the slot engine with other slot counts and chunk sizes (schedule independence), plus
the chain's known turn lengths.
"""

from __future__ import annotations

import threading
import time
import zlib

import jax
import numpy as np
import pytest
from flax import nnx

from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.rollout import (EpisodeStop, RolloutConfig, TrajectoryBatch, run_episodes, run_slot_episodes,
                                  stop_strings)
from agent_r1_jax.sampling import Sampler, SamplingParams
from agent_r1_jax.sampling.slots import compiled_slot_programs
from scripted_policy import QWEN_SPECIALS, add_token_chain, byte_tokenizer, chain_bonus, merge_bonus

CALL_TAIL = '"}}'
CLOSE = ("</", "tool", "_call>")  # `</tool_call>` as three ordinary pieces
QUERIES = ("paris", "rome", "bad")
TOK = byte_tokenizer(tuple(s for s in QWEN_SPECIALS if s != "</tool_call>"), pieces=(CALL_TAIL, *QUERIES, *CLOSE))
PAD = TOK.pad_token_id
GREEDY = SamplingParams(greedy=True)
SAMPLED = SamplingParams(temperature=1.0)
NEXT_STEER = {"paris": "R", "rome": "B", "bad": "A"}
RESULTS = {"paris": "Paris is the capital of France.", "rome": "Rome is in Italy, on the Tiber river.",
           "bad": "Error: the search service failed"}
CALL_TOKENS = 1 + 1 + len(CLOSE)  # query, tail, the three closing pieces
ANSWER = "<answer>lyon</answer><|im_end|>"


def ids(text: str) -> list[int]:
  return TOK.encode(text, add_special_tokens=False)


def one(text: str) -> int:
  (token,) = ids(text)
  return token


def observation_text(content: str, steer: str) -> str:
  return (f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n"
          f"<|im_start|>assistant\n{steer}")


class SteerEnv:
  """A turn that closes `</tool_call>` is a call of the last query it names (an unknown one is an error); anything
  else is a final answer. The observation ends with the next turn's steering letter."""

  def __init__(self):
    self.seen: list[list[str]] = []

  @staticmethod
  def step(text: str) -> tuple[str, list[bool], bool]:
    if not text.endswith("</tool_call>"):
      return "", [], False
    named = [q for q in QUERIES if q in text]
    if not named:
      return observation_text("Error: no query", "A"), [False], True
    query = max(named, key=text.rindex)
    return observation_text(RESULTS[query], NEXT_STEER[query]), [query != "bad"], True

  def batch_step(self, texts):
    self.seen.append(list(texts))
    return [self.step(t) for t in texts]


class SlowEnv(SteerEnv):
  """SteerEnv whose every call sleeps 0-40 ms (fixed by the texts), so tool calls return out of order."""

  def batch_step(self, texts):
    time.sleep((zlib.crc32("".join(texts).encode()) % 41) / 1000)
    return super().batch_step(texts)


class GateEnv(SteerEnv):
  """A `paris` call does not return before another env call has arrived (or 60 s have passed): only an engine
  that keeps decoding other rows while a tool runs gets that second call in."""

  def __init__(self):
    super().__init__()
    self.other_call = threading.Event()
    self.overlapped = None

  def batch_step(self, texts):
    if any("paris" in t for t in texts):
      self.overlapped = self.other_call.wait(timeout=60)
    else:
      self.other_call.set()
    return super().batch_step(texts)


def build_policy():
  """(graphdef, params) of the steered tiny policy (also built by the two-process test's workers)."""
  config = Qwen2Config(vocab_size=len(TOK), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16)
  model = Qwen2ForCausalLM(config, rngs=nnx.Rngs(0))
  tail = [one(CALL_TAIL)] + [one(p) for p in CLOSE]
  bonus = merge_bonus(
      {one(s): {one(q): 12.0} for s, q in (("C", "paris"), ("R", "rome"), ("B", "bad"))},
      {one(q): {one(CALL_TAIL): 12.0} for q in QUERIES},
      chain_bonus(tail, 12.0),
      {one("A"): {one("<answer>"): 12.0}},
      chain_bonus(ids(ANSWER), 12.0),
      {one("S"): {one("paris"): 12.0, one("rome"): 12.0, one("bad"): 12.0, one("<answer>"): 12.0}})
  add_token_chain(model, bonus, block_gain=4.0)
  graphdef, params = nnx.split(model)
  return graphdef, params


@pytest.fixture(scope="module")
def policy():
  return build_policy()


def prompt(i: int, steer: str, filler: int = 0) -> str:
  return f"<|im_start|>user\nquestion {i}{'?' * filler}<|im_end|>\n<|im_start|>assistant\n{steer}"


# Greedy episodes: every steer, and a C episode behind a long prompt that reaches the context limit.
GREEDY_PROMPTS = [prompt(0, "C"), prompt(1, "R"), prompt(2, "B"), prompt(3, "A"), prompt(4, "X"), prompt(5, "S"),
                  prompt(6, "C", filler=30), prompt(7, "R", filler=10)]


def rollout_config() -> RolloutConfig:
  short = len(ids(GREEDY_PROMPTS[0]))
  # Room for a whole C episode of the shortest prompt, not of the long one.
  c_episode = (3 * CALL_TOKENS + sum(len(ids(observation_text(RESULTS[q], "x"))) for q in ("paris", "rome")))
  return RolloutConfig(max_prompt_length=64, max_response_length=200, max_turns=3, max_new_tokens_per_turn=12,
                       max_context_length=short + c_episode + 20)


def make_sampler(graphdef, config: RolloutConfig, mesh=None) -> Sampler:
  return Sampler(graphdef, max_cache_length=config.cache_length, pad_id=PAD, mesh=mesh,
                 stop_sequences=stop_strings.turn_stop_sequences(TOK, False))


def assert_same_trajectories(got, want, *, logprob_atol: float) -> None:
  for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "action_mask", "last_action_index",
               "turn_last_action_index", "process_rewards", "group_ids", "num_turns", "num_tool_calls",
               "num_tool_errors", "stop_reason"):
    np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
  np.testing.assert_allclose(got.sampler_logprobs, want.sampler_logprobs, atol=logprob_atol, rtol=0)
  assert got.response_text == want.response_text
  assert got.ground_truth == want.ground_truth and got.data_source == want.data_source


def turn_lengths(batch, b: int) -> list[int]:
  """Action tokens of each turn of row b (turns are the action runs between observations)."""
  mask = batch.action_mask[b, :batch.response_mask[b].sum()]
  edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
  return (edges[1::2] - edges[::2]).tolist()


@pytest.mark.parametrize("slots,chunk", [(3, 1), (8, 2), (11, 16)])
def test_greedy_equals_the_lockstep_driver(policy, slots, chunk):
  """Fewer slots than episodes, as many, more; chunks of 1 and 2 tokens (every `</tool_call>` split across chunks)
  and of 16 (longer than any turn)."""
  graphdef, params = policy
  config = rollout_config()
  sampler = make_sampler(graphdef, config)
  truths = [f"gold {i}" for i in range(len(GREEDY_PROMPTS))]

  def reward(turn, rows, texts, results):  # depends on the turn, the row and the tool's outcome
    return [turn + 0.1 * r + (0.5 if ok and ok[0] else 0.0) for r, (_, ok, _) in zip(rows, results)]

  kwargs = dict(ground_truths=truths, data_sources=["hotpotqa"] * len(truths), group_offset=5,
                process_reward_fn=reward)
  want = run_episodes(sampler, params, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY, jax.random.key(0), **kwargs)
  # The reference covers what the equality must hold for: multi-turn calls, tool errors, each ending.
  assert want.num_turns.tolist()[:4] == [3, 3, 2, 1]
  assert (want.num_tool_errors > 0).sum() >= 3
  reasons = set(want.stop_reason.tolist())
  assert {EpisodeStop.MAX_TURNS, EpisodeStop.ANSWER, EpisodeStop.CONTEXT_LIMIT} <= reasons, reasons
  assert want.stop_reason[6] == EpisodeStop.CONTEXT_LIMIT and want.stop_reason[0] == EpisodeStop.MAX_TURNS
  # Every call turn stopped on the three-token `</tool_call>` (CALL_TOKENS, not the 12-token budget).
  assert turn_lengths(want, 0) == [CALL_TOKENS] * 3

  got = run_slot_episodes(sampler, params, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY, jax.random.key(0),
                          slots_per_device=slots, decode_chunk=chunk, **kwargs)
  assert_same_trajectories(got, want, logprob_atol=2e-5)
  assert got.stats["slots"] == slots and 0 < got.stats["slot_occupancy"] <= 1
  assert 0 <= got.timings["tools_blocked"] <= got.timings["total"]
  assert got.metrics()["rollout/slot_occupancy"] == got.stats["slot_occupancy"]


def test_slots_on_a_mesh_equal_the_single_device_lockstep_driver(policy):
  """On a (data 2, fsdp 2, tensor 2) mesh of 8 CPU devices, 1 slot per batch device: 4 slots, rows over data x
  fsdp, KV heads over tensor; the greedy episodes are the single-device lockstep driver's."""
  from agent_r1_jax.models import make_mesh, state_shardings  # pylint: disable=import-outside-toplevel
  graphdef, params = policy
  config = rollout_config()
  want = run_episodes(make_sampler(graphdef, config), params, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY,
                      jax.random.key(0))
  mesh = make_mesh(data=2, fsdp=2, tensor=2)
  sharded = jax.device_put(params, state_shardings(params, mesh))
  sampler = Sampler(graphdef, max_cache_length=config.cache_length, pad_id=PAD, mesh=mesh,
                    stop_sequences=stop_strings.turn_stop_sequences(TOK, False))
  got = run_slot_episodes(sampler, sharded, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY, jax.random.key(0),
                          slots_per_device=1, decode_chunk=3)
  assert got.stats["slots"] == 4
  assert_same_trajectories(got, want, logprob_atol=2e-5)


def test_one_slot_decodes_every_chunk_and_compiles_once_per_bucket(policy):
  """One slot for four episodes: the slot is always decoding or waiting, so occupancy is 1; a second rollout of the
  same shapes compiles nothing."""
  graphdef, params = policy
  config = rollout_config()
  sampler = make_sampler(graphdef, config)
  prompts = GREEDY_PROMPTS[:4]
  want = run_episodes(sampler, params, SteerEnv(), TOK, prompts, config, GREEDY, jax.random.key(0))
  run = lambda: run_slot_episodes(sampler, params, SteerEnv(), TOK, prompts, config, GREEDY,  # noqa: E731
                                  jax.random.key(0), slots_per_device=1, decode_chunk=4)
  got = run()
  assert_same_trajectories(got, want, logprob_atol=2e-5)
  assert got.stats["slot_occupancy"] == 1.0
  # Chunks needed: each turn takes ceil(length / 4) chunks of its own (one slot: turns never share a chunk).
  turns = [n for b in range(4) for n in turn_lengths(want, b)]
  assert got.stats["decode_chunks"] == sum(-(-n // 4) for n in turns)
  before = compiled_slot_programs()
  again = run()
  assert compiled_slot_programs() == before
  assert_same_trajectories(again, got, logprob_atol=0)


SAMPLED_PROMPTS = [prompt(0, "S"), prompt(1, "X"), prompt(2, "C"), prompt(3, "S", filler=7)]


@pytest.mark.slow
def test_sampling_is_the_same_for_any_slot_count_and_chunk(policy):
  """Temperature 1, 4 prompts x 3 samples: runs with 1, 5, 12 and 16 slots and chunks of 1, 3, 7 and 32 sample the
  same episodes (the log-probs of one token may differ by rounding between batch shapes; printed)."""
  graphdef, params = policy
  config = rollout_config()
  sampler = make_sampler(graphdef, config)
  runs = {}
  for slots, chunk in ((1, 7), (5, 1), (12, 3), (16, 32)):
    runs[slots, chunk] = run_slot_episodes(sampler, params, SteerEnv(), TOK, SAMPLED_PROMPTS, config, SAMPLED,
                                           jax.random.key(3), samples_per_prompt=3, slots_per_device=slots,
                                           decode_chunk=chunk)
  first = runs[1, 7]
  # Samples of one prompt differ (the draws are random), and the S rows took more than one branch.
  assert len({first.response_text[b] for b in range(3)}) > 1
  assert len({first.response_text[b][:8] for b in (0, 1, 2, 9, 10, 11)}) > 1
  for key, batch in runs.items():
    diff = np.abs(batch.sampler_logprobs - first.sampler_logprobs).max()
    print(f"slots, chunk = {key}: max |log-prob difference| to (1, 7) = {diff:.2e}")
    assert_same_trajectories(batch, first, logprob_atol=2e-5)
  # Another key samples other episodes: the equality above is not that of a deterministic policy.
  other = run_slot_episodes(sampler, params, SteerEnv(), TOK, SAMPLED_PROMPTS, config, SAMPLED, jax.random.key(4),
                            samples_per_prompt=3, slots_per_device=5, decode_chunk=3)
  assert other.response_text != first.response_text


def test_episodes_are_keyed_by_their_global_row(policy):
  """Two calls over consecutive shares of the prompts, each with the global group_offset of its first prompt (as the
  processes of a multi-process run call it), sample the episodes of one call over all prompts; an explicit
  episode_offset does the same without shifting the group ids."""
  graphdef, params = policy
  config = rollout_config()
  sampler = make_sampler(graphdef, config)
  run = lambda prompts, **kw: run_slot_episodes(  # noqa: E731
      sampler, params, SteerEnv(), TOK, prompts, config, SAMPLED, jax.random.key(3), samples_per_prompt=3,
      slots_per_device=5, decode_chunk=3, check_env=False, **kw)
  whole = run(SAMPLED_PROMPTS)
  first, rest = run(SAMPLED_PROMPTS[:1]), run(SAMPLED_PROMPTS[1:], group_offset=1)
  assert_same_trajectories(TrajectoryBatch.concatenate([first, rest]), whole, logprob_atol=2e-5)
  explicit = run(SAMPLED_PROMPTS[1:], episode_offset=3)
  assert explicit.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
  explicit.group_ids = rest.group_ids
  # Same episodes, token for token; the log-probs only to rounding, since which rows decode together (the width of
  # the compacted chunks) can follow the tool threads' timing (on an Intel Xeon: 1e-6 in one of 1800).
  assert_same_trajectories(explicit, rest, logprob_atol=2e-5)
  # Without an offset the same rows draw the first rows' keys: other episodes (the offset is what matched above).
  assert run(SAMPLED_PROMPTS[1:]).response_text != rest.response_text


def test_tool_latency_changes_nothing(policy):
  """Tools that sleep 0-40 ms return out of order and slots wait on them; the episodes are the same (sampled, and
  greedy against the lockstep driver). The log-probs may differ by rounding: which rows decode together changes
  with the tools' timing, and with it the width of the compacted chunks (`SlotDecoder.compact_width`)."""
  graphdef, params = policy
  config = rollout_config()
  sampler = make_sampler(graphdef, config)
  common = dict(samples_per_prompt=3, slots_per_device=5, decode_chunk=3)
  fast = run_slot_episodes(sampler, params, SteerEnv(), TOK, SAMPLED_PROMPTS, config, SAMPLED, jax.random.key(3),
                           **common)
  slow = run_slot_episodes(sampler, params, SlowEnv(), TOK, SAMPLED_PROMPTS, config, SAMPLED, jax.random.key(3),
                           **common)
  assert_same_trajectories(slow, fast, logprob_atol=2e-5)
  assert slow.timings["tools"] > 0 and slow.timings["tools_blocked"] <= slow.timings["total"]
  want = run_episodes(sampler, params, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY, jax.random.key(0))
  got = run_slot_episodes(sampler, params, SlowEnv(), TOK, GREEDY_PROMPTS, config, GREEDY, jax.random.key(0),
                          slots_per_device=3, decode_chunk=2)
  assert_same_trajectories(got, want, logprob_atol=2e-5)


def test_other_slots_decode_while_a_tool_runs(policy):
  """Episode 0 calls `paris` after 5 tokens, episode 1 answers after 7: the paris call only returns once the answer
  has reached the env, so the engine must decode episode 1 while episode 0's tool runs (a driver that waits for
  its tools first would time out here, and the test would fail on `overlapped`)."""
  graphdef, params = policy
  config = rollout_config()
  sampler = make_sampler(graphdef, config)
  env = GateEnv()
  batch = run_slot_episodes(sampler, params, env, TOK, [prompt(0, "C"), prompt(1, "A")], config, GREEDY,
                            jax.random.key(0), slots_per_device=2, decode_chunk=1, check_env=False)
  assert env.overlapped is True
  assert env.seen[:2] == [[ANSWER], ["paris" + CALL_TAIL + "</tool_call>"]]  # the answer got in first
  assert batch.stop_reason.tolist() == [EpisodeStop.MAX_TURNS, EpisodeStop.ANSWER]


def test_bad_arguments_fail_before_anything_runs(policy):
  graphdef, params = policy
  config = rollout_config()
  sampler = make_sampler(graphdef, config)
  before = compiled_slot_programs()
  for kwargs, message in ((dict(slots_per_device=0, decode_chunk=4), "slots_per_device must be a positive"),
                          (dict(slots_per_device=2, decode_chunk=0), "decode_chunk must be a positive"),
                          (dict(slots_per_device=2, decode_chunk=4, tool_workers=0), "tool_workers must be"),
                          (dict(slots_per_device=2, decode_chunk=4, tool_poll_s=0), "tool_poll_s must be"),
                          (dict(slots_per_device=2, decode_chunk=4, episode_offset=-1), "episode_offset must be")):
    with pytest.raises(ValueError, match=message):
      run_slot_episodes(sampler, params, SteerEnv(), TOK, GREEDY_PROMPTS, config, GREEDY, jax.random.key(0),
                        **kwargs)
  with pytest.raises(ValueError, match="prompt"):
    run_slot_episodes(sampler, params, SteerEnv(), TOK, ["x" * 80], config, GREEDY, jax.random.key(0),
                      slots_per_device=2, decode_chunk=4)
  assert compiled_slot_programs() == before
