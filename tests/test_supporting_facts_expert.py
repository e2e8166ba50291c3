"""The supporting-facts expert (warm-up episodes on real QA rows) and the real-data warm-up it feeds.

A scripted environment checks the expert's contract (one search per supporting title in order, whole-turn text the
real env parses, only grounded episodes kept); on the shared HotpotQA files the real BM25 environment shows it
finds most supporting passages and that the smollm2-135m preset's data resolve to a held-out split.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from agent_r1_jax.data.supporting_facts_expert import (FINAL_THOUGHT, answer_turn, search_turn,
                                                       supporting_facts_trajectories)
from agent_r1_jax.envs.nous import parse_call
from agent_r1_jax.trainer import assets
from agent_r1_jax.trainer import config as config_lib


class ScriptedSearchEnv:
  """Answers `search(q)` with a passage titled q, except for titles in `misses`; records every batch."""

  assistant_prefix = ""

  def __init__(self, passages: dict[str, str], misses=()):
    self.passages, self.misses, self.batches = passages, set(misses), []

  def batch_step(self, turns):
    self.batches.append(list(turns))
    out = []
    for turn in turns:
      body = turn[turn.index("<tool_call>") + len("<tool_call>"):turn.index("</tool_call>")]
      query = json.loads(body)["arguments"]["query"]
      shown = "Doc 1 (Title: \"Other\") nothing" if query in self.misses else \
          f"Doc 1 (Title: \"{query}\") {self.passages.get(query, '')}"
      out.append((f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{shown}\n</tool_response><|im_end|>\n"
                  f"<|im_start|>assistant\n", [True], True))
    return out


def _row(i, titles, answer):
  return {"id": f"q{i}", "question": f"Question {i}?", "answers": [answer, "alias"], "supporting_titles": titles}


def test_one_search_per_supporting_title_then_the_gold_answer():
  env = ScriptedSearchEnv({"A": "A was born in Paris.", "B": "B is a film.", "C": "C."})
  rows = [_row(0, ["A", "B"], "Paris"), _row(1, ["C"], "yes"), _row(2, [], "x"), _row(3, ["B", "A"], "London"),
          _row(4, ["A", "C"], "no")]
  trajs = supporting_facts_trajectories(rows, env)
  # Row 2 has no titles; row 3's answer is in no observation (an ungrounded answer is never taught).
  assert [t.question["id"] for t in trajs] == ["q0", "q1", "q4"]
  first = trajs[0]
  assert [is_action for _, is_action in first.segments] == [True, False, True, False, True]
  assert first.segments[0][0] == search_turn("A") and first.segments[2][0] == search_turn("B")
  assert first.segments[-1][0] == answer_turn("Paris") == (f"<think>{FINAL_THOUGHT}</think>\n<answer>Paris</answer>"
                                                           f"<|im_end|>")
  assert first.answer == "Paris" and first.grounded and not first.guessed
  # Lock-step: one env batch per hop, holding every row still searching.
  assert [len(batch) for batch in env.batches] == [4, 3]
  # Every search turn is a call the real environment parses, to the `search` tool, with the title as query.
  for text, is_action in first.segments[:-1]:
    if is_action:
      body = text[text.index("<tool_call>") + len("<tool_call>"):text.index("</tool_call>")].strip()
      call = parse_call(body)
      assert call.name == "search" and call.arguments["query"] in ("A", "B")


def test_a_retrieval_miss_drops_the_episode_and_stops_its_searches():
  env = ScriptedSearchEnv({"A": "Paris", "B": "Paris"}, misses={"A"})
  trajs = supporting_facts_trajectories([_row(0, ["A", "B"], "Paris"), _row(1, ["B", "B"], "Paris")], env)
  assert [t.question["id"] for t in trajs] == ["q1"]
  assert [len(batch) for batch in env.batches] == [2, 1]


def test_a_forced_assistant_prefix_is_refused():
  env = ScriptedSearchEnv({})
  env.assistant_prefix = "<think>"
  with pytest.raises(ValueError, match="assistant_prefix"):
    supporting_facts_trajectories([_row(0, ["A"], "x")], env)


@pytest.fixture(scope="module")
def smollm2_task(shared_data, tmp_path_factory, qwen_tokenizer_dir):
  """The smollm2-135m preset's data resolved into a fresh cache (the Qwen tokenizer stands in: no model needed).
  Module-scoped, so it sets AGENT_R1_CACHE itself (conftest's per-test cache is not set up yet)."""
  from agent_r1_jax.trainer import task as task_lib  # pylint: disable=import-outside-toplevel
  c = config_lib.base_config("grpo", "smollm2-135m")
  for name in ("hotpotqa_train", "hotpotqa_dev"):
    if not pathlib.Path(c.data.prepare[name]).is_file():
      pytest.skip(f"{c.data.prepare[name]} not found")
  previous = os.environ.get("AGENT_R1_CACHE")
  os.environ["AGENT_R1_CACHE"] = str(tmp_path_factory.mktemp("cache"))
  try:
    with c.unlocked():
      assets.resolve_data(c)
      c.model.tokenizer_path = str(qwen_tokenizer_dir)
    return c, task_lib.build_task(c)
  finally:
    if previous is None:
      del os.environ["AGENT_R1_CACHE"]
    else:
      os.environ["AGENT_R1_CACHE"] = previous


def test_preset_data_hold_out_every_train_question(smollm2_task):
  c, task = smollm2_task
  norm = lambda q: " ".join(q.lower().split())  # noqa: E731
  train = {norm(e["question"]) for e in task.train}
  held_out = list(task.validation["hotpotqa"])
  assert len(task.train) == 500 and len(held_out) >= 200 and c.trainer.eval_num_examples <= len(held_out)
  assert not train & {norm(e["question"]) for e in held_out}
  assert c.tool.corpus_path.endswith("corpus.jsonl") and c.data.prepared_dir


def test_expert_finds_most_supporting_passages_with_real_bm25(smollm2_task):
  _, task = smollm2_task
  rows = list(task.train)[:60]
  trajs = supporting_facts_trajectories(rows, task.env)
  assert len(trajs) >= 0.7 * len(rows)  # 436 of the 500 here
  for t in trajs:
    observations = [text for text, is_action in t.segments if not is_action]
    assert len(observations) == len(t.question["supporting_titles"])
    assert all(f"\"{title}\"" in obs for title, obs in zip(t.question["supporting_titles"], observations))
