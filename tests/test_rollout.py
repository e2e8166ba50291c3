"""Rollout driver and TrajectoryBatch, against a scripted policy and a scripted tool env.

The scripted policy implements the sampler contract (prefill / decode / continue_ with per-row budgets and
stop ids) but emits fixed token sequences, and it records everything it was handed, so tests check the
driver against what actually happened: the context each row accumulated, the (token, log-prob) pairs it
produced. Expected layouts are built by hand or by a plain-Python per-row loop written here.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import jax
import numpy as np
import pytest

from agent_r1_jax.rollout import EpisodeStop, RolloutConfig, TrajectoryBatch, run_episodes, run_episodes_in_waves
from scripted_policy import byte_tokenizer
from agent_r1_jax.sampling import multihost

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")


def fake_logprob(row: int, position: int, token: int) -> float:
  """A deterministic stand-in for log pi(token | context) that differs per row, position and token."""
  return -((row * 7919 + position * 104729 + token * 31) % 997 + 1) / 1000.0


@dataclasses.dataclass
class FakeState:
  lengths: np.ndarray


@dataclasses.dataclass
class FakeSegment:
  tokens: np.ndarray
  logprobs: np.ndarray
  lengths: np.ndarray
  stop_reasons: np.ndarray


class ScriptedSampler:
  """Row b emits `scripts[b][k]` at its k-th sampled turn, cut after the first stop id or at the budget."""

  def __init__(self, scripts: Sequence[Sequence[Sequence[int]]], stop_token_ids: Sequence[int], pad_id: int,
               max_cache_length: int):
    self.scripts = [[list(turn) for turn in row] for row in scripts]
    self.stop_token_ids = tuple(stop_token_ids)
    self.pad_id = pad_id
    self.max_cache_length = max_cache_length
    self.calls: list[tuple[str, np.ndarray]] = []  # (kind, budgets)
    self.contexts: list[list[int]] = []
    self.emitted: list[list[tuple[int, float]]] = []
    self.turn: list[int] = []

  def prefill(self, params, prompt_ids: np.ndarray, prompt_mask: np.ndarray) -> FakeState:
    del params
    assert prompt_ids.dtype == np.int32 and prompt_ids.shape == prompt_mask.shape
    for row in prompt_mask:  # left padding: the mask is 0...0 1...1
      assert np.all(np.diff(row) >= 0)
    self.calls.append(("prefill", np.zeros(0)))
    self.contexts = [ids[mask == 1].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
    self.emitted = [[] for _ in self.contexts]
    self.turn = [0] * len(self.contexts)
    return FakeState(np.asarray([len(c) for c in self.contexts], np.int32))

  def decode(self, params, state, budgets, sampling, rng):
    self.calls.append(("decode", np.asarray(budgets).copy()))
    return self._sample(budgets)

  def _sample(self, budgets):
    budgets = np.asarray(budgets)
    assert budgets.dtype == np.int32 and budgets.shape == (len(self.contexts),)
    width = int(budgets.max()) + 3  # wider than any segment: the driver must use `lengths`
    tokens = np.full((len(budgets), width), self.pad_id, np.int32)
    logprobs = np.zeros((len(budgets), width), np.float32)
    lengths = np.zeros(len(budgets), np.int32)
    reasons = np.zeros(len(budgets), np.int32)
    for b, budget in enumerate(budgets.tolist()):
      if budget == 0:
        continue
      assert len(self.contexts[b]) + budget <= self.max_cache_length, "budget overflows the cache"
      script = self.scripts[b][self.turn[b]]
      self.turn[b] += 1
      cut = next((i + 1 for i, t in enumerate(script) if t in self.stop_token_ids), None)
      if cut is not None and cut <= budget:
        out, reasons[b] = script[:cut], 1
      else:
        assert len(script) >= budget, "test scripts must be long enough to fill the budget"
        out, reasons[b] = script[:budget], 2
      for token in out:
        lp = fake_logprob(b, len(self.contexts[b]), token)
        self.emitted[b].append((token, lp))
        logprobs[b, lengths[b]] = lp
        tokens[b, lengths[b]] = token
        lengths[b] += 1
        self.contexts[b].append(token)
    return FakeState(np.asarray([len(c) for c in self.contexts], np.int32)), FakeSegment(
        tokens, logprobs, lengths, reasons)

  def extend(self, params, state, tokens):
    del params, state
    assert len(tokens) == len(self.contexts)
    for b, ids in enumerate(tokens):
      self.contexts[b].extend(int(t) for t in ids)
    return FakeState(np.asarray([len(c) for c in self.contexts], np.int32))

  def continue_(self, params, state, tokens, budgets, sampling, rng):
    self.calls.append(("continue", np.asarray(budgets).copy()))
    for b, ids in enumerate(tokens):
      assert not ids or budgets[b] > 0, "observation sent to a finished row"
    self.extend(params, state, tokens)
    return self._sample(budgets)


def observation_text(content: str) -> str:
  """The Qwen2.5 framing of one tool response after an assistant turn that ended on </tool_call>."""
  return (f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n"
          f"<|im_start|>assistant\n")


class ScriptedEnv:
  """A Nous-like env: text inside <tool_call>...</tool_call> is the query; the result echoes it.

  `q=bad` fails (success False); `q=long` returns a long result; no tool call means a final answer.
  """

  def __init__(self):
    self.seen: list[list[str]] = []
    self.returned: list[list[tuple[str, list[bool], bool]]] = []

  @staticmethod
  def step(text: str) -> tuple[str, list[bool], bool]:
    if "<tool_call>" not in text or "</tool_call>" not in text:
      return "", [], False
    query = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
    if query == "q=bad":
      return observation_text("Error: bad query"), [False], True
    if query == "q=long":
      return observation_text("x" * 120), [True], True
    return observation_text(f"result for {query}"), [True], True

  def batch_step(self, texts):
    self.seen.append(list(texts))
    out = [self.step(t) for t in texts]
    self.returned.append(out)
    return out


# ---------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------
TOK = byte_tokenizer(SPECIALS)
PAD = TOK.pad_token_id
IM_END, CALL_CLOSE, EOT = (TOK.convert_tokens_to_ids(t) for t in ("<|im_end|>", "</tool_call>", "<|endoftext|>"))
STOPS = (IM_END, CALL_CLOSE, EOT)


def enc(text: str) -> list[int]:
  return TOK.encode(text, add_special_tokens=False)


def call(query: str, think: str = "I search.") -> str:
  return f"{think}<tool_call>{query}</tool_call>"


ANSWER = "<answer>Paris</answer><|im_end|>"
RAMBLE = "and so on " * 40  # no stop token: fills any budget


def prompt_text(i: int) -> str:
  return f"<|im_start|>user\nquestion {'?' * (3 * i)}<|im_end|>\n<|im_start|>assistant\n"


def rollout(scripts_text, config, *, prompts=None, samples=1, env=None, **kwargs):
  """Runs the driver on scripted rows; `scripts_text[b]` lists row b's turns as text."""
  prompts = prompts if prompts is not None else [prompt_text(i) for i in range(len(scripts_text) // samples)]
  sampler = ScriptedSampler([[enc(t) for t in row] for row in scripts_text], STOPS, PAD, config.cache_length)
  env = env or ScriptedEnv()
  batch = run_episodes(sampler, None, env, TOK, prompts, config, None, jax.random.key(0),
                       samples_per_prompt=samples, **kwargs)
  return batch, sampler, env


def row_response(batch: TrajectoryBatch, b: int) -> list[int]:
  return batch.response_ids[b, :batch.response_mask[b].sum()].tolist()


def check_invariants(batch: TrajectoryBatch, sampler: ScriptedSampler) -> None:
  """Properties every batch must have, whatever the scripts and limits."""
  B, R = batch.response_ids.shape  # noqa: N806
  for b in range(B):
    n = int(batch.response_mask[b].sum())
    # Real tokens are a prefix; padding is the pad id with every mask 0.
    assert batch.response_mask[b, :n].all() and not batch.response_mask[b, n:].any()
    assert (batch.response_ids[b, n:] == PAD).all() and not batch.action_mask[b, n:].any()
    assert np.all(batch.action_mask[b] <= batch.response_mask[b])
    # Action tokens are exactly what the policy emitted, in order, with its log-probs.
    actions = np.nonzero(batch.action_mask[b])[0]
    emitted = sampler.emitted[b]
    assert batch.response_ids[b, actions].tolist() == [t for t, _ in emitted]
    np.testing.assert_array_equal(batch.sampler_logprobs[b, actions], np.float32([lp for _, lp in emitted]))
    assert not batch.sampler_logprobs[b, batch.action_mask[b] == 0].any()
    # The reward slot is the last action token; the sampler saw prompt + response up to it, nothing more.
    assert batch.last_action_index[b] == actions[-1]
    prompt = batch.prompt_ids[b, batch.prompt_mask[b] == 1].tolist()
    assert sampler.contexts[b] == prompt + batch.response_ids[b, :actions[-1] + 1].tolist()
    assert batch.stop_reason[b] != EpisodeStop.NONE
    taken = batch.turn_last_action_index[b][batch.turn_last_action_index[b] >= 0]
    assert len(taken) == batch.num_turns[b] and np.all(batch.action_mask[b, taken] == 1)
  # Text fields are the decoding of the ids (special tokens kept).
  assert batch.response_text == [TOK.decode(row_response(batch, b), skip_special_tokens=False) for b in range(B)]


def reference_row(prompt: list[int], script: list[str], config: RolloutConfig) -> dict:
  """The driver's semantics for one row, as a plain Python loop over turns."""
  R, T, C = config.max_response_length, config.max_turns, config.context_limit  # noqa: N806
  resp, act, turn_last = [], [], []
  calls = errors = 0
  reason = None
  for t in range(T):
    budget = min(config.max_new_tokens_per_turn, R - len(resp), C - len(prompt) - len(resp))
    seq = enc(script[t])
    cut = next((i + 1 for i, tok in enumerate(seq) if tok in STOPS), None)
    closed = cut is not None and cut <= budget
    out = seq[:cut] if closed else seq[:budget]
    resp += out
    act += [1] * len(out)
    turn_last.append(len(resp) - 1)
    if closed and out[-1] in config.end_of_text_ids:
      reason = EpisodeStop.EOS
      break
    obs, successes, active = ScriptedEnv.step(TOK.decode(out, skip_special_tokens=False))
    calls += len(successes)
    errors += successes.count(False)
    if not active:
      if closed:
        reason = EpisodeStop.ANSWER
      elif len(resp) >= R:
        reason = EpisodeStop.RESPONSE_BUDGET
      elif len(prompt) + len(resp) >= C:
        reason = EpisodeStop.CONTEXT_LIMIT
      else:
        reason = EpisodeStop.TRUNCATED_TURN
      break
    if t == T - 1:
      reason = EpisodeStop.MAX_TURNS
      break
    ids = enc(obs)
    cap, tail = config.max_observation_tokens, config.observation_tail_tokens
    if cap is not None and len(ids) > cap:
      ids = ids[:cap - tail] + (ids[-tail:] if tail else [])
    room_r, room_c = R - len(resp), C - len(prompt) - len(resp)
    if len(ids) >= min(room_r, room_c):
      kept = ids[:min(room_r, room_c)]
      resp += kept
      act += [0] * len(kept)
      reason = EpisodeStop.RESPONSE_BUDGET if room_r <= room_c else EpisodeStop.CONTEXT_LIMIT
      break
    resp += ids
    act += [0] * len(ids)
  return dict(response=resp, action=act, turns=len(turn_last), turn_last=turn_last, calls=calls,
              errors=errors, reason=reason)


# ---------------------------------------------------------------------------------------------------------
# Layout, masks, groups (hand-computed)
# ---------------------------------------------------------------------------------------------------------


def test_two_turn_layout_hand_computed():
  config = RolloutConfig(max_prompt_length=64, max_response_length=200, max_turns=3, max_new_tokens_per_turn=100)
  turn0, turn1 = call("q=a"), ANSWER
  scripts = [[turn0, turn1, RAMBLE]] * 4
  batch, sampler, _ = rollout(scripts, config, samples=2, ground_truths=["Paris", "Rome"],
                              data_sources=["hotpotqa", "musique"])
  seg0, obs, seg1 = enc(turn0), enc(observation_text("result for q=a")), enc(turn1)
  expected = seg0 + obs + seg1
  for b in range(4):
    assert row_response(batch, b) == expected
    assert batch.action_mask[b, :len(expected)].tolist() == [1] * len(seg0) + [0] * len(obs) + [1] * len(seg1)
    assert batch.last_action_index[b] == len(expected) - 1
    assert batch.turn_last_action_index[b].tolist() == [len(seg0) - 1, len(expected) - 1, -1]
  assert batch.group_ids.tolist() == [0, 0, 1, 1]
  assert batch.ground_truth == ["Paris", "Paris", "Rome", "Rome"]
  assert batch.data_source == ["hotpotqa", "hotpotqa", "musique", "musique"]
  assert batch.num_turns.tolist() == [2] * 4 and batch.num_tool_calls.tolist() == [1] * 4
  assert batch.num_tool_errors.tolist() == [0] * 4
  assert batch.stop_reason.tolist() == [EpisodeStop.ANSWER] * 4
  assert batch.response_text[0] == turn0 + observation_text("result for q=a") + turn1
  # Sequence-level masks over [B, P+R]: left-padded prompt then right-padded response.
  for b in range(4):
    n_prompt = len(enc(prompt_text(b // 2)))
    mask = [0] * (64 - n_prompt) + [1] * (n_prompt + len(expected)) + [0] * (200 - len(expected))
    assert batch.attention_mask[b].tolist() == mask
    assert batch.input_ids[b, 64 - n_prompt:64].tolist() == enc(prompt_text(b // 2))
  # The driver's sampler calls: prefill, one decode, then continue_ with only the still-active rows.
  assert [kind for kind, _ in sampler.calls] == ["prefill", "decode", "continue"]
  check_invariants(batch, sampler)


def test_inactive_rows_get_zero_budget_and_no_observation():
  config = RolloutConfig(max_prompt_length=64, max_response_length=300, max_turns=4, max_new_tokens_per_turn=80)
  scripts = [[ANSWER] * 4, [call("q=a"), ANSWER, ANSWER, ANSWER], [call("q=a"), call("q=b"), ANSWER, ANSWER]]
  batch, sampler, env = rollout(scripts, config)
  budgets = [bud.tolist() for kind, bud in sampler.calls[1:]]
  assert budgets == [[80, 80, 80], [0, 80, 80], [0, 0, 80]]
  # One env call per turn over the rows that sampled (after the up-front probe).
  assert [len(texts) for texts in env.seen[1:]] == [3, 2, 1]
  assert batch.num_turns.tolist() == [1, 2, 3]
  assert batch.num_tool_calls.tolist() == [0, 1, 2]
  check_invariants(batch, sampler)


# ---------------------------------------------------------------------------------------------------------
# Each limit
# ---------------------------------------------------------------------------------------------------------


def test_max_turns_row_keeps_reward_on_its_last_action():
  config = RolloutConfig(max_prompt_length=64, max_response_length=400, max_turns=2, max_new_tokens_per_turn=80)
  scripts = [[call("q=a"), call("q=bad")], [call("q=a"), ANSWER]]
  batch, sampler, _ = rollout(scripts, config)
  seg0, obs, seg1 = enc(call("q=a")), enc(observation_text("result for q=a")), enc(call("q=bad"))
  assert row_response(batch, 0) == seg0 + obs + seg1  # no trailing observation after the last turn
  assert batch.stop_reason.tolist() == [EpisodeStop.MAX_TURNS, EpisodeStop.ANSWER]
  assert batch.num_tool_calls[0] == 2 and batch.num_tool_errors[0] == 1
  last = len(seg0) + len(obs) + len(seg1) - 1
  assert batch.last_action_index[0] == last and batch.response_ids[0, last] == CALL_CLOSE
  rewards = batch.token_level_rewards(np.float32([1.0, 0.5]))
  assert rewards[0, last] == 1.0 and rewards[0].sum() == 1.0 and batch.action_mask[0, last] == 1
  assert rewards[1, batch.last_action_index[1]] == 0.5 and rewards[1].sum() == 0.5
  check_invariants(batch, sampler)


def test_observation_overflowing_response_budget_is_cut_and_ends_the_row():
  seg0 = enc(call("q=long"))
  obs = enc(observation_text("x" * 120))
  R = len(seg0) + 50  # noqa: N806
  config = RolloutConfig(max_prompt_length=64, max_response_length=R, max_turns=3, max_new_tokens_per_turn=60)
  batch, sampler, _ = rollout([[call("q=long"), ANSWER, ANSWER]], config)
  assert len(obs) > 50
  assert row_response(batch, 0) == seg0 + obs[:50]
  assert batch.action_mask[0].tolist() == [1] * len(seg0) + [0] * 50
  assert batch.stop_reason[0] == EpisodeStop.RESPONSE_BUDGET
  assert batch.last_action_index[0] == len(seg0) - 1
  assert batch.num_turns[0] == 1
  check_invariants(batch, sampler)  # the cut observation never reached the sampler


def test_segment_cut_by_response_budget():
  config = RolloutConfig(max_prompt_length=64, max_response_length=30, max_turns=3, max_new_tokens_per_turn=60)
  batch, sampler, _ = rollout([[RAMBLE] * 3], config)
  assert row_response(batch, 0) == enc(RAMBLE)[:30]
  assert batch.stop_reason[0] == EpisodeStop.RESPONSE_BUDGET and batch.last_action_index[0] == 29
  assert sampler.calls[1][1].tolist() == [30]
  check_invariants(batch, sampler)


def test_context_limit_depends_on_each_prompt_length():
  seg0 = enc(call("q=a"))
  obs = enc(observation_text("result for q=a"))
  short, long_ = len(enc(prompt_text(0))), len(enc(prompt_text(5)))
  # Short prompt: room for seg0 + obs + 10 more tokens; long prompt: the observation is cut.
  context = short + len(seg0) + len(obs) + 10
  assert long_ - short > 10
  config = RolloutConfig(max_prompt_length=64, max_response_length=400, max_turns=3, max_new_tokens_per_turn=60,
                         max_context_length=context)
  batch, sampler, _ = rollout([[call("q=a"), RAMBLE, RAMBLE]] * 2, config, prompts=[prompt_text(0), prompt_text(5)])
  assert row_response(batch, 0) == seg0 + obs + enc(RAMBLE)[:10]
  room_long = context - long_ - len(seg0)
  assert row_response(batch, 1) == seg0 + obs[:room_long]
  assert batch.stop_reason.tolist() == [EpisodeStop.CONTEXT_LIMIT] * 2
  assert batch.num_turns.tolist() == [2, 1]
  check_invariants(batch, sampler)


def test_turn_truncated_without_tool_call_and_eos():
  config = RolloutConfig(max_prompt_length=64, max_response_length=400, max_turns=3, max_new_tokens_per_turn=16,
                         end_of_text_ids=(EOT,))
  scripts = [[RAMBLE] * 3, ["bye<|endoftext|>"] * 3, [call("q=a"), "x<|endoftext|>", ANSWER]]
  batch, sampler, _ = rollout(scripts, config)
  assert row_response(batch, 0) == enc(RAMBLE)[:16]
  assert batch.stop_reason.tolist() == [EpisodeStop.TRUNCATED_TURN, EpisodeStop.EOS, EpisodeStop.EOS]
  assert batch.response_ids[1, batch.last_action_index[1]] == EOT
  # Without end_of_text_ids, <|endoftext|> is just a stop token: the turn is an answer.
  plain = dataclasses.replace(config, end_of_text_ids=())
  batch2, sampler2, _ = rollout(scripts, plain)
  assert batch2.stop_reason.tolist() == [EpisodeStop.TRUNCATED_TURN, EpisodeStop.ANSWER, EpisodeStop.ANSWER]
  check_invariants(batch, sampler)
  check_invariants(batch2, sampler2)


def test_tool_response_cap_keeps_head_and_tail():
  config = RolloutConfig(max_prompt_length=64, max_response_length=400, max_turns=2, max_new_tokens_per_turn=60,
                         max_observation_tokens=20, observation_tail_tokens=6)
  batch, sampler, _ = rollout([[call("q=long"), ANSWER]], config)
  seg0, obs = enc(call("q=long")), enc(observation_text("x" * 120))
  assert row_response(batch, 0)[:len(seg0) + 20] == seg0 + obs[:14] + obs[-6:]
  assert TOK.decode(row_response(batch, 0)[len(seg0) + 14:len(seg0) + 20]) == "stant\n"  # framing tail kept
  assert batch.stop_reason[0] == EpisodeStop.ANSWER
  check_invariants(batch, sampler)


def test_shapes_do_not_depend_on_turns_taken():
  config = RolloutConfig(max_prompt_length=64, max_response_length=256, max_turns=4, max_new_tokens_per_turn=50)
  short, _, _ = rollout([[ANSWER] * 4] * 2, config)
  long_, _, _ = rollout([[call("q=a"), call("q=b"), call("q=c"), call("q=d")]] * 2, config)
  assert short.num_turns.tolist() == [1, 1] and long_.num_turns.tolist() == [4, 4]
  for name, value in short.as_learner_inputs().items():
    assert value.shape == long_.as_learner_inputs()[name].shape, name
    assert value.dtype == long_.as_learner_inputs()[name].dtype, name
  assert short.turn_last_action_index.shape == long_.turn_last_action_index.shape == (2, 4)


# ---------------------------------------------------------------------------------------------------------
# Against a per-row reference loop, over random scripts and limits
# ---------------------------------------------------------------------------------------------------------


def test_matches_per_row_reference_on_random_episodes():
  rng = np.random.default_rng(0)
  choices = [lambda: call(f"q={rng.integers(100)}"), lambda: call("q=bad"), lambda: call("q=long"),
             lambda: ANSWER, lambda: RAMBLE, lambda: "done<|endoftext|>",
             lambda: call(f"q={'w' * int(rng.integers(1, 40))}", think="hmm " * int(rng.integers(0, 8)))]
  reasons_seen = set()
  for trial in range(16):
    n_prompts, samples = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    turns = int(rng.integers(1, 5))
    prompt_lengths = [len(enc(prompt_text(i))) for i in range(n_prompts)]
    config = RolloutConfig(
        max_prompt_length=max(prompt_lengths) + int(rng.integers(0, 5)),
        max_response_length=int(rng.integers(20, 220)),
        max_turns=turns,
        max_new_tokens_per_turn=int(rng.integers(4, 70)),
        max_context_length=None if rng.random() < 0.5 else int(max(prompt_lengths) + rng.integers(5, 200)),
        max_observation_tokens=None if rng.random() < 0.5 else int(rng.integers(10, 80)),
        observation_tail_tokens=int(rng.integers(0, 8)),
        end_of_text_ids=(EOT,) if rng.random() < 0.5 else ())
    scripts = [[choices[rng.integers(len(choices))]() for _ in range(turns)] for _ in range(n_prompts * samples)]
    batch, sampler, _ = rollout(scripts, config, samples=samples)
    check_invariants(batch, sampler)
    for b, script in enumerate(scripts):
      prompt = enc(prompt_text(b // samples))
      ref = reference_row(prompt, script, config)
      context = f"trial {trial} row {b}"
      assert row_response(batch, b) == ref["response"], context
      assert batch.action_mask[b, :len(ref["action"])].tolist() == ref["action"], context
      assert batch.stop_reason[b] == ref["reason"], context
      assert batch.num_turns[b] == ref["turns"], context
      assert batch.num_tool_calls[b] == ref["calls"] and batch.num_tool_errors[b] == ref["errors"], context
      assert batch.turn_last_action_index[b, :ref["turns"]].tolist() == ref["turn_last"], context
      assert batch.last_action_index[b] == ref["turn_last"][-1], context
      reasons_seen.add(int(ref["reason"]))
  assert reasons_seen == {int(r) for r in EpisodeStop if r is not EpisodeStop.NONE}  # every path exercised


class WaveSampler(ScriptedSampler):
  """A ScriptedSampler over every row of a step that serves, at each prefill, the next wave's rows' scripts."""

  def __init__(self, scripts, *args):
    super().__init__(scripts, *args)
    self.all_scripts, self.offset, self.wave_rows = self.scripts, 0, []

  def prefill(self, params, prompt_ids, prompt_mask):
    rows = prompt_ids.shape[0]
    self.scripts = self.all_scripts[self.offset:self.offset + rows]
    self.offset += rows
    self.wave_rows.append(rows)
    return super().prefill(params, prompt_ids, prompt_mask)


def test_waves_sample_every_row_as_one_wave_would_in_prompt_order():
  """5 prompts x 2 samples in waves of 2 prompts: 3 waves of 4, 4 and 2 rows, each row laid out as the
  per-row reference lays it out, groups numbered by the prompt's place in the step, timings summed."""
  rng = np.random.default_rng(3)
  choices = [lambda: call(f"q={rng.integers(100)}"), lambda: call("q=bad"), lambda: ANSWER, lambda: RAMBLE,
             lambda: "done<|endoftext|>"]
  config = RolloutConfig(max_prompt_length=40, max_response_length=160, max_turns=3, max_new_tokens_per_turn=40,
                         end_of_text_ids=(EOT,))
  scripts = [[choices[rng.integers(len(choices))]() for _ in range(3)] for _ in range(10)]
  sampler = WaveSampler([[enc(t) for t in row] for row in scripts], STOPS, PAD, config.cache_length)
  prompts = [prompt_text(i) for i in range(5)]
  batch = run_episodes_in_waves(sampler, None, ScriptedEnv(), TOK, prompts, config, None, jax.random.key(0),
                                prompts_per_wave=2, samples_per_prompt=2, group_offset=10,
                                ground_truths=[[str(i)] for i in range(5)])
  assert sampler.wave_rows == [4, 4, 2]
  assert batch.group_ids.tolist() == [10, 10, 11, 11, 12, 12, 13, 13, 14, 14]
  assert batch.ground_truth == [[str(b // 2)] for b in range(10)]
  for b, script in enumerate(scripts):
    ref = reference_row(enc(prompt_text(b // 2)), script, config)
    assert row_response(batch, b) == ref["response"], b
    assert batch.action_mask[b, :len(ref["action"])].tolist() == ref["action"], b
    assert batch.stop_reason[b] == ref["reason"] and batch.num_turns[b] == ref["turns"], b
  one = run_episodes_in_waves(WaveSampler([[enc(t) for t in row] for row in scripts], STOPS, PAD,
                                          config.cache_length), None, ScriptedEnv(), TOK, prompts, config, None,
                              jax.random.key(0), prompts_per_wave=0, samples_per_prompt=2)
  np.testing.assert_array_equal(one.response_ids, batch.response_ids)
  np.testing.assert_array_equal(one.action_mask, batch.action_mask)
  assert batch.timings["total"] > 0


# ---------------------------------------------------------------------------------------------------------
# Rewards, process rewards, device transfer
# ---------------------------------------------------------------------------------------------------------


def test_process_rewards_land_on_each_turns_last_action():
  config = RolloutConfig(max_prompt_length=64, max_response_length=400, max_turns=3, max_new_tokens_per_turn=60)

  def hook(turn, rows, texts, results):  # +0.1 per successful call, -0.2 per failed one
    return [0.1 * r[1].count(True) - 0.2 * r[1].count(False) for r in results]

  batch, sampler, _ = rollout([[call("q=a"), call("q=bad"), ANSWER]], config, process_reward_fn=hook)
  seg0, obs0 = enc(call("q=a")), enc(observation_text("result for q=a"))
  seg1, obs1 = enc(call("q=bad")), enc(observation_text("Error: bad query"))
  ends = [len(seg0) - 1, len(seg0) + len(obs0) + len(seg1) - 1,
          len(seg0) + len(obs0) + len(seg1) + len(obs1) + len(enc(ANSWER)) - 1]
  assert batch.turn_last_action_index[0].tolist() == ends
  np.testing.assert_allclose(batch.process_rewards[0], [0.1, -0.2, 0.0], atol=1e-7)
  dense = batch.token_level_rewards(np.float32([1.0]))
  expected = np.zeros(400, np.float32)
  expected[ends[0]], expected[ends[1]], expected[ends[2]] = 0.1, -0.2, 1.0
  np.testing.assert_allclose(dense[0], expected, atol=1e-7)
  np.testing.assert_allclose(batch.token_level_rewards(np.float32([1.0]), include_process=False)[0],
                             np.where(np.arange(400) == ends[2], 1.0, 0.0), atol=0)
  check_invariants(batch, sampler)


def test_to_device_shards_rows_over_a_mesh():
  config = RolloutConfig(max_prompt_length=64, max_response_length=128, max_turns=2, max_new_tokens_per_turn=60)
  batch, _, _ = rollout([[call("q=a"), ANSWER]] * 8, config, samples=8, prompts=[prompt_text(0)])
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  rewards = batch.token_level_rewards(np.arange(8, dtype=np.float32))
  arrays = batch.to_device(sharding, extra={"token_level_rewards": rewards})
  for name, host in list(batch.as_learner_inputs().items()) + [("token_level_rewards", rewards)]:
    assert arrays[name].sharding.is_equivalent_to(sharding, host.ndim), name
    np.testing.assert_array_equal(np.asarray(arrays[name]), host)
  assert batch.group_ids.tolist() == [0] * 8


def test_metrics_fractions():
  config = RolloutConfig(max_prompt_length=64, max_response_length=200, max_turns=2, max_new_tokens_per_turn=60)
  batch, _, _ = rollout([[ANSWER] * 2, [call("q=a")] * 2, [call("q=a"), ANSWER], [ANSWER] * 2], config)
  metrics = batch.metrics()
  assert metrics["rollout/stop_answer"] == 0.75 and metrics["rollout/stop_max_turns"] == 0.25
  assert metrics["rollout/turns_mean"] == (1 + 2 + 2 + 1) / 4
  assert metrics["rollout/tool_calls_mean"] == (0 + 2 + 1 + 0) / 4


def test_trimmed_drops_only_padding_and_keeps_the_reward_slots():
  config = RolloutConfig(max_prompt_length=64, max_response_length=200, max_turns=3, max_new_tokens_per_turn=100)
  batch, _, _ = rollout([[call("q=a"), ANSWER, RAMBLE], [ANSWER] * 3], config)
  longest_prompt = int(batch.prompt_mask.sum(axis=1).max())
  longest_response = int(batch.response_lengths.max())
  small = batch.trimmed(longest_prompt, longest_response)
  assert small.input_ids.shape == (2, longest_prompt + longest_response)
  for b in range(2):
    assert row_response(small, b) == row_response(batch, b)
    np.testing.assert_array_equal(small.input_ids[b][small.attention_mask[b] == 1],
                                  batch.input_ids[b][batch.attention_mask[b] == 1])
  np.testing.assert_array_equal(small.token_level_rewards([1.0, -1.0]),
                                batch.token_level_rewards([1.0, -1.0])[:, :longest_response])
  with pytest.raises(ValueError, match="cannot trim"):
    batch.trimmed(longest_prompt - 1, longest_response)
  with pytest.raises(ValueError, match="cannot trim"):
    batch.trimmed(longest_prompt, longest_response - 1)


# ---------------------------------------------------------------------------------------------------------
# Multi-host: a process keeps stepping (zero budgets) while another process still has active rows
# ---------------------------------------------------------------------------------------------------------


def test_finished_process_keeps_stepping_while_another_is_active(monkeypatch):
  config = RolloutConfig(max_prompt_length=64, max_response_length=300, max_turns=4, max_new_tokens_per_turn=60)
  scripts = [[ANSWER] * 4, [call("q=a"), ANSWER, ANSWER, ANSWER]]
  single, single_sampler, _ = rollout(scripts, config)
  other_active = iter([True, True, True, False])  # the other process finishes after its third turn
  gathered = []

  def fake_allgather(local):
    gathered.append(int(local[0]))
    return np.asarray([[int(local[0])], [int(next(other_active))]])

  monkeypatch.setattr(multihost.jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost.multihost_utils, "process_allgather", fake_allgather)
  multi, multi_sampler, _ = rollout(scripts, config)
  assert gathered == [1, 1, 0, 0]
  # Same jitted-call sequence as the other process: two extra segments with every budget 0.
  assert [kind for kind, _ in multi_sampler.calls] == ["prefill", "decode", "continue", "continue"]
  assert multi_sampler.calls[-1][1].tolist() == [0, 0]
  for name, value in single.as_learner_inputs().items():
    np.testing.assert_array_equal(value, multi.as_learner_inputs()[name])
  assert len(single_sampler.calls) == 3


# ---------------------------------------------------------------------------------------------------------
# Bad input: one clear error before anything runs
# ---------------------------------------------------------------------------------------------------------


def test_prompt_longer_than_context_fails_up_front():
  config = RolloutConfig(max_prompt_length=64, max_response_length=100, max_turns=2, max_new_tokens_per_turn=10,
                         max_context_length=20)
  with pytest.raises(ValueError, match=r"prompt\(s\) are empty or longer than 19 tokens.*#0"):
    rollout([[ANSWER] * 2], config)
  config = RolloutConfig(max_prompt_length=8, max_response_length=100, max_turns=2, max_new_tokens_per_turn=10)
  sampler = ScriptedSampler([[enc(ANSWER)]], STOPS, PAD, 200)
  with pytest.raises(ValueError, match="max_prompt_length=8"):
    run_episodes(sampler, None, ScriptedEnv(), TOK, [prompt_text(0)], config, None, jax.random.key(0))
  assert sampler.calls == []


def test_env_with_non_string_observation_fails_up_front():
  class BytesEnv(ScriptedEnv):
    def batch_step(self, texts):
      return [(obs.encode(), ok, active) for obs, ok, active in super().batch_step(texts)]

  config = RolloutConfig(max_prompt_length=64, max_response_length=100, max_turns=2, max_new_tokens_per_turn=10)
  sampler = ScriptedSampler([[enc(ANSWER)] * 2], STOPS, PAD, 200)
  with pytest.raises(TypeError, match="BytesEnv failed the rollout's up-front probe: env observations must be str"):
    run_episodes(sampler, None, BytesEnv(), TOK, [prompt_text(0)], config, None, jax.random.key(0))
  assert sampler.calls == []


def test_tokenizer_without_turn_tokens_fails_up_front():
  config = RolloutConfig(max_prompt_length=64, max_response_length=100, max_turns=2, max_new_tokens_per_turn=10)
  tok = byte_tokenizer(("<|endoftext|>", "<|im_end|>"))
  sampler = ScriptedSampler([[enc(ANSWER)]], STOPS, PAD, 200)
  with pytest.raises(ValueError, match=r"single ids: '<\|im_start\|>' -> \["):
    run_episodes(sampler, None, ScriptedEnv(), tok, [prompt_text(0)], config, None, jax.random.key(0))
  assert sampler.calls == []


def test_multi_token_tool_call_close_needs_its_stop_sequence_up_front():
  """`</tool_call>` may be several tokens (SmolLM2's vocabulary); a sampler that stops only on single ids then
  lacks it, and the error names its token sequence."""
  config = RolloutConfig(max_prompt_length=64, max_response_length=100, max_turns=2, max_new_tokens_per_turn=10)
  tok = byte_tokenizer(("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
  close = tok.encode("</tool_call>", add_special_tokens=False)
  assert len(close) == len("</tool_call>")
  sampler = ScriptedSampler([[enc(ANSWER)]], [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")],
                            PAD, 200)
  with pytest.raises(ValueError, match=re.escape(f"lack </tool_call> ({close})")):
    run_episodes(sampler, None, ScriptedEnv(), tok, [prompt_text(0)], config, None, jax.random.key(0))
  assert sampler.calls == []


def test_sampler_without_tool_call_stop_or_small_cache_fails_up_front():
  config = RolloutConfig(max_prompt_length=64, max_response_length=100, max_turns=2, max_new_tokens_per_turn=10)
  sampler = ScriptedSampler([[enc(ANSWER)]], (IM_END,), PAD, 200)
  with pytest.raises(ValueError, match="lack </tool_call>"):
    run_episodes(sampler, None, ScriptedEnv(), TOK, [prompt_text(0)], config, None, jax.random.key(0))
  sampler = ScriptedSampler([[enc(ANSWER)]], STOPS, PAD, 150)
  with pytest.raises(ValueError, match="max_cache_length >= config.cache_length = 164"):
    run_episodes(sampler, None, ScriptedEnv(), TOK, [prompt_text(0)], config, None, jax.random.key(0))
  assert sampler.calls == []


def test_cache_length_counts_the_samplers_prompt_bucket():
  # The sampler gives a prompt of width P a power-of-two bucket >= 16 of cache slots, then R response slots.
  for p, slots in ((8, 16), (16, 16), (40, 64), (64, 64), (65, 128)):
    config = RolloutConfig(max_prompt_length=p, max_response_length=100, max_turns=1, max_new_tokens_per_turn=4)
    assert config.cache_length == slots + 100


def test_config_from_an_ml_collections_section():
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top

  section = config_dict.ConfigDict({
      "n_samples": 5, "max_turns": 4, "max_prompt_length": 256, "max_new_tokens_per_turn": 128,
      "max_response_length": 1024, "max_context_length": 1200, "temperature": 1.0})
  section.max_observation_tokens = config_dict.placeholder(int)
  config = RolloutConfig.from_config(section)
  assert (config.max_turns, config.max_prompt_length, config.max_new_tokens_per_turn) == (4, 256, 128)
  assert (config.max_response_length, config.context_limit, config.max_observation_tokens) == (1024, 1200, None)
  del section["max_turns"]
  with pytest.raises(ValueError, match=r"lacks \['max_turns'\]"):
    RolloutConfig.from_config(section)


def test_config_rejects_nonsense():
  with pytest.raises(ValueError, match="max_turns must be a positive int"):
    RolloutConfig(max_prompt_length=8, max_response_length=8, max_turns=0, max_new_tokens_per_turn=4)
  with pytest.raises(ValueError, match="observation_tail_tokens"):
    RolloutConfig(max_prompt_length=8, max_response_length=8, max_turns=1, max_new_tokens_per_turn=4,
                  max_observation_tokens=4, observation_tail_tokens=4)


# ---------------------------------------------------------------------------------------------------------
# Real Qwen2.5 tokenizer + real NousToolEnv/BM25 search: the context equals the chat template's rendering
# ---------------------------------------------------------------------------------------------------------


def test_qwen_context_equals_chat_template_with_real_env(qwen_tokenizer_dir):
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

  from agent_r1_jax.envs import NousToolEnv  # pylint: disable=g-import-not-at-top
  from agent_r1_jax.retrieval import BM25Index, Passage  # pylint: disable=g-import-not-at-top
  from agent_r1_jax.tools import WikiSearchTool  # pylint: disable=g-import-not-at-top

  tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))
  passages = [Passage("1", "Eiffel Tower", "The Eiffel Tower is a lattice tower in Paris, France."),
              Passage("2", "Paris", "Paris is the capital and largest city of France."),
              Passage("3", "Lyon", "Lyon is a city in France on the Rhone.")]
  env = NousToolEnv([WikiSearchTool(BM25Index(passages), top_k=2)])
  messages = [{"role": "user", "content": "In which city is the Eiffel Tower?"}]
  prompt = tok.apply_chat_template(messages, tools=env.tool_schemas, add_generation_prompt=True, tokenize=False)
  call_text = NousToolEnv.render_call("search", {"query": "Eiffel Tower city"})
  turns = [f"Let me search.\n{call_text}", "<answer>Paris</answer><|im_end|>"]
  ids = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
  stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "</tool_call>")]
  config = RolloutConfig(max_prompt_length=len(ids(prompt)) + 3, max_response_length=256, max_turns=3,
                         max_new_tokens_per_turn=64)
  sampler = ScriptedSampler([[ids(t) for t in turns]], stops, tok.pad_token_id, config.cache_length)
  batch = run_episodes(sampler, None, env, tok, [prompt], config, None, jax.random.key(0))

  observation = env.step(turns[0])[0]
  assert 'Doc 1 (Title: "Eiffel Tower")' in observation
  assert batch.response_text[0] == turns[0] + observation + turns[1]
  assert batch.stop_reason[0] == EpisodeStop.ANSWER and batch.num_tool_calls[0] == 1
  # The same conversation rendered by the official template (tool call + tool message + final answer).
  convo = messages + [
      {"role": "assistant", "content": "Let me search.",
       "tool_calls": [{"type": "function", "function": {"name": "search",
                                                        "arguments": {"query": "Eiffel Tower city"}}}]},
      {"role": "tool", "content": observation.split("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]},
      {"role": "assistant", "content": "<answer>Paris</answer>"}]
  template = tok.apply_chat_template(convo, tools=env.tool_schemas, tokenize=False)
  context = batch.input_ids[0][batch.attention_mask[0] == 1].tolist()
  assert tok.decode(context) == template[:len(tok.decode(context))]
  assert template[len(tok.decode(context)):] == "\n"  # the template's newline after the final <|im_end|>
  assert context == ids(template)[:len(context)]  # token for token, not only as text
  # Action tokens are the scripted ids exactly (never re-encoded from text).
  assert batch.response_ids[0, batch.action_mask[0] == 1].tolist() == ids(turns[0]) + ids(turns[1])


def test_waves_per_process_from_the_config():
  """Waves of max_rows_per_device rows on each batch device, whole groups, split over processes (hand-computed:
  GRPO's 128 x 5 rows on 8 devices at 40 rows per device: 320 rows = 64 prompts, 32 per process of 2)."""
  from agent_r1_jax.trainer import config as config_lib  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.sizing.rollout_sizing import prompts_per_wave  # pylint: disable=import-outside-toplevel
  c = config_lib.base_config("grpo", "qwen2.5-1.5b")
  assert prompts_per_wave(c, 8, 1) == 0  # the default: one wave
  c.rollout.max_rows_per_device = 40
  assert prompts_per_wave(c, 8, 1) == 64
  assert prompts_per_wave(c, 8, 2) == 32
  c.rollout.max_rows_per_device = 3  # 24 rows: not whole groups of 5
  with pytest.raises(ValueError, match="multiple of 5 rows"):
    prompts_per_wave(c, 8, 1)
  c.rollout.max_rows_per_device = -1
  with pytest.raises(ValueError, match="max_rows_per_device must be an integer >= 0"):
    prompts_per_wave(c, 8, 1)
