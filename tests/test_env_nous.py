"""NousToolEnv: chat-template equivalence with the real Qwen2.5 tokenizer, error observations, batching."""

from __future__ import annotations

import json
import socket
import sys
import time

import pytest

from agent_r1_jax.envs import NousToolEnv
from agent_r1_jax.retrieval import BM25Index, HttpRetriever, Passage
from agent_r1_jax.tools import BaseTool, ToolResult, WikiSearchTool
from agent_r1_jax.tools import errors

PASSAGES = [
    Passage("0", "Paris", 'Paris is the capital and largest city of France. It hosts the "Louvre".'),
    Passage("1", "Berlin", "Berlin is the capital of Germany.\nIt has 3.7 million inhabitants."),
    Passage("2", "Tinted Windows (band)", "Tinted Windows was an American pop-rock supergroup formed in 2008."),
    Passage("3", "Tulsa, Oklahoma", "Tulsa is the second-largest city in the state of Oklahoma."),
    Passage("4", "Rome", "Rome is the capital city of Italy."),
    Passage("5", "Madrid", "Madrid is the capital of Spain; it lies on the Manzanares river."),
]


class EchoTool(BaseTool):
  """Deterministic tool: echoes its text argument; raises on 'boom'."""

  name = "echo"
  description = "Echo a text."
  parameters = {"type": "object", "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
                "required": ["text"]}

  def execute(self, args):
    if args["text"] == "boom":
      raise RuntimeError("exploded")
    return ToolResult(args["text"] * args.get("times", 1), True)


class SleepyTool(BaseTool):
  name = "sleepy"
  description = "Sleeps."
  parameters = {"type": "object", "properties": {}, "required": []}

  def execute(self, args):
    time.sleep(5)
    return ToolResult("woke up", True)


@pytest.fixture(scope="module")
def search_tool():
  return WikiSearchTool(BM25Index(PASSAGES), top_k=2)


def _call(name, arguments):
  return NousToolEnv.render_call(name, arguments)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# --- Done means 1: token-for-token equality with the chat template ----------------------------------
def _ids(tok, text):
  return tok(text, add_special_tokens=False)["input_ids"]


def _template_ids(tok, messages, tools):
  text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
  return text, _ids(tok, text)


@pytest.mark.parametrize("thought,queries,close_turn", [
    ("<think>I need the city of the band's first show.</think>", ["Tinted Windows band first performance"], False),
    ("", ["capital of France"], False),
    ("Let me look both up.", ["capital of Germany", "capital of Italy"], False),
    ("<think>search</think>", ["Madrid river"], True),
])
def test_observation_tokenizes_like_chat_template(qwen_tokenizer_dir, search_tool, thought, queries, close_turn):
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
  tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))
  env = NousToolEnv([search_tool], max_tool_response_length=80, parallel_tool_calls=len(queries) > 1)
  messages = [{"role": "user", "content": "Where did the band Tinted Windows first perform?"}]
  prompt, prompt_ids = _template_ids(tok, messages, env.tool_schemas)
  assert prompt.endswith("<|im_start|>assistant\n")

  # What the model writes: its content, then each call as the template itself renders tool calls.
  segment = thought + "".join(("\n" if (thought or i) else "") + _call("search", {"query": q})
                              for i, q in enumerate(queries))
  if close_turn:
    segment += "<|im_end|>"
  observation, successes, active = env.step(segment)
  assert active and successes == [True] * len(queries)

  # Reference: the conversation with a real assistant tool_calls message and tool messages whose
  # content is the tool result cut to max_tool_response_length (computed here, independently).
  contents = []
  for q in queries:
    text = search_tool.call({"query": q}).content
    contents.append(text if len(text) <= 80 else text[:77] + "...")
  assert any(len(search_tool.call({"query": q}).content) > 80 for q in queries)  # truncation exercised
  conversation = messages + [
      {"role": "assistant", "content": thought,
       "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": q}}}
                      for q in queries]}] + [{"role": "tool", "content": c} for c in contents]
  ref_text, ref_ids = _template_ids(tok, conversation, env.tool_schemas)

  assert prompt + segment + observation == ref_text
  # Tokenized piece by piece (as the rollout does: prompt once, sampled ids, observation once) ...
  assert prompt_ids + _ids(tok, segment) + _ids(tok, observation) == ref_ids
  # ... and as one string.
  assert _ids(tok, prompt + segment + observation) == ref_ids


