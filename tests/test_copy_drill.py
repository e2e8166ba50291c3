"""The copy drill: examples whose assistant turn is a copy of names read in the user turn, and its warm-up stage."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from agent_r1_jax.data.synthetic import prepare_synthetic_world
from agent_r1_jax.data.synthetic.copy_drill import copy_drill_examples, random_names

SMALL = dict(num_train=40, num_validation=10, num_test=10)


@pytest.fixture(scope="module")
def world_files(tmp_path_factory):
  return prepare_synthetic_world(cache_root=tmp_path_factory.mktemp("worlds"), **SMALL)


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
  from agent_r1_jax.trainer.sft import COPY_DRILL, Stage, parse_stages, run_sft
  stages = parse_stages("copy:200:32,1:10:4,all:5:2")
  assert stages == [Stage(COPY_DRILL, 200, 32), Stage(1, 10, 4), Stage(0, 5, 2)]
  assert [s.is_copy_drill for s in stages] == [True, False, False]
  with pytest.raises(ValueError, match="copy-drill examples"):
    run_sft(None, None, [object()], stages=stages, lr=1e-3, warmup_steps=0, weight_decay=0.0, prompt_length=8,
            response_length=8, pad_id=0, seed=0)
