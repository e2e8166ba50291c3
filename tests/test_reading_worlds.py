"""One-hop reading in fresh worlds (questions, grounded expert episodes, facts that differ from the task's world),
its naive-RAG form, and the held-out one-hop evaluation set."""

from __future__ import annotations

import re

import pytest

from agent_r1_jax.data.synthetic import WorldConfig, generate_world, prepare_synthetic_world
from agent_r1_jax.data.synthetic.world import RELATION_PHRASES
from agent_r1_jax.data.synthetic.reading import (fresh_world_configs, held_out_one_hop, naive_rag_examples,
                                                 one_hop_questions, one_hop_trajectories)

CONFIG = WorldConfig.create(num_train=50, num_validation=10, num_test=10)
ENV = dict(top_k=2, max_tool_response_length=600)


def test_fresh_worlds_have_other_seeds_and_no_questions_of_their_own():
  configs = fresh_world_configs(CONFIG, 3)
  seeds = [c.seed for c in configs]
  assert len(set(seeds)) == 3 and CONFIG.seed not in seeds
  assert all(c.num_train == c.num_validation == c.num_test == 0 and c.num_people == CONFIG.num_people
             for c in configs)
  assert fresh_world_configs(CONFIG, 0) == []
  with pytest.raises(ValueError, match="fresh worlds"):
    fresh_world_configs(CONFIG, -1)


def test_one_hop_questions_ask_a_fact_the_entity_passage_states():
  world = generate_world(fresh_world_configs(CONFIG, 1)[0])
  passages = {p["title"]: p["text"] for p in world.passages}
  questions = one_hop_questions(world, 200, seed=0)
  assert len({q["question"] for q in questions}) == 200
  for q in questions:
    (hop,) = q["hops"]
    assert q["answers"] == [hop["value"]] == [world.entities[hop["query"]].attrs[hop["relation"]]]
    assert hop["query"] in q["question"] and hop["value"] in passages[hop["query"]]
  with pytest.raises(ValueError, match="facts"):
    one_hop_questions(world, 10**6)


def test_the_expert_reads_the_answer_out_of_its_observation():
  trajectories = one_hop_trajectories(CONFIG, worlds=2, per_world=30, env_options=ENV)
  assert len(trajectories) == 60
  for t in trajectories:
    (hop,) = t.question["hops"]
    actions = [text for text, is_action in t.segments if is_action]
    observations = [text for text, is_action in t.segments if not is_action]
    assert len(actions) == 2 and len(observations) == 1
    assert f'"query": "{hop["query"]}"' in actions[0]
    assert t.grounded and hop["value"] in observations[0]
    assert re.search(r"<answer>(.*)</answer>", actions[1]).group(1) == hop["value"] == t.answer


def test_fresh_facts_contradict_the_task_world_so_they_cannot_be_memorised():
  """Entities whose names the fresh world shares with the task's world mostly have other facts there."""
  task = generate_world(CONFIG)
  fresh = generate_world(fresh_world_configs(CONFIG, 1)[0])
  shared = [n for n in fresh.entities if n in task.entities and fresh.entities[n].kind == "person"]
  assert len(shared) > 20
  same = sum(fresh.entities[n].attrs["birthplace"] == task.entities[n].attrs["birthplace"] for n in shared)
  assert same < 0.2 * len(shared)


@pytest.fixture(scope="module")
def world_files(tmp_path_factory):
  return prepare_synthetic_world(cache_root=tmp_path_factory.mktemp("worlds"), num_train=50, num_validation=10,
                                 num_test=10)


def test_naive_rag_examples_answer_from_passages_in_the_user_turn(world_files):
  """The prompt is the evaluation's naive-RAG prompt (the question's retrieved passages in the user turn, no
  tools); the response is one turn naming the fact, and the answer is in the passages it was shown."""
  tok = world_files.load_tokenizer()
  examples = naive_rag_examples(tok, world_files.config, worlds=1, per_world=40, env_options=ENV)
  assert 30 <= len(examples) <= 40  # questions whose passages miss the answer are dropped
  fresh = generate_world(fresh_world_configs(world_files.config, 1)[0])
  asked = "|".join(re.escape(phrase.format("").strip()) for phrase in RELATION_PHRASES.values())
  for ex in examples:
    prompt = tok.decode(ex.prompt_ids.tolist())
    response = tok.decode(ex.response_ids.tolist())
    user = re.search(r"<\|im_start\|>user\n(.*)<\|im_end\|>\n<\|im_start\|>assistant\n$", prompt, re.S).group(1)
    question = re.match(rf"Question: What is (?:{asked}) (.*)\?\nPassages:\n", user)
    assert question and "Doc 1 (Title:" in user and "<tools>" not in prompt
    answer = re.fullmatch(r"<think>(.*)</think>\n<answer>(.*)</answer><\|im_end\|>", response, re.S).group(2)
    assert answer in user.split("Passages:\n", 1)[1]
    entity = fresh.entities[question.group(1)]  # the fact is the fresh world's, stated in the passages
    assert answer in entity.attrs.values()
    assert ex.action_mask.tolist() == [1] * len(ex.response_ids)


def test_held_out_one_hop_asks_about_the_test_anchors_only(world_files):
  world = world_files.world()
  test = world_files.questions("test")
  anchors = {name for q in test for name in q["question_entities"]}
  trained = {name for q in world_files.questions("train") for name in q["question_entities"]}
  questions = held_out_one_hop(world, test)
  assert len(questions) == len(test) and len({q["question"] for q in questions}) == len(test)
  for q in questions:
    (hop,) = q["hops"]
    assert hop["query"] in anchors and hop["query"] not in trained
    assert q["answers"] == [world.entities[hop["query"]].attrs[hop["relation"]]]
    assert q["data_source"] == "synthetic_one_hop"
  assert held_out_one_hop(world, test) == questions  # deterministic
