"""The copy drill: examples whose assistant turn is a copy of names read in the user turn, and its warm-up stage."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from agent_r1_jax.data.synthetic.copy_drill import copy_drill_examples, random_names

SMALL = dict(num_train=40, num_validation=10, num_test=10)


@pytest.fixture(scope="module")
def world_files(synthetic_world):
  return synthetic_world(**SMALL)


@pytest.fixture(scope="module")
def tokenizer(world_files):
  return world_files.load_tokenizer()


def test_the_assistant_turn_repeats_the_user_names_plain_then_quoted(tokenizer):
  for ex in copy_drill_examples(tokenizer, 50, seed=3):
    prompt = tokenizer.decode(ex.prompt_ids.tolist())
    listed = re.search(r"<\|im_start\|>user\nNames: (.*)<\|im_end\|>\n<\|im_start\|>assistant\n$", prompt).group(1)
    names = listed.split("; ")
    assert 3 <= len(names) <= 6 and len(set(names)) == len(names)
    response = tokenizer.decode(ex.response_ids.tolist())
    assert response == "; ".join(names) + "\n" + ", ".join(f'"{n}"' for n in names) + "<|im_end|>"
    assert ex.action_mask.tolist() == [1] * len(ex.response_ids)  # the whole assistant turn carries loss
    assert len(ex.response_ids) <= 48 or len(names) == 3  # the cap drops names down to min_names


def test_without_a_token_cap_the_name_count_is_uniform(tokenizer):
  counts = [len(tokenizer.decode(ex.prompt_ids.tolist()).split("; "))
            for ex in copy_drill_examples(tokenizer, 400, seed=0, max_response_tokens=None)]
  assert set(counts) == {3, 4, 5, 6} and min(counts.count(k) for k in (3, 4, 5, 6)) > 60


def test_names_are_fresh_combinations_not_the_worlds_entities(world_files):
  """A drill name carries no fact: most people and companies it lists are not entities of the world."""
  entities = set(world_files.world().entities)
  rng = random.Random(0)
  drawn = [n for _ in range(300) for n in random_names(rng, 4)]
  two_word = [n for n in drawn if re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", n)]  # people and companies
  assert len(two_word) > 200
  assert np.mean([n in entities for n in two_word]) < 0.5


def test_same_seed_same_examples_other_seed_other_names(tokenizer):
  a, b = copy_drill_examples(tokenizer, 5, seed=1), copy_drill_examples(tokenizer, 5, seed=1)
  c = copy_drill_examples(tokenizer, 5, seed=2)
  assert all(np.array_equal(x.response_ids, y.response_ids) for x, y in zip(a, b))
  assert any(not np.array_equal(x.response_ids, y.response_ids) for x, y in zip(a, c))
  with pytest.raises(ValueError, match="min_names"):
    copy_drill_examples(tokenizer, 1, min_names=4, max_names=3)


def test_copy_stage_is_parsed_and_needs_drill_examples():
  from agent_r1_jax.warmup.sft import COPY_DRILL, Stage, parse_stages, run_sft
  stages = parse_stages("copy:200:32,1:10:4,all:5:2")
  assert stages == [Stage(COPY_DRILL, 200, 32), Stage(1, 10, 4), Stage(0, 5, 2)]
  assert [s.is_copy_drill for s in stages] == [True, False, False]
  with pytest.raises(ValueError, match="copy-drill examples"):
    run_sft(None, None, [object()], stages=stages, lr=1e-3, warmup_steps=0, weight_decay=0.0, prompt_length=8,
            response_length=8, pad_id=0, seed=0)


def _tiny_model(tokenizer, seed=0):
  from flax import nnx
  from agent_r1_jax.models import Qwen2Config, Qwen2ForCausalLM
  arch = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256)
  return nnx.split(Qwen2ForCausalLM(arch, rngs=nnx.Rngs(seed)))


def test_each_batch_draws_from_one_pool_in_proportion_to_its_size(tokenizer):
  """Naive-RAG examples (long prompts) never share a batch with tool-loop episodes; both are drawn."""
  from agent_r1_jax.warmup.sft import BatchStream
  short = copy_drill_examples(tokenizer, 300, seed=0)
  long = copy_drill_examples(tokenizer, 100, seed=1)
  for ex in long:
    ex.prompt_ids = np.concatenate([ex.prompt_ids, np.full(80, 7, np.int32)])  # a marker the short pool lacks
  batches = BatchStream([short, long], 4, np.random.default_rng(0), dict(prompt_length=160, response_length=64,
                                                                      pad_id=0, multiple=16))
  kinds = []
  for _ in range(400):
    batch = batches.next()
    has_marker = (batch["input_ids"] == 7).sum(axis=1) >= 80
    assert has_marker.all() or not has_marker.any()
    kinds.append(bool(has_marker.all()))
  assert 0.17 < np.mean(kinds) < 0.33  # 100 of 400 examples


def test_reading_examples_are_drawn_by_the_whole_episode_stages_only(tokenizer):
  """Episodes whose first turn is context cannot be cut after k turns like the others, so only `all` stages draw
  them, in batches of their own. Marked here by an empty loss mask, a batch of them has loss exactly 0."""
  import dataclasses
  from agent_r1_jax.warmup.sft import Stage, run_sft
  examples = copy_drill_examples(tokenizer, 40, seed=0)
  marked = [dataclasses.replace(ex, action_mask=np.zeros_like(ex.action_mask))
            for ex in copy_drill_examples(tokenizer, 40, seed=1)]
  losses: dict[int, list[float]] = {}
  graphdef, params = _tiny_model(tokenizer)
  run_sft(graphdef, params, examples, reading_examples=marked, stages=[Stage(1, 12, 4), Stage(0, 24, 4)], lr=1e-3,
          warmup_steps=0, weight_decay=0.0, prompt_length=64, response_length=64,
          pad_id=int(tokenizer.pad_token_id), seed=0, length_multiple=16,
          log_fn=lambda step, m: losses.setdefault(int(m["sft/turns"]), []).append(float(m["sft/loss"])))
  assert len(losses[1]) == 12 and min(losses[1]) > 0
  assert 4 <= sum(loss == 0.0 for loss in losses[0]) <= 20 and max(losses[0]) > 0  # about half of 24


def test_adam_b2_reaches_the_optimizer_from_its_second_step(tokenizer):
  """Adam's first update is sign(g) * lr whatever b2 is (bias-corrected v = g^2); from the second on, b2 matters."""
  import jax
  from agent_r1_jax.warmup.sft import COPY_DRILL, Stage, run_sft
  drills = copy_drill_examples(tokenizer, 16, seed=0)

  def params_after(steps, b2):
    graphdef, params = _tiny_model(tokenizer)
    return run_sft(graphdef, params, [object()], stages=[Stage(COPY_DRILL, steps, 4)], drill_examples=drills,
                   lr=1e-2, warmup_steps=0, weight_decay=0.0, prompt_length=64, response_length=64,
                   pad_id=int(tokenizer.pad_token_id), seed=0, length_multiple=16, adam_b2=b2)

  def max_diff(a, b):
    return max(float(abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

  assert max_diff(params_after(1, 0.5), params_after(1, 0.999)) < 1e-6
  assert max_diff(params_after(2, 0.5), params_after(2, 0.999)) > 1e-4


def test_warmup_lr_is_linear_then_cosine_to_zero_at_the_last_step():
  """lr(t) = peak * t / W during warm-up, then peak * (1 + cos(pi (t - W) / (N - W))) / 2 up to the N planned
  steps of every stage."""
  import math
  from agent_r1_jax.learner.optimizer import lr_schedule
  peak, warm, planned = 3e-3, 20, 1200
  schedule = lr_schedule(peak, warm, total_steps=planned, schedule="cosine")

  def reference(t):
    return peak * t / warm if t < warm else peak * (1 + math.cos(math.pi * (t - warm) / (planned - warm))) / 2

  for t in (0, 10, 20, 300, 700, 1199, 1200):
    assert float(schedule(t)) == pytest.approx(reference(t), abs=1e-9)


def _stream(lengths_per_pool, batch_size, length_group, seed=0):
  """A `BatchStream` over pools of stand-in examples whose prompt + response lengths are given."""
  from types import SimpleNamespace
  from agent_r1_jax.warmup.sft import BatchStream
  pools = [[SimpleNamespace(prompt_ids=np.zeros(4, np.int32), response_ids=np.zeros(n - 4, np.int32))
            for n in lengths] for lengths in lengths_per_pool]
  return BatchStream(pools, batch_size, np.random.default_rng(seed), layout={}, length_group=length_group)


def test_ungrouped_batches_are_the_plain_shuffled_epochs():
  """`length_group=0` draws exactly what a plain loop draws (pool by size, then shuffled epochs per pool), so the
  tiny default's warm-up, tuned on these batches, is unchanged."""
  sizes, batch_size = (37, 11), 4
  stream = _stream([[8 + i for i in range(n)] for n in sizes], batch_size, 0, seed=3)
  rng, orders = np.random.default_rng(3), [[], []]
  weights = np.array(sizes, np.float64) / sum(sizes)
  for _ in range(60):
    k = int(rng.choice(2, p=weights))
    while len(orders[k]) < batch_size:
      orders[k].extend(rng.permutation(sizes[k]).tolist())
    expected, orders[k] = orders[k][:batch_size], orders[k][batch_size:]
    assert stream.next_indices() == (k, expected)


def test_length_grouped_batches_cover_each_epoch_and_hold_length_neighbours():
  """With g = 4 windows of 4 x 8 examples: one epoch (64 examples, 8 batches) serves every example once, and the
  batches cut from one window hold disjoint length ranges (sorted neighbours), so each pads only to its own."""
  rng = np.random.default_rng(0)
  lengths = rng.integers(16, 500, size=64).tolist()
  stream = _stream([lengths], 8, 4)
  for _ in range(2):  # two epochs
    batches = [stream.next_indices()[1] for _ in range(8)]
    assert sorted(i for b in batches for i in b) == list(range(64))
    for window in (batches[:4], batches[4:]):
      ranges = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in window)
      assert all(hi <= lo_next for (_, hi), (lo_next, _) in zip(ranges, ranges[1:]))
  padded = lambda s: sum(8 * max(lengths[i] for i in s.next_indices()[1]) for _ in range(80))
  assert padded(_stream([lengths], 8, 4, seed=1)) < 0.8 * padded(_stream([lengths], 8, 0, seed=1))