def test_two_turns_and_forced_prefix(qwen_tokenizer_dir, search_tool):
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
  tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))
  env = NousToolEnv([search_tool], max_tool_response_length=10_000)
  messages = [{"role": "system", "content": "Answer with <answer>...</answer>."},
              {"role": "user", "content": "Which city is the capital of Spain?"}]
  prompt, _ = _template_ids(tok, messages, env.tool_schemas)
  seg1 = _call("search", {"query": "capital of Spain"})
  obs1, _, _ = env.step(seg1)
  seg2 = _call("search", {"query": "Madrid river"})
  obs2, _, _ = env.step(seg2)
  conversation = list(messages)
  for q in ("capital of Spain", "Madrid river"):
    conversation.append({"role": "assistant", "content": "",
                         "tool_calls": [{"type": "function",
                                         "function": {"name": "search", "arguments": {"query": q}}}]})
    conversation.append({"role": "tool", "content": search_tool.call({"query": q}).content})
  ref_text, ref_ids = _template_ids(tok, conversation, env.tool_schemas)
  assert prompt + seg1 + obs1 + seg2 + obs2 == ref_text
  assert _ids(tok, prompt + seg1 + obs1 + seg2 + obs2) == ref_ids

  thinking = NousToolEnv([search_tool], assistant_prefix="<think>\n")
  obs, _, _ = thinking.step(seg1)
  assert obs == obs1 + "<think>\n"


def test_final_answer_is_inactive(search_tool):
  env = NousToolEnv([search_tool])
  for text in ["<answer>Paris</answer><|im_end|>", "", "I think <tool_call> is how you call tools.",
               '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}']:  # unclosed call = no call
    assert env.step(text) == ("", [], False)
    assert env.stop(text)
  assert not env.stop(_call("search", {"query": "x"}))


# --- Done means 2: every bad call becomes a distinct error observation -----------------------------
def test_bad_calls_become_distinct_error_observations(search_tool):
  port = _free_port()  # nothing listens here
  offline = WikiSearchTool(HttpRetriever(f"http://127.0.0.1:{port}", timeout_s=2.0), top_k=2)
  offline.name = "offline_search"
  env = NousToolEnv([search_tool, EchoTool(), SleepyTool(timeout_s=0.2), offline], max_tool_response_length=10_000)
  cases = {
      "invalid_json": '<tool_call>\n{"name": "search", "arguments": {"query": "x"}\n</tool_call>',
      "not_object": "<tool_call>[\"search\", {\"query\": \"x\"}]</tool_call>",
      "missing_name": '<tool_call>{"arguments": {"query": "x"}}</tool_call>',
      "missing_arguments": '<tool_call>{"name": "search"}</tool_call>',
      "arguments_not_object": '<tool_call>{"name": "search", "arguments": "capital of France"}</tool_call>',
      "unknown_tool": _call("browse", {"url": "http://x"}),
      "invalid_arguments": _call("search", {"query": 42}),
      "arguments_too_large": _call("search", {"query": "paris " * 2000}),
      "tool_exception": _call("echo", {"text": "boom"}),
      "timeout": _call("sleepy", {}),
      "unavailable": _call("offline_search", {"query": "x"}),
  }
  assert set(cases) == set(errors.PREFIXES)
  texts = {}
  for kind, response in cases.items():
    observation, successes, active = env.step(response)
    assert active and successes == [False], kind
    body = observation.split("<tool_response>\n", 1)[1].rsplit("\n</tool_response>", 1)[0]
    assert errors.PREFIXES[kind] in body, (kind, body)
    others = [k for k, p in errors.PREFIXES.items() if k != kind and p in body]
    assert not others, (kind, others, body)
    texts[kind] = body
  assert len(set(texts.values())) == len(texts)
  assert '"browse"' in texts["unknown_tool"] and "search, echo, sleepy" in texts["unknown_tool"]
  assert "query" in texts["invalid_arguments"] and "integer" not in texts["arguments_too_large"]
  assert "RuntimeError: exploded" in texts["tool_exception"]


