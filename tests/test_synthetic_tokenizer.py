"""The synthetic world's BPE tokenizer: exact round trips, single-id control tokens, a Qwen2.5 chat template."""

from __future__ import annotations

import json

import pytest
import transformers

from agent_r1_jax.data.synthetic import (SPECIAL_TOKENS, TAG_TOKENS, expert_trajectories, make_search_env)
from agent_r1_jax.data.synthetic.tokenizer import DEFAULT_SYSTEM_PROMPT, render_chat
from agent_r1_jax.retrieval import load_corpus


@pytest.fixture(scope="module")
def world_files(synthetic_world):
  return synthetic_world(num_train=300, num_validation=50, num_test=50)


@pytest.fixture(scope="module")
def tokenizer(world_files):
  return transformers.AutoTokenizer.from_pretrained(str(world_files.tokenizer_dir))


def test_directory_is_a_standard_hf_tokenizer(world_files, tokenizer):
  config = json.loads((world_files.tokenizer_dir / "tokenizer_config.json").read_text())
  assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
  assert "<tools>" in config["chat_template"]
  assert 1000 <= len(tokenizer) <= 4096
  assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
  assert tokenizer("Paris", add_special_tokens=True)["input_ids"] == tokenizer("Paris", add_special_tokens=False)[
      "input_ids"]  # no BOS/EOS added


def test_control_tokens_are_single_ids(tokenizer):
  ids = set()
  for token in SPECIAL_TOKENS + TAG_TOKENS:
    encoded = tokenizer.encode(token, add_special_tokens=False)
    assert len(encoded) == 1, token
    assert tokenizer.convert_ids_to_tokens(encoded[0]) == token
    in_context = tokenizer.encode(f"x{token}y\n", add_special_tokens=False)
    assert encoded[0] in in_context
    ids.add(encoded[0])
  assert len(ids) == len(SPECIAL_TOKENS) + len(TAG_TOKENS)
  # Tags are plain added tokens (like <tool_call> in Qwen2.5): they survive skip_special_tokens.
  text = "<think>a</think><|im_end|>"
  assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=True) == \
      "<think>a</think>"


def test_round_trips_corpus_and_trajectories(world_files, tokenizer):
  texts = [p.contents for p in load_corpus(str(world_files.corpus_path))]
  trajectories = expert_trajectories(world_files, "test", env=make_search_env(world_files), guess_rate=0.3)
  texts += [t.response_text for t in trajectories]
  texts += ["Unseen: Zürich — 東京 🚀 \t tabs\n\nand  double  spaces"]  # byte-level: nothing is unknown
  encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
  for text, ids in zip(texts, encoded):
    assert tokenizer.decode(ids) == text


def test_chat_template_renders_like_qwen(tokenizer, qwen_tokenizer_dir):
  qwen = transformers.AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))
  tools = [{"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
      "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
  conversation = [
      {"role": "system", "content": "You are a helpful assistant."},
      {"role": "user", "content": "Question: Who directed The Crimson Harbor?"},
      {"role": "assistant", "content": "<think>search</think>", "tool_calls": [
          {"type": "function", "function": {"name": "search", "arguments": {"query": "The Crimson Harbor"}}}]},
      {"role": "tool", "content": "Doc 1 (Title: \"The Crimson Harbor\") A film."},
      {"role": "assistant", "content": "<think>found</think>\n<answer>Arlen Voss</answer>"},
  ]
  for messages, tool_list, gen in [(conversation, tools, False), (conversation[:4], tools, True),
                                   (conversation[:2], None, True), (conversation, None, False)]:
    ours = tokenizer.apply_chat_template(messages, tools=tool_list, tokenize=False, add_generation_prompt=gen)
    theirs = qwen.apply_chat_template(messages, tools=tool_list, tokenize=False, add_generation_prompt=gen)
    assert ours == theirs
    assert render_chat(messages, tools=tool_list, add_generation_prompt=gen) == ours
  # Without a system message only the default text differs.
  ours = tokenizer.apply_chat_template(conversation[1:2], tools=tools, tokenize=False)
  assert ours.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}\n\n# Tools")
