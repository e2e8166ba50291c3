"""Multi-host readiness of the sampler: no-op calls, agreed static sizes, the driver with a faked 2nd process.

Under multi-controller JAX every process must make the same jitted calls with the same shapes. These tests
check, in one process: a call whose rows do nothing is a real no-op call of the program; the programs a call
uses depend only on the agreed sizes, not on local budgets or observation lengths; and the episode driver
with the real sampler keeps stepping (all-zero budgets, empty extensions at the other process's sizes) while a
faked second process is still active, producing exactly the local batch of a single-process run. The real
two-process run is in tests/test_sampler_multiprocess.py.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from jax.experimental import multihost_utils

from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
from agent_r1_jax.rollout import RolloutConfig, run_episodes
from scripted_policy import byte_tokenizer
from agent_r1_jax.sampling import Sampler, SamplingParams, StopReason, compiled_programs
from test_sampler import left_pad
from agent_r1_jax.sampling import programs

TOK = byte_tokenizer()
PAD = TOK.pad_token_id
STOPS = [TOK.convert_tokens_to_ids(t) for t in ("<|im_end|>", "</tool_call>")]
PROMPTS = [[5, 17, 42, 9, 33], [11, 4, 90], [23, 7, 55, 61, 2, 19, 3]]


@pytest.fixture(scope="module")
def tiny():
  """(graphdef, params) of a random 1-layer Qwen2 over the byte tokenizer's vocabulary."""
  config = Qwen2Config(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)
  return nnx.split(Qwen2ForCausalLM(config, rngs=nnx.Rngs(0)))


def snapshot(state):
  """Host copies of everything a no-op call must leave alone (the call donates the device arrays)."""
  c = state.cache  # per-layer keys and values [B, S, K * hd] -> [L, B, S, K * hd]
  return dict(k=np.stack(c.k), v=np.stack(c.v),
              valid=np.array(c.valid), lengths=np.array(c.lengths),
              cursor=np.array(c.cursor), logits=np.array(state.last_logits), host=state.lengths)


def assert_unchanged(before, state, rows):
  after = snapshot(state)
  np.testing.assert_array_equal(after["host"], before["host"])
  for name in ("valid", "lengths", "cursor", "logits"):
    np.testing.assert_array_equal(after[name][:rows], before[name][:rows], err_msg=name)
  valid = before["valid"][:rows]  # [B, S]: the real tokens' keys and values are untouched
  for name in ("k", "v"):
    np.testing.assert_array_equal(after[name][:, :rows][:, valid], before[name][:, :rows][:, valid])


def test_all_zero_decode_and_all_empty_extend_are_noop_calls(tiny):
  graphdef, params = tiny
  sampler = Sampler(graphdef, max_cache_length=64, stop_token_ids=STOPS, pad_id=PAD)
  state = sampler.prefill(params, *left_pad(PROMPTS, pad=PAD))
  state, _ = sampler.decode(params, state, np.array([4, 2, 3]), SamplingParams(), jax.random.key(0))
  before = snapshot(state)

  old = state.cache.k[0]
  state, seg = sampler.decode(params, state, np.zeros(3, np.int32), SamplingParams(), jax.random.key(1))
  assert old.is_deleted()  # the program ran (it consumed the donated cache), as on a process still active
  assert seg.tokens.shape == seg.logprobs.shape == (3, 0)
  assert seg.lengths.tolist() == [0, 0, 0] and seg.stop_reasons.tolist() == [StopReason.NONE] * 3
  assert_unchanged(before, state, 3)

  # Another process appends 5 tokens: this one runs the same extend program with nothing to append.
  old = state.cache.k[0]
  state = sampler.extend(params, state, [[], [], []], extend_length=5)
  assert old.is_deleted()
  assert_unchanged(before, state, 3)
  # Same inside continue_ (extend, then decode), with agreed sizes larger than anything local.
  state, seg = sampler.continue_(params, state, [[], [], []], np.zeros(3, np.int32), SamplingParams(),
                                 jax.random.key(2), width=6, extend_length=9)
  assert seg.tokens.shape == (3, 6) and (seg.tokens == PAD).all() and not seg.logprobs.any()
  assert seg.lengths.tolist() == [0, 0, 0]
  assert_unchanged(before, state, 3)
  # Nothing to append anywhere (agreed length 0): no program runs, the state is returned as is.
  assert sampler.extend(params, state, [[], [], []], extend_length=0) is state