@pytest.fixture
def default_int_digits_limit():
  """Python's default int_max_str_digits (4300) for the test, whatever the interpreter was started with."""
  previous = sys.get_int_max_str_digits()
  sys.set_int_max_str_digits(4300)
  yield
  sys.set_int_max_str_digits(previous)


def test_pathological_json_is_an_invalid_json_observation(default_int_digits_limit):
  """Defects caught: a ValueError (an over-long integer literal) or RecursionError (deep nesting) escaping the
  parser or reported as another error kind, and a lone surrogate echoed into an observation that cannot be
  encoded (so not tokenized). Each case has one fixed outcome."""
  env = NousToolEnv([EchoTool()])
  cases = [
      ('{"name": "echo", "arguments": {"text": "a", "times": ' + "9" * 5000 + "}}", "invalid_json"),
      ("[" * 100_000, "invalid_json"),  # json.loads raises RecursionError
  ]
  for body, kind in cases:
    obs, ok, active = env.step(f"<tool_call>{body}</tool_call>")
    assert active and ok == [False], body[:60]
    assert errors.PREFIXES[kind] in obs
    assert not [k for k, p in errors.PREFIXES.items() if k != kind and p in obs]
  assert "4300 digits" in env.step(f"<tool_call>{cases[0][0]}</tool_call>")[0]
  assert "nested too deeply" in env.step(f"<tool_call>{cases[1][0]}</tool_call>")[0]
  # A lone surrogate is valid JSON: the echo succeeds and the surrogate becomes "?" (UTF-8 "replace").
  obs, ok, active = env.step('<tool_call>{"name": "echo", "arguments": {"text": "a\\ud800b"}}</tool_call>')
  assert active and ok == [True]
  assert "<tool_response>\na?b\n</tool_response>" in obs
  obs.encode("utf-8")  # encodable, so tokenizable


