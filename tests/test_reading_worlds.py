"""One-hop reading in fresh worlds (questions, grounded expert episodes, facts that differ from the task's world),
its naive-RAG form, and the held-out one-hop evaluation set."""

from __future__ import annotations

import re

import pytest

from agent_r1_jax.data.synthetic import WorldConfig, generate_world
from agent_r1_jax.data.synthetic.templates import RELATION_PHRASES
from agent_r1_jax.data.synthetic.reading import (blended_relation_mix, fresh_world_configs, held_out_one_hop,
                                                 multi_hop_reading, naive_rag_examples, one_hop_questions,
                                                 one_hop_trajectories, relation_counts, relation_fact_counts,
                                                 task_relation_mix)

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


def test_relation_counts_follow_the_weights_and_hand_the_excess_of_a_short_relation_to_the_others():
  """40 questions weighted 1 : 1 : 2 over a, b, c, where b states only 5 facts: b gets its 5; the other 35 split
  1 : 2 (11.67 and 23.33), the larger remainder rounding up: 12 and 23."""
  assert relation_counts({"a": 1, "b": 1, "c": 2}, {"a": 100, "b": 5, "c": 100}, 40) == {"a": 12, "b": 5, "c": 23}
  assert relation_counts({"a": 3, "b": 1}, {"a": 100, "b": 100}, 8) == {"a": 6, "b": 2}
  assert relation_counts({"a": 0, "b": 1}, {"a": 100, "b": 100}, 7) == {"b": 7}  # weight 0: never asked
  assert relation_counts({"a": 1, "b": 1}, {"a": 2, "b": 3}, 5) == {"a": 2, "b": 3}  # every fact taken
  with pytest.raises(ValueError, match="only 5 such facts"):
    relation_counts({"a": 1, "b": 1, "c": 0}, {"a": 2, "b": 3, "c": 100}, 6)


def test_the_task_mix_counts_every_hop_of_every_question():
  questions = [{"hops": [{"relation": "employer"}, {"relation": "founder"}]},
               {"hops": [{"relation": "director"}, {"relation": "birth_year"}]},
               {"hops": [{"relation": "employer"}, {"relation": "headquarters"}]}]
  assert task_relation_mix(questions) == {"employer": 2, "founder": 1, "director": 1, "birth_year": 1,
                                          "headquarters": 1}


def test_the_blended_mix_keeps_the_task_share_and_gives_every_stated_relation_a_floor():
  """Task hops 3 employer : 1 founder, facts 2 employer : 1 founder : 1 release_year, share 1/4:
  employer 3/4 * 3/4 + 1/4 * 2/4 = 0.6875, founder 3/4 * 1/4 + 1/4 * 1/4 = 0.25, release_year 1/4 * 1/4."""
  mix = blended_relation_mix({"employer": 3, "founder": 1}, {"employer": 2, "founder": 1, "release_year": 1}, 0.25)
  assert mix == pytest.approx({"employer": 0.6875, "founder": 0.25, "release_year": 0.0625})
  assert blended_relation_mix({"a": 2}, {"a": 1, "b": 1}, 0.0) == {"a": 1.0, "b": 0.0}
  assert blended_relation_mix({"a": 2}, {"a": 1, "b": 3}, 1.0) == {"a": 0.25, "b": 0.75}
  with pytest.raises(ValueError, match="uniform_share"):
    blended_relation_mix({"a": 1}, {"a": 1}, 1.5)


def test_fact_counts_are_what_a_uniform_draw_over_every_fact_samples_from():
  world = generate_world(fresh_world_configs(CONFIG, 1)[0])
  counts = relation_fact_counts(world)
  everything = one_hop_questions(world, sum(counts.values()), seed=1)  # the uniform draw of every fact
  asked = [q["hops"][0]["relation"] for q in everything]
  assert counts == {r: asked.count(r) for r in set(asked)}


def test_a_relation_mix_sets_how_often_each_relation_is_asked():
  world = generate_world(fresh_world_configs(CONFIG, 1)[0])
  mix = {"employer": 3, "director": 1, "origin": 0}
  questions = one_hop_questions(world, 120, seed=4, relation_mix=mix)
  asked = [q["hops"][0]["relation"] for q in questions]
  assert asked.count("employer") == 90 and asked.count("director") == 30 and len({q["id"] for q in questions}) == 120
  assert len({q["question"] for q in questions}) == 120
  assert questions == one_hop_questions(world, 120, seed=4, relation_mix=mix)
  assert asked[:30] != ["director"] * 30  # shuffled, not grouped by relation (sorted, directors come first)
  for q in questions:
    (hop,) = q["hops"]
    assert q["answers"] == [world.entities[hop["query"]].attrs[hop["relation"]]]


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


def test_multi_hop_reading_searches_every_hop_and_leaves_the_first_turn_untrained():
  """Every hop is searched (no guesses), each value the expert writes was in the observation just before it, and
  the first assistant turn (the decision to search) is context: [turn 1, obs 1, turn 2, obs 2, ...] is flagged
  [False, False, True, False, True, ...]."""
  trajectories = multi_hop_reading(CONFIG, worlds=2, per_world=20, env_options=ENV)
  assert len(trajectories) == 40
  for t in trajectories:
    hops = t.question["hops"]
    assert [is_action for _, is_action in t.segments] == [False] + [False, True] * len(hops)
    turns = t.segments[0::2]
    observations = [text for text, _ in t.segments[1::2]]
    for hop, turn, observation in zip(hops, turns, observations):
      assert f'"query": "{hop["query"]}"' in turn[0] and hop["value"] in observation
    assert not t.guessed and t.grounded and t.answer == t.question["answers"][0]
    assert re.search(r"<answer>(.*)</answer>", turns[-1][0]).group(1) == t.answer
  kinds = {t.question["type"] for t in trajectories}
  assert kinds <= {"bridge", "compositional", "comparison"} and len(kinds) >= 2  # the task's own hop mix
  practice = {c.seed for c in fresh_world_configs(CONFIG, 2, num_questions=20, seed_offset=2000)}
  assert not practice & ({c.seed for c in fresh_world_configs(CONFIG, 50)} | {CONFIG.seed})
  assert multi_hop_reading(CONFIG, worlds=2, per_world=20, env_options=ENV) == trajectories  # deterministic


def test_fresh_facts_contradict_the_task_world_so_they_cannot_be_memorised():
  """Entities whose names the fresh world shares with the task's world mostly have other facts there."""
  task = generate_world(CONFIG)
  fresh = generate_world(fresh_world_configs(CONFIG, 1)[0])
  shared = [n for n in fresh.entities if n in task.entities and fresh.entities[n].kind == "person"]
  assert len(shared) > 20
  same = sum(fresh.entities[n].attrs["birthplace"] == task.entities[n].attrs["birthplace"] for n in shared)
  assert same < 0.2 * len(shared)


@pytest.fixture(scope="module")
def world_files(synthetic_world):
  return synthetic_world(num_train=50, num_validation=10, num_test=10)


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
