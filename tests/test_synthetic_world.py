"""The synthetic multi-hop world: determinism, held-out entities, retrievability, the scripted expert, SFT data."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from agent_r1_jax.data import prompts
from agent_r1_jax.data.synthetic import (WorldConfig, expert_trajectories, generate_world, make_search_env,
                                         prepare_synthetic_world, sft_examples)
from agent_r1_jax.retrieval import BM25Index, load_corpus
from agent_r1_jax.rewards import compute_score

SMALL = dict(num_train=300, num_validation=200, num_test=200)


@pytest.fixture(scope="module")
def world_files(synthetic_world):
  return synthetic_world(**SMALL)


@pytest.fixture(scope="module")
def env(world_files):
  return make_search_env(world_files)


def test_same_seed_is_byte_identical_and_seed_matters(tmp_path, world_files):
  again = prepare_synthetic_world(cache_root=tmp_path / "again", **SMALL)
  assert again.root != world_files.root
  names = ["corpus.jsonl", "train.jsonl", "validation.jsonl", "test.jsonl", "tokenizer/tokenizer.json"]
  for name in names:
    assert (again.root / name).read_bytes() == (world_files.root / name).read_bytes(), name
  other = generate_world(WorldConfig.create(seed=1, **SMALL))
  assert [p["text"] for p in other.passages] != [json.loads(l)["contents"].split("\n", 1)[1]
                                                 for l in (world_files.corpus_path).read_text().splitlines()]
  # A second call with the same parameters reuses the cached directory.
  assert prepare_synthetic_world(cache_root=world_files.root.parent, **SMALL).root == world_files.root


def test_splits_do_not_share_question_entities(world_files):
  entities = {s: {e for q in world_files.questions(s) for e in q["question_entities"]}
              for s in ("train", "validation", "test")}
  assert not entities["train"] & entities["validation"]
  assert not entities["train"] & entities["test"]
  assert not entities["validation"] & entities["test"]
  for split in entities:
    for q in world_files.questions(split):
      for name in q["question_entities"]:
        assert name in q["question"]  # named verbatim, so the model can copy it into a search


def test_questions_are_answerable_from_their_supporting_passages(world_files):
  corpus = {p.title: p.text for p in load_corpus(str(world_files.corpus_path))}
  assert len(corpus) == len(load_corpus(str(world_files.corpus_path)))  # one passage per entity
  kinds = set()
  for q in world_files.questions("train") + world_files.questions("test"):
    kinds.add(q["type"])
    assert all(t in corpus for t in q["supporting_titles"])
    if q["type"] == "comparison":  # recompute the answer from the two passages' years
      a, b = q["supporting_titles"]
      year_a, year_b = (int(re.search(r"\b\d{4}\b", corpus[t]).group()) for t in (a, b))
      earlier, later = (a, b) if year_a < year_b else (b, a)
      assert q["answers"] == [earlier if "earlier" in q["question"] else later]
    else:
      assert q["answers"][0] in corpus[q["supporting_titles"][-1]]
    assert 1 <= corpus[q["supporting_titles"][0]].count(". ") + 1 <= 3
  assert kinds == {"bridge", "compositional", "comparison"}


def _queries(trajectory) -> list[str]:
  out = []
  for text, is_action in trajectory.segments:
    if is_action and "<tool_call>" in text:
      body = text.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
      out.append(json.loads(body)["arguments"]["query"])
  return out


def test_expert_queries_retrieve_every_supporting_passage(world_files, env):
  trajectories = expert_trajectories(world_files, "test", env=env)
  index = BM25Index(load_corpus(str(world_files.corpus_path)))
  covered = 0
  for traj in trajectories:
    queries = _queries(traj)
    titles = {h.passage.title for hits in index.search(queries, 5) for h in hits}
    covered += set(traj.question["supporting_titles"]) <= titles
  recall = covered / len(trajectories)
  print(f"questions with every supporting passage in BM25 top-5 of the expert's queries: {recall:.3f}")
  assert recall >= 0.95


def test_expert_is_perfect_at_zero_guess_rate_and_degrades_with_it(world_files, env):
  ems = []
  for rate in (0.0, 0.25, 0.6):
    trajectories = expert_trajectories(world_files, "validation", env=env, guess_rate=rate, seed=3)
    scores = [compute_score(t.response_text, t.question["answers"]) for t in trajectories]
    if rate == 0.0:
      assert len(scores) == 200 and all(s["score"] == 1.0 for s in scores)
      assert all(t.grounded and not t.guessed for t in trajectories)
    ems.append(np.mean([s["em"] for s in scores]))
  print(f"expert EM at guess rates 0 / 0.25 / 0.6: {ems}")
  assert ems[0] == 1.0 and ems[0] > ems[1] > ems[2]


def test_expert_guessing_at_the_start_either_searches_every_hop_or_never(world_files, env):
  trajectories = expert_trajectories(world_files, "validation", env=env, guess_rate=0.5, guess_at="start", seed=3)
  guessed = [t for t in trajectories if t.guessed]
  assert 0.35 < len(guessed) / len(trajectories) < 0.65
  for t in trajectories:
    assert t.num_tool_calls == (0 if t.guessed else len(t.question["hops"]))
  each_hop = expert_trajectories(world_files, "validation", env=env, guess_rate=0.5, seed=3)
  assert any(0 < t.num_tool_calls < len(t.question["hops"]) for t in each_hop)  # the other mode stops midway
  with pytest.raises(ValueError, match="guess_at"):
    expert_trajectories(world_files, "validation", env=env, guess_rate=0.5, guess_at="middle", limit=2)


def test_expert_observations_are_the_env_framing(world_files, env):
  traj = expert_trajectories(world_files, "train", env=env, limit=5)
  for t in traj:
    actions = [text for text, is_action in t.segments if is_action]
    observations = [text for text, is_action in t.segments if not is_action]
    assert len(observations) == len(actions) - 1 == t.num_tool_calls
    for action, observation in zip(actions, observations):
      assert observation == env.step(action)[0]  # replaying the turn gives the same observation
      assert observation.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1 (Title: ")
    assert actions[-1].endswith("</answer><|im_end|>")


def test_sft_examples_match_piecewise_tokenization(world_files, env):
  tokenizer = world_files.load_tokenizer()
  trajectories = expert_trajectories(world_files, "train", env=env, limit=20)
  schemas = env.tool_schemas
  examples = sft_examples(tokenizer, trajectories, schemas)
  assert len(examples) == 20
  for traj, ex in zip(trajectories, examples):
    prompt = tokenizer.apply_chat_template(prompts.build_messages(traj.question["question"]), tools=schemas,
                                           tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(ex.prompt_ids) == prompt
    assert prompt.endswith("<|im_start|>assistant\n") and "<tools>" in prompt
    ids, mask = [], []
    for text, is_action in traj.segments:  # reference: plain loop, one encode per piece
      piece = tokenizer.encode(text, add_special_tokens=False)
      ids += piece
      mask += [int(is_action)] * len(piece)
    np.testing.assert_array_equal(ex.response_ids, ids)
    np.testing.assert_array_equal(ex.action_mask, mask)
    assert tokenizer.decode(ex.response_ids) == traj.response_text
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ex.response_ids[-1] == im_end and ex.action_mask[-1] == 1  # the final EOS is an action
    first_obs = int(np.argmin(ex.action_mask))
    assert ex.response_ids[first_obs] == im_end  # the tool turn's <|im_end|> belongs to the observation


def test_assistant_prefix_env(world_files):
  env = make_search_env(world_files, assistant_prefix="<think>")
  traj = expert_trajectories(world_files, "train", env=env, limit=3)
  for t in traj:
    assert compute_score(t.response_text, t.question["answers"])["score"] == 1.0


def test_config_knobs_and_errors():
  world = generate_world(WorldConfig.create(hop_mix={"comparison": 1.0}, num_train=50, num_validation=10,
                                            num_test=10))
  assert {q["type"] for s in world.splits.values() for q in s} == {"comparison"}
  assert len(world.splits["train"]) == 50
  with pytest.raises(ValueError, match="unknown synthetic-world option"):
    WorldConfig.create(num_planets=3)
  with pytest.raises(ValueError, match="hop_mix"):
    WorldConfig.create(hop_mix={"bridge": 0.0})
  with pytest.raises(ValueError, match="num_validation"):
    generate_world(WorldConfig.create(num_films=4, num_bands=4, num_companies=4, num_people=8,
                                      num_universities=4, num_train=20, num_validation=500))


def test_collate_matches_a_plain_loop(world_files, env):
  from agent_r1_jax.data import collate
  tokenizer = world_files.load_tokenizer()
  examples = sft_examples(tokenizer, expert_trajectories(world_files, "train", env=env, limit=6), env.tool_schemas)
  p = max(len(e.prompt_ids) for e in examples)
  r = sorted(len(e.response_ids) for e in examples)[3]  # some rows are cut
  batch = collate(examples, prompt_length=p + 2, response_length=r, pad_id=0)
  for i, ex in enumerate(examples):
    row = [0] * (p + 2 - len(ex.prompt_ids)) + list(ex.prompt_ids)
    assert list(batch["prompt_ids"][i]) == row
    assert list(batch["prompt_mask"][i]) == [0] * (p + 2 - len(ex.prompt_ids)) + [1] * len(ex.prompt_ids)
    resp = list(ex.response_ids[:r]) + [0] * max(0, r - len(ex.response_ids))
    assert list(batch["response_ids"][i]) == resp
    assert list(batch["action_mask"][i]) == list(ex.action_mask[:r]) + [0] * max(0, r - len(ex.response_ids))
    assert batch["response_mask"][i].sum() == min(r, len(ex.response_ids))
    assert batch["truncated"][i] == (len(ex.response_ids) > r)
  with pytest.raises(ValueError, match="raise the prompt length"):
    collate(examples, prompt_length=p - 1, response_length=r, pad_id=0)


def test_first_turns_is_the_prefix_ending_at_that_turns_last_action(world_files, env):
  from agent_r1_jax.data.sft import first_turns
  tokenizer = world_files.load_tokenizer()
  trajectories = expert_trajectories(world_files, "train", env=env, limit=8)
  examples = sft_examples(tokenizer, trajectories, None)
  for traj, ex in zip(trajectories, examples):
    actions = [text for text, is_action in traj.segments if is_action]
    for k in range(1, len(actions) + 2):
      cut = first_turns(ex, k)
      # Reference: the text of the first k assistant turns and the k-1 observations between them.
      pieces, seen = [], 0
      for text, is_action in traj.segments:
        if seen == k:
          break
        pieces.append(text)
        seen += is_action
      assert tokenizer.decode(cut.response_ids) == "".join(pieces)
      np.testing.assert_array_equal(cut.response_ids, ex.response_ids[:len(cut.response_ids)])
      np.testing.assert_array_equal(cut.action_mask, ex.action_mask[:len(cut.response_ids)])
      assert cut.action_mask[-1] == 1
      np.testing.assert_array_equal(cut.prompt_ids, ex.prompt_ids)
    assert first_turns(ex, 0) is ex