def test_truncation_and_parallel_calls():
  env = NousToolEnv([EchoTool()], max_tool_response_length=10)
  obs, ok, active = env.step(_call("echo", {"text": "abcdefghijklmnop"}) + _call("echo", {"text": "z"}))
  assert active and ok == [True]  # only the first call runs by default
  assert obs.count("<tool_response>") == 1 and "\nabcdefg...\n" in obs
  par = NousToolEnv([EchoTool()], max_tool_response_length=10, parallel_tool_calls=True)
  obs, ok, _ = par.step(_call("echo", {"text": "abc"}) + "\n" + _call("nope", {}) + _call("echo", {"text": "z"}))
  assert ok == [True, False, True]
  assert obs.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\nabc\n</tool_response>\n<tool_response>\n")
  assert obs.endswith("<tool_response>\nz\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_env_rejects_bad_setup():
  with pytest.raises(ValueError, match="unique"):
    NousToolEnv([EchoTool(), EchoTool()])
  with pytest.raises(ValueError, match="max_tool_response_length"):
    NousToolEnv([EchoTool()], max_tool_response_length=0)
  with pytest.raises(TypeError, match="str"):
    NousToolEnv([EchoTool()]).step(None)  # type: ignore[arg-type]


# --- Done means 3: batch_step == step row by row, in order -----------------------------------------
class CountingSearch(WikiSearchTool):
  """Records how many batched searches were made and how many queries each had."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.batches = []

  def batch_execute(self, args_list):
    self.batches.append(len(args_list))
    return super().batch_execute(args_list)


def test_batch_step_matches_step_and_batches_per_tool():
  search = CountingSearch(BM25Index(PASSAGES), top_k=2)
  env = NousToolEnv([search, EchoTool()], max_tool_response_length=60, parallel_tool_calls=True)
  responses = [
      _call("search", {"query": "capital of France"}),
      "<answer>Rome</answer><|im_end|>",
      _call("echo", {"text": "hi", "times": 3}) + _call("search", {"query": "Berlin inhabitants"}),
      _call("echo", {"text": "boom"}),
      "<tool_call>{oops}</tool_call>",
      _call("search", {"query": "zzzz qqqq"}) + "<|im_end|>",
      _call("search", {"query": ["not", "a", "string"]}),
  ]
  expected = [env.step(r) for r in responses]
  search.batches.clear()
  assert env.batch_step(responses) == expected
  assert search.batches == [3]  # the three valid search calls of the batch went in ONE batched search
  assert expected[1] == ("", [], False)
  assert "No results found." in expected[5][0] and expected[5][0].startswith("\n<|im_start|>user")


# --- Done means 2 (fuzz): no exception, one result per input ----------------------------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402  pylint: disable=g-import-not-at-top

_FRAGMENTS = ["<tool_call>", "</tool_call>", "<|im_end|>", "<think>", "</think>", "\n", " ", "{", "}", '"', ":",
              ",", "[", "]", "null", "true", '"name"', '"arguments"', '"search"', '"echo"', '"query"', '"text"',
              "\\", "\\u00e9", "\\ud800", "1e999", "-0", "é", "🙂"]
_VALID = [_call("search", {"query": "capital of France"}), _call("echo", {"text": "hi"}),
          _call("echo", {"text": "boom"}), _call("search", {"query": ""}), _call("echo", {"text": "x", "times": -2})]


@st.composite
def responses(draw):
  kind = draw(st.integers(0, 3))
  if kind == 0:  # random text built from format fragments
    return "".join(draw(st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=6)), max_size=30)))
  if kind == 1:  # a valid call, mutated by deleting / inserting / replacing characters
    text = list(draw(st.sampled_from(_VALID)))
    for _ in range(draw(st.integers(1, 4))):
      pos = draw(st.integers(0, len(text)))
      op = draw(st.integers(0, 2))
      if op == 0 and pos < len(text):
        del text[pos]
      elif op == 1:
        text.insert(pos, draw(st.sampled_from(_FRAGMENTS + ["a", "0"])))
      elif pos < len(text):
        text[pos] = draw(st.characters())
    return "".join(text)
  if kind == 2:  # a structurally valid call with arbitrary JSON values
    obj = draw(st.dictionaries(st.sampled_from(["name", "arguments", "x"]),
                               st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                                            lambda c: st.lists(c, max_size=3) | st.dictionaries(
                                                st.sampled_from(["query", "text", "times"]), c, max_size=3),
                                            max_leaves=6), max_size=3))
    return "<tool_call>" + json.dumps(obj) + "</tool_call>"
  return draw(st.text(max_size=40)) + _call(draw(st.sampled_from(["search", "echo", "nope"])),
                                            {"query": draw(st.text(max_size=20))})


_FUZZ_ENV = None


def _fuzz_env():
  global _FUZZ_ENV
  if _FUZZ_ENV is None:
    _FUZZ_ENV = NousToolEnv([WikiSearchTool(BM25Index(PASSAGES), top_k=2), EchoTool()],
                            max_tool_response_length=50, parallel_tool_calls=True)
  return _FUZZ_ENV


def _check_result(result):
  observation, successes, active = result
  observation.encode("utf-8")
  assert isinstance(observation, str) and isinstance(active, bool)
  assert all(isinstance(s, bool) for s in successes)
  assert active == bool(successes) == bool(observation)


@settings(max_examples=1000, deadline=None, database=None)
@given(responses())
def test_fuzz_step_never_raises(response):
  _check_result(_fuzz_env().step(response))


@settings(max_examples=250, deadline=None, database=None)
@given(st.lists(responses(), min_size=4, max_size=8))
def test_fuzz_batch_step_never_raises_and_matches_step(batch):
  env = _fuzz_env()
  results = env.batch_step(batch)
  assert len(results) == len(batch)
  for result in results:
    _check_result(result)
  assert results == [env.step(r) for r in batch]
