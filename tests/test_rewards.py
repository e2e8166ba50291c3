"""Answer metrics and multi-turn format rewards against hand-computed values."""

from __future__ import annotations

import pytest

from agent_r1_jax.rewards import (compute_score, exact_match, exact_match_any, f1, f1_any, get_scorer,
                                  known_data_sources, normalize_answer, register_scorer)
from agent_r1_jax.rewards import registry

OBS = ("<|im_end|>\n<|im_start|>user\n<tool_response>\nDoc 1 (Title: \"Paris\") Paris is a city.\n"
       "</tool_response><|im_end|>\n<|im_start|>assistant\n")
CALL = '{"name": "search", "arguments": {"query": "capital of France"}}'
TC = f"<think>I should search.</think>\n<tool_call>\n{CALL}\n</tool_call>"


def fin(answer: str, think: str = "I know it now.") -> str:
  return f"<think>{think}</think>\n<answer>{answer}</answer><|im_end|>"


# (name, response, gold, paper (score, format, em), partial_credit (score, format)); hand-computed.
CASES = [
    ("well_formed_correct", TC + OBS + fin("Paris"), "Paris", (1.0, 1.0, 1.0), (1.0, 1.0)),
    ("well_formed_wrong", TC + OBS + fin("London"), "Paris", (0.0, 1.0, 0.0), (0.0, 1.0)),
    ("two_hops_articles_punct", TC + OBS + TC + OBS + fin("the Paris."), "Paris", (1.0, 1.0, 1.0), (1.0, 1.0)),
    ("no_tool_call", fin("Paris"), "Paris", (-0.5, 0.5, 1.0), (0.5, 0.5)),
    ("final_without_think", TC + OBS + "<answer>Paris</answer><|im_end|>", "Paris", (-0.5, 0.5, 1.0),
     (0.5, 0.5)),
    ("final_think_unclosed", TC + OBS + "<think>done\n<answer>Paris</answer><|im_end|>", "Paris",
     (-0.5, 0.5, 1.0), (0.5, 0.5)),
    ("two_answers", TC + OBS + "<think>d</think>\n<answer>Paris</answer><answer>London</answer><|im_end|>",
     "Paris", (-0.5, 0.5, 1.0), (0.5, 0.5)),
    ("tool_json_missing_brace",
     '<think>s</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}\n</tool_call>' + OBS
     + fin("Paris"), "Paris", (-0.5, 0.5, 1.0), (1.0, 1.0)),
    ("tool_arguments_not_object",
     '<think>s</think>\n<tool_call>\n{"name": "search", "arguments": "x"}\n</tool_call>' + OBS + fin("Paris"),
     "Paris", (-0.5, 0.5, 1.0), (1.0, 1.0)),
    ("tool_json_missing_name",
     '<think>s</think>\n<tool_call>\n{"arguments": {"query": "x"}}\n</tool_call>' + OBS + fin("Paris"),
     "Paris", (-0.5, 0.5, 1.0), (1.0, 1.0)),
    ("tool_turn_without_think", f"<tool_call>\n{CALL}\n</tool_call>" + OBS + fin("Paris"), "Paris",
     (-0.5, 0.5, 1.0), (0.5, 0.5)),
    ("truncated_final_turn", TC + OBS + "<think>still thinking about", "Paris", (-0.5, 0.5, 0.0),
     (-1.0, 0.0)),
    ("empty_response", "", "Paris", (-1.0, 0.0, 0.0), (-1.0, 0.0)),
    ("yes_no_correct", TC + OBS + fin("Yes."), "yes", (1.0, 1.0, 1.0), (1.0, 1.0)),
    ("yes_no_substring_trap", TC + OBS + fin("no idea"), "no", (0.0, 1.0, 0.0), (1.0, 1.0)),
    ("alias_match", TC + OBS + fin("nyc"), ["New York City", "NYC"], (1.0, 1.0, 1.0), (1.0, 1.0)),
    ("article_in_gold", TC + OBS + fin("beatles!"), "The Beatles", (1.0, 1.0, 1.0), (1.0, 1.0)),
    ("answer_longer_than_gold", TC + OBS + fin("Paris, France"), "Paris", (0.0, 1.0, 0.0), (1.0, 1.0)),
    ("gold_only_in_think", TC + OBS + fin("Lyon", think="maybe Paris"), "Paris", (0.0, 1.0, 0.0),
     (0.2, 1.0)),
    ("loose_whitespace", TC + OBS + "<think>a</think>  <answer>Paris</answer><|im_end|>", "Paris",
     (1.0, 1.0, 1.0), (0.5, 0.5)),
    ("two_tool_calls_in_one_turn", f"<think>a</think>\n<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL}\n"
     "</tool_call>" + OBS + fin("Paris"), "Paris", (-0.5, 0.5, 1.0), (0.5, 0.5)),
    ("blank_answer", TC + OBS + fin(" "), "Paris", (-0.5, 0.5, 0.0), (0.0, 1.0)),
    ("final_without_answer_tag", TC + OBS + TC + OBS + TC + OBS + "<think>x</think>\nParis<|im_end|>", "Paris",
     (-0.5, 0.5, 0.0), (0.2, 1.0)),
    ("text_after_answer", TC + OBS + "<think>a</think>\n<answer>Paris</answer> I hope<|im_end|>", "Paris",
     (-0.5, 0.5, 1.0), (0.5, 0.5)),
    ("right_padding", TC + OBS + fin("Paris") + "<|endoftext|>" * 3, "Paris", (1.0, 1.0, 1.0), (1.0, 1.0)),
    ("blank_think_in_tool_turn", f"<think> </think>\n<tool_call>\n{CALL}\n</tool_call>" + OBS + fin("Paris"),
     "Paris", (-0.5, 0.5, 1.0), (1.0, 1.0)),
]