def test_agreed_sizes_select_the_programs_not_local_budgets(tiny):
  """Two processes' worth of different local work, same agreed sizes: the second compiles nothing."""
  graphdef, params = tiny
  # A cache size no other test uses, so the first sampler's programs are compiled here.
  samplers = [Sampler(graphdef, max_cache_length=88, stop_token_ids=STOPS, pad_id=PAD) for _ in range(2)]
  local_work = [  # (turn-0 budgets, observations, turn-1 budgets) of two processes
      (np.array([3, 0, 2]), [[7], [], []], np.array([1, 0, 0])),
      (np.array([9, 5, 12]), [[1] * 12, [2] * 3, []], np.array([10, 7, 0])),
  ]

  def run(sampler, work, **agreed):
    budgets0, observations, budgets1 = work
    state = sampler.prefill(params, *left_pad(PROMPTS, pad=PAD))
    state, seg0 = sampler.decode(params, state, budgets0, SamplingParams(), jax.random.key(0),
                                 width=agreed.get("width"))
    state, seg1 = sampler.continue_(params, state, observations, budgets1, SamplingParams(),
                                    jax.random.key(1), **agreed)
    return seg0, seg1

  counts = []
  for sampler, work in zip(samplers, local_work):
    before = compiled_programs()
    seg0, seg1 = run(sampler, work, width=12, extend_length=12)
    counts.append(compiled_programs() - before)
    assert seg0.tokens.shape == seg1.tokens.shape == (3, 12)  # the agreed width, whatever the budgets
    assert (seg0.lengths <= work[0]).all() and (seg1.lengths <= work[2]).all()
  assert counts == [3, 0]  # prefill + decode(16) + extend(16) once; the other process's work reuses them
  # Sizes derived from each process's own work would pick other programs (segment 8 and extend 8 here).
  before = compiled_programs()
  run(samplers[0], local_work[0])
  assert compiled_programs() - before == 2


# -- a faked second process ------------------------------------------------------------------------------


class OtherProcess:
  """Answers `process_allgather` as a 2-process job would: this process's values stacked with the other's.

  The driver gathers one int32 flag per turn (any row active); the sampler gathers int64 sizes: prefill
  [B, P, -B], decode [width] (turn 0), continue_ [extend_length, width]. The other process is active for
  `active_turns` turns with `width` budgets and `observation` tokens per turn.
  """

  def __init__(self, active_turns: int, width: int, observation: int, batch: int, prompt: int):
    self.active_turns, self.width, self.observation = active_turns, width, observation
    self.batch, self.prompt = batch, prompt
    self.turn = -1
    self.local: list[np.ndarray] = []

  def __call__(self, local):
    local = np.asarray(local)
    self.local.append(local.copy())
    active = self.turn < self.active_turns
    if local.dtype == np.int32:  # the driver's flag, once at the top of each turn
      self.turn += 1
      other = [int(self.turn < self.active_turns)]
    elif local.size == 3:
      other = [self.batch, self.prompt, -self.batch]
    elif local.size == 1:
      other = [self.width if active else 0]
    else:
      other = [self.observation if active and self.turn > 0 else 0, self.width if active else 0]
    return np.stack([local, np.asarray(other, local.dtype)])


class SpySampler(Sampler):
  """Records each jitted call: (program, input shapes, budgets or mask)."""

  calls: list

  def _run(self, fn, *args, **kwargs):
    # prefill(graphdef, params, ids, mask), extend(..., cache, logits, ids, mask),
    # decode(..., cache, logits, budgets, stop_ids, rng), sampling_weights(graphdef, params)
    name, arrays = {programs.sampling_weights_jit: ("sampling_weights", ()),
                    programs.prefill_jit: ("prefill", args[2:4]),
                    programs.extend_jit: ("extend", args[4:6]),
                    programs.decode_jit: ("decode", args[4:5])}[fn]
    self.calls.append((name, kwargs.get("width"), [np.asarray(a) for a in arrays]))
    return super()._run(fn, *args, **kwargs)


