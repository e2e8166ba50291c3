"""Prompts for chat templates without tool support (SmolLM2-Instruct) and the env's framing in their vocabulary.

`render_prompt` puts Qwen2.5's `# Tools` block into the system turn when the template ignores `tools=`. The
expected prompts are written out here from the schema below (not built by the code under test); Qwen2.5's own
template (read from the shared tokenizer config) checks that both paths give the same text. The SmolLM2 tests
use the real tokenizer read from the shared GGUF; everything is skipped with the reason when that is absent.
"""

from __future__ import annotations

import json

import pytest

from agent_r1_jax.data import prompts
from agent_r1_jax.envs import NousToolEnv
from scripted_policy import byte_tokenizer
from agent_r1_jax.tools import BaseTool, ToolResult

SCHEMA = {"type": "function",
          "function": {"name": "search", "description": "Search Wikipédia; returns the top passages.",
                       "parameters": {"type": "object",
                                      "properties": {"query": {"type": "string", "description": "What to look up."}},
                                      "required": ["query"]}}}
# The schema's line inside <tools></tools>: Qwen2.5's `tojson` (", " / ": " separators, non-ASCII kept).
SCHEMA_LINE = ('{"type": "function", "function": {"name": "search", "description": "Search Wikipédia; returns the '
               'top passages.", "parameters": {"type": "object", "properties": {"query": {"type": "string", '
               '"description": "What to look up."}}, "required": ["query"]}}}')
QUESTION = "Who wrote Hamlet?"
INSTRUCTION = "Answer inside <answer> and </answer>."
TOOLS_BLOCK = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" + SCHEMA_LINE
               + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
               "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>")
TAIL = ("<|im_end|>\n<|im_start|>user\nQuestion: Who wrote Hamlet?\nAnswer inside <answer> and </answer>.<|im_end|>\n"
        "<|im_start|>assistant\n")
SMOLLM2_TOOLS = "<|im_start|>system\n" + TOOLS_BLOCK + TAIL
SMOLLM2_TOOLS_SYSTEM = "<|im_start|>system\nYou are a careful researcher.\n\n" + TOOLS_BLOCK + TAIL
SMOLLM2_NO_TOOLS = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    + TAIL)

# A ChatML template without tool support (SmolLM2-Instruct's, as its GGUF carries it).
CHATML_NO_TOOLS = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' "
    "+ message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


def render(tok, tools=(SCHEMA,), system_prompt=None):
  return prompts.render_prompt(tok, QUESTION, list(tools) or None, system_prompt=system_prompt,
                               instruction=INSTRUCTION)


def test_expected_schema_line_is_the_schema():
  assert json.loads(SCHEMA_LINE) == SCHEMA


def test_smollm2_prompt_with_tools_is_the_golden_text(smollm2_tokenizer):
  """Defects caught: schemas silently dropped (SmolLM2's template ignores tools=), a block that differs from
  Qwen2.5's wording or JSON form, SmolLM2's default system message kept beside the tools, a system prompt
  dropped or not separated by a blank line."""
  tok = smollm2_tokenizer
  assert "tools" not in tok.chat_template
  assert render(tok) == SMOLLM2_TOOLS
  assert render(tok, system_prompt="You are a careful researcher.") == SMOLLM2_TOOLS_SYSTEM
  assert render(tok, tools=()) == SMOLLM2_NO_TOOLS  # no tools: the template's own rendering, untouched
  ids = prompts.encode_prompt(tok, SMOLLM2_TOOLS)
  assert ids[:2] == tok.encode("<|im_start|>system", add_special_tokens=False) and ids[0] == 1
  header = [1, *tok.encode("assistant\n", add_special_tokens=False)]
  assert ids[-len(header):] == header


def test_no_tool_template_gives_qwen_templates_text(shared_data):
  """One code path: a no-tool ChatML template rendered with the tools block equals Qwen2.5's own template
  rendering `tools=` (given a system prompt; without one Qwen2.5 writes its own default message)."""
  config = shared_data / "qwen2.5_tokenizer" / "tokenizer_config.json"
  if not config.is_file():
    pytest.skip(f"Qwen2.5 tokenizer config not found at {config}")
  qwen, plain = byte_tokenizer(), byte_tokenizer()
  qwen.chat_template = json.loads(config.read_text())["chat_template"]
  plain.chat_template = CHATML_NO_TOOLS
  system = "You are a careful researcher."
  assert render(qwen, system_prompt=system) == render(plain, system_prompt=system) == SMOLLM2_TOOLS_SYSTEM
  assert render(qwen, (SCHEMA, SCHEMA)).count(SCHEMA_LINE) == render(plain, (SCHEMA, SCHEMA)).count(SCHEMA_LINE) == 2
  assert render(plain) == SMOLLM2_TOOLS


def test_templates_the_rollout_cannot_use_raise():
  """A prompt that does not end with the generation header, and a no-tool template that drops system turns
  (the tools would be lost), each raise one error saying what to change."""
  tok = byte_tokenizer()
  tok.chat_template = CHATML_NO_TOOLS.replace("'<|im_start|>assistant\n'", "'<|im_start|>model\n'")
  with pytest.raises(ValueError, match=r"did not end the prompt with '<\|im_start\|>assistant\\n'"):
    render(tok)
  tok.chat_template = ("{% for m in messages if m['role'] != 'system' %}{{ '<|im_start|>' + m['role'] + '\n' + "
                       "m['content'] + '<|im_end|>\n' }}{% endfor %}{{ '<|im_start|>assistant\n' }}")
  with pytest.raises(ValueError, match="ignores tools= and did not render the system turn"):
    render(tok)


class SearchTool(BaseTool):
  name = "search"
  description = "Search."
  parameters = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}

  def execute(self, args):
    return ToolResult(f"Hamlet is a tragedy by William Shakespeare. ({args['query']})", True)


def test_env_turn_and_observation_in_smollm2_tokens(smollm2_tokenizer):
  """The env parses SmolLM2's multi-token `<tool_call>` from the decoded turn, and its observation (framed as
  Qwen2.5 renders tool messages) keeps the turn framing as single ids with no token merging across the
  boundaries: prompt + turn + observation encode to the concatenation of their encodings."""
  tok = smollm2_tokenizer
  env = NousToolEnv([SearchTool()])
  turn_text = "<think>\nI should search.\n</think>\n" + NousToolEnv.render_call("search", {"query": "Hamlet author"})
  turn = tok.encode(turn_text, add_special_tokens=False)
  assert tok.decode(turn, skip_special_tokens=False) == turn_text
  [(observation, successes, active)] = env.batch_step([tok.decode(turn, skip_special_tokens=False)])
  assert successes == [True] and active
  assert observation == ("<|im_end|>\n<|im_start|>user\n<tool_response>\nHamlet is a tragedy by William Shakespeare. "
                         "(Hamlet author)\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
  obs = tok.encode(observation, add_special_tokens=False)
  nl, user, assistant = (tok.encode(t, add_special_tokens=False) for t in ("\n", "user\n", "assistant\n"))
  head, tail = [2, *nl, 1, *user], [2, *nl, 1, *assistant]  # <|im_end|>\n<|im_start|>user\n ... assistant\n
  assert obs[:len(head)] == head and obs[-len(tail):] == tail
  assert obs.count(1) == 2 and obs.count(2) == 2
  prompt = prompts.encode_prompt(tok, SMOLLM2_TOOLS)
  whole = tok.encode(SMOLLM2_TOOLS + turn_text + observation, add_special_tokens=False)
  assert whole == prompt + turn + obs
