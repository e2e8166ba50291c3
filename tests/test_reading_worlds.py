"""One-hop reading episodes in fresh worlds: questions, grounded expert episodes, and facts that differ from the
task's world."""

from __future__ import annotations

import re

import pytest

from agent_r1_jax.data.synthetic import WorldConfig, generate_world
from agent_r1_jax.data.synthetic.reading import fresh_world_configs, one_hop_questions, one_hop_trajectories

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