@pytest.mark.parametrize("name,response,gold,paper,code", CASES, ids=[c[0] for c in CASES])
def test_compute_score_table(name, response, gold, paper, code):
  del name
  result = compute_score(response, gold)
  assert (result["score"], result["format"], result["em"]) == pytest.approx(paper)
  assert set(result) == {"score", "em", "f1", "substring_acc", "format", "format_answer", "format_tool",
                         "answer"}
  result = compute_score(response, gold, style="partial_credit")
  assert (result["score"], result["format"]) == pytest.approx(code)


def test_format_components_and_answer_extraction():
  result = compute_score(TC + OBS + fin("Paris, France"), "Paris")
  assert result["format_answer"] == 1.0 and result["format_tool"] == 1.0
  assert result["answer"] == "Paris, France"
  assert result["f1"] == pytest.approx(2 / 3)  # P = 1/2, R = 1
  assert result["substring_acc"] == 1.0
  result = compute_score(fin("Paris"), "Paris")
  assert (result["format_answer"], result["format_tool"]) == (1.0, 0.0)
  result = compute_score(TC + OBS + "<think>x", "Paris")
  assert (result["format_answer"], result["format_tool"], result["answer"]) == (0.0, 1.0, None)


@pytest.mark.parametrize("text,expected", [
    ("The  Quick, brown fox!", "quick brown fox"),
    ("An apple a day", "apple day"),
    ("theatre another", "theatre another"),  # articles only as whole words
    ("A.B.C.", "abc"),
    ("U.S. Route 66", "us route 66"),
    ("\u201cParis\u201d", "\u201cparis\u201d"),  # only ASCII punctuation is deleted
    ("  the  ", ""),
    ("Rock-and-roll", "rockandroll"),
])
def test_normalize_answer(text, expected):
  assert normalize_answer(text) == expected


@pytest.mark.parametrize("pred,gold,expected", [
    ("Paris France", "Paris", 2 / 3),
    ("the cat sat", "cat cat", 0.5),  # multiset intersection: one shared "cat"; P = 1/2, R = 1/2
    ("yes", "no", 0.0),
    ("no", "No.", 1.0),
    ("noanswer", "noanswer", 1.0),
    ("yes it is", "yes", 0.0),  # gold is special and differs from the prediction
    ("blue whale", "whale shark", 0.5),
    ("", "x", 0.0),
])
def test_f1(pred, gold, expected):
  assert f1(pred, gold) == pytest.approx(expected)


def test_exact_match_and_aliases():
  assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
  assert exact_match("Eiffel", "eiffel tower") == 0.0
  assert exact_match_any("NYC", ["New York City", "nyc"]) == 1.0
  assert f1_any("New York", ["New York City", "NYC"]) == pytest.approx(0.8)  # P = 1, R = 2/3


def test_registry_and_bad_input(monkeypatch):
  monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))  # registrations stay in this test
  scorer = get_scorer("hotpotqa")
  assert scorer(TC + OBS + fin("Paris"), "Paris")["score"] == 1.0
  code = get_scorer("musique", style="partial_credit")
  assert code(fin("Paris"), "Paris")["score"] == 0.5
  with pytest.raises(ValueError, match="no reward function registered"):
    get_scorer("squad")
  with pytest.raises(ValueError, match="reward style"):
    get_scorer("hotpotqa", style="strict")
  with pytest.raises(ValueError, match="ground_truth"):
    compute_score(fin("x"), [])
  with pytest.raises(ValueError, match="reward style"):
    compute_score(fin("x"), "x", style="nope")
  with pytest.raises(ValueError, match="already registered for data_source 'hotpotqa'"):
    register_scorer("hotpotqa", lambda **options: compute_score)
  register_scorer("test_registry_source", len)
  register_scorer("test_registry_source", len)  # the same factory again is a no-op
  assert "test_registry_source" in known_data_sources()


_PIECES = ["<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<|im_end|>",
           "<|im_start|>", "assistant\n", "user\n", "\n", " ", "Paris", "{", "}", '"name"', ":", "<|endoftext|>",
           CALL, OBS]


def test_compute_score_never_raises_on_model_text():
  hypothesis = pytest.importorskip("hypothesis")
  st = hypothesis.strategies

  @hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
  @hypothesis.given(st.lists(st.sampled_from(_PIECES) | st.text(max_size=5), max_size=30))
  def check(pieces):
    text = "".join(pieces)
    for style in ("paper", "partial_credit"):
      result = compute_score(text, ["Paris"], style=style)
      assert -1.0 <= result["score"] <= 1.0
      assert 0.0 <= result["format"] <= 1.0

  check()
