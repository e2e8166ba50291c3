"""The mixed world's question types (issue #34): each is answerable (the scripted expert solves every question of
every type given perfect retrieval), has the hops its name says, and namesakes make BM25 imperfect the way real
retrieval is while keeping the right passage within reach."""

from __future__ import annotations

import collections
import re

import pytest

from agent_r1_jax.data.synthetic import world as world_lib
from agent_r1_jax.data.synthetic.expert import ScriptedExpert
from agent_r1_jax.retrieval import BM25Index, Passage, SearchHit
from agent_r1_jax.rewards import compute_score

MIX = {"one_hop": 0.1, "bridge": 0.35, "compositional": 0.2, "four_hop": 0.1, "comparison": 0.25}
HOPS = {"one_hop": 1, "bridge": 2, "compositional": 3, "four_hop": 4, "comparison": 2}


@pytest.fixture(scope="module")
def world():
  return world_lib.generate_world(world_lib.WorldConfig.create(hop_mix=MIX, namesake_rate=0.25, num_train=400,
                                                               num_validation=100, num_test=150, seed=4))


class TitleLookup:
  """Perfect retrieval: the passage titled exactly as the query, first."""

  def __init__(self, passages):
    self.by_title = {p["title"]: Passage(p["id"], p["title"], p["text"]) for p in passages}

  def search(self, queries, top_k):
    return [[SearchHit(self.by_title[q], 1.0)] if q in self.by_title else [] for q in queries]


def _env(retriever, top_k):
  from agent_r1_jax.envs import NousToolEnv  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.tools import WikiSearchTool  # pylint: disable=import-outside-toplevel
  return NousToolEnv([WikiSearchTool(retriever, top_k=top_k)], max_tool_response_length=2048)


def test_every_type_is_present_with_its_hops(world):
  for split in world_lib.SPLITS:
    counts = collections.Counter(q["type"] for q in world.splits[split])
    assert set(counts) == set(MIX), (split, counts)
  for q in world.splits["train"]:
    assert len(q["hops"]) == HOPS[q["type"]], q
    if q["type"] != "comparison":  # a chain: each hop queries the previous hop's value
      assert all(h["query"] == prev["value"] for prev, h in zip(q["hops"], q["hops"][1:])), q


def test_the_expert_solves_every_type_given_perfect_retrieval(world):
  expert = ScriptedExpert(_env(TitleLookup(world.passages), top_k=1), guess_pools={})
  trajectories = expert.run(world.splits["test"])
  solved = collections.Counter()
  for t in trajectories:
    assert t.grounded and not t.guessed, t.question["question"]
    assert t.num_tool_calls == HOPS[t.question["type"]]
    if compute_score(t.response_text, t.question["answers"])["em"] == 1.0:
      solved[t.question["type"]] += 1
  assert solved == collections.Counter(q["type"] for q in world.splits["test"])


def test_a_comparisons_last_thought_copies_the_first_year_and_compares_in_question_order(world):
  """The final thought repeats the sentence of the second turn that read the first entity's year (a copy, not a
  recall), then compares the two years as the passages give them, first entity first."""
  passages = {p["title"]: p["text"] for p in world.passages}
  expert = ScriptedExpert(_env(TitleLookup(world.passages), top_k=1), guess_pools={})
  comparisons = [q for q in world.splits["test"] if q["type"] == "comparison"]
  assert len(comparisons) >= 20
  words = collections.Counter()
  for t in expert.run(comparisons):
    a, b = t.question["supporting_titles"]
    year_a, year_b = (re.search(r"\b(\d{4})\b", passages[title]).group(1) for title in (a, b))
    actions = [text for text, is_action in t.segments if is_action]
    restated = re.search(r"(The \w+ year of " + re.escape(a) + r" is \d{4}\.)", actions[1]).group(1)
    assert restated.endswith(f" {year_a}.") and restated in actions[2]
    word = "earlier" if int(year_a) < int(year_b) else "later"
    words[word] += 1
    asked = "earlier" if "earlier" in t.question["question"] else "later"
    answer = a if word == asked else b
    assert f"{restated} {year_a} is {word} than {year_b}, so the answer is {answer}." in actions[2]
    assert t.answer == answer == t.question["answers"][0]
  assert words["earlier"] and words["later"]