class TwoTurnEnv:
  """Every row calls a tool in its first turn (an observation follows) and answers in its second."""

  def __init__(self):
    self.steps = 0

  def batch_step(self, texts):
    self.steps += 1
    if self.steps == 1:
      return [("\n<tool_response>ok</tool_response>\n", [True], True) for _ in texts]
    return [("", [], False) for _ in texts]


def test_driver_with_real_sampler_steps_until_the_other_process_is_done(tiny, monkeypatch):
  graphdef, params = tiny
  config = RolloutConfig(max_prompt_length=24, max_response_length=48, max_turns=4, max_new_tokens_per_turn=6)
  prompts = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>user\nwhy?<|im_end|>\n"]

  def rollout():
    sampler = SpySampler(graphdef, max_cache_length=config.cache_length, stop_token_ids=STOPS, pad_id=PAD)
    sampler.calls = []
    batch = run_episodes(sampler, params, TwoTurnEnv(), TOK, prompts, config, SamplingParams(temperature=1.0),
                         jax.random.key(3), samples_per_prompt=2, check_env=False)
    return batch, sampler.calls

  single, single_calls = rollout()
  assert single.num_turns.tolist() == [2] * 4  # this process's rows all end in turn 1
  assert [c[0] for c in single_calls] == ["sampling_weights", "prefill", "decode", "extend", "decode"]

  other = OtherProcess(active_turns=4, width=6, observation=20, batch=4, prompt=24)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather", other)
  multi, calls = rollout()

  # The local batch is the single-process one, token for token.
  for name, value in single.as_learner_inputs().items():
    if value.dtype.kind == "f":
      np.testing.assert_allclose(multi.as_learner_inputs()[name], value, atol=1e-5, err_msg=name)
    else:
      np.testing.assert_array_equal(multi.as_learner_inputs()[name], value, err_msg=name)
  assert multi.stop_reason.tolist() == single.stop_reason.tolist()
  # The same jitted calls as the other process: 4 turns; extensions at its observation bucket (32) even
  # when this process appends nothing (turns 2, 3), and segments with all-zero local budgets.
  assert [c[0] for c in calls] == ["sampling_weights", "prefill", "decode"] + ["extend", "decode"] * 3
  extends = [c for c in calls if c[0] == "extend"]
  assert [c[2][0].shape for c in extends] == [(4, 32)] * 3
  assert [int(c[2][1].sum()) for c in extends[1:]] == [0, 0]  # turns 2, 3: nothing local to append
  decodes = [c for c in calls if c[0] == "decode"]
  assert [c[1] for c in decodes] == [8] * 4  # segment bucket of the agreed width 6
  assert [c[2][0].tolist() for c in decodes[2:]] == [[0, 0, 0, 0]] * 2
  # One flag per turn from the driver, one size vector per sampler call.
  assert [x.dtype == np.int32 for x in other.local] == [False, True, False] + [True, False] * 3


def test_processes_with_different_batch_sizes_fail_with_one_message(tiny, monkeypatch):
  graphdef, params = tiny
  sampler = Sampler(graphdef, max_cache_length=64, stop_token_ids=STOPS, pad_id=PAD)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather", OtherProcess(1, 4, 0, batch=5, prompt=7))
  with pytest.raises(ValueError, match=r"different batch sizes \(3 to 5 rows\)"):
    sampler.prefill(params, *left_pad(PROMPTS, pad=PAD))
  monkeypatch.setattr(jax, "process_count", lambda: 1)
  state = sampler.prefill(params, *left_pad(PROMPTS, pad=PAD))
  with pytest.raises(ValueError, match=r"width=2 is smaller than this process needs \(4\)"):
    sampler.decode(params, state, np.array([4, 1, 1]), SamplingParams(), jax.random.key(0), width=2)