def test_namesakes_make_bm25_imperfect_but_keep_the_passage_in_reach(world):
  """A search for an entity with a namesake returns the namesake's passage too, often first (it names the
  original twice), and the right passage within the top 2; without namesakes every name ranks its own first."""
  index = BM25Index([Passage(p["id"], p["title"], p["text"]) for p in world.passages])
  names = {e.name for e in world.entities.values()}
  originals = sorted({e.attrs.get("sequel_of") or e.attrs.get("parent") for e in world.entities.values()} - {None})
  assert len(originals) >= 20 and all(n in names for n in originals)
  for e in world.entities.values():
    origin = e.attrs.get("sequel_of") or e.attrs.get("parent")
    if origin:
      assert origin in world_lib.passage_text(e)  # named in passing
  hits = index.search(originals, 2)
  first_right = sum(h[0].passage.title == name for name, h in zip(originals, hits))
  in_top2 = sum(name in {x.passage.title for x in h} for name, h in zip(originals, hits))
  assert in_top2 == len(originals)
  assert first_right < 0.9 * len(originals), (first_right, len(originals))

  plain = world_lib.generate_world(world_lib.WorldConfig.create(hop_mix=MIX, num_train=400, num_validation=100,
                                                                num_test=150, seed=4))
  plain_index = BM25Index([Passage(p["id"], p["title"], p["text"]) for p in plain.passages])
  films = [e.name for e in plain.entities.values() if e.kind in ("film", "company")]
  assert all(h[0].passage.title == n for n, h in zip(films, plain_index.search(films, 1)))


def test_worlds_without_the_new_options_are_unchanged():
  """The options default to off and leave the cache key of an existing world as it was (so no cached world,
  tokenizer or run is invalidated); a mix with the new kinds changes it."""
  assert "namesake_rate" not in world_lib.WorldConfig().to_dict()
  assert world_lib.WorldConfig(namesake_rate=0.1).cache_key() != world_lib.WorldConfig().cache_key()
  with pytest.raises(ValueError, match="namesake_rate"):
    world_lib.WorldConfig.create(namesake_rate=1.5)


def test_evaluation_reports_em_per_question_type():
  """`summarize` adds EM per type (a hand-counted case), the report a per-type table; records without types
  (the real data sets) add nothing."""
  from agent_r1_jax.evaluation import report  # pylint: disable=import-outside-toplevel
  from agent_r1_jax.rollout.evaluation import EpisodeRecord, summarize  # pylint: disable=import-outside-toplevel

  def record(kind, em):
    from agent_r1_jax.rollout.evaluation import RECORD_METRICS  # pylint: disable=import-outside-toplevel
    scores = {**{k: 1.0 for k in RECORD_METRICS}, "em": em}
    return EpisodeRecord(example_id="x", data_source="synthetic_multihop", question="q", answers=["a"], prompt="",
                         response="", scores=scores, num_turns=1, num_tool_calls=0, num_tool_errors=0,
                         stop_reason=0, question_type=kind)

  records = ([record("bridge", 1.0)] * 3 + [record("bridge", 0.0)] + [record("four_hop", 0.0)] * 2
             + [record("comparison", 1.0)])
  summary = summarize(records)
  assert summary["em"] == 4 / 7
  assert {k: v for k, v in summary.items() if k.startswith(("em_", "num_")) and k != "num_examples"} == {
      "em_bridge": 0.75, "num_bridge": 4.0, "em_comparison": 1.0, "num_comparison": 1.0, "em_four_hop": 0.0,
      "num_four_hop": 2.0}
  table = report.type_table({"agent": {"synthetic_multihop": summary}})
  assert table.splitlines()[0] == "| method | dataset | EM bridge | EM 4-hop | EM comparison |"
  assert table.splitlines()[2] == "| agent | synthetic_multihop | 0.7500 (4) | 0.0000 (2) | 1.0000 (1) |"
  untyped = summarize([record("", 1.0)])
  assert not any(k.startswith("em_") for k in untyped)
  assert report.type_table({"agent": {"hotpotqa": untyped}}) == ""
