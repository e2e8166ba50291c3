"""The agent's prompt: `Question: {q}` plus the answer-format instruction, rendered with the chat template.

As in the paper (Qwen2.5-Instruct), the tool schemas go through the tokenizer's chat template (`tools=`), which
lists them inside `<tools></tools>` in the system turn; the rendered prompt ends with the generation header
`<|im_start|>assistant\\n`. The same function serves the real Qwen2.5 tokenizer and the synthetic one.

A chat template without tool support (SmolLM2-Instruct's: the same `<|im_start|>role\\n...<|im_end|>` framing,
no `tools`) renders the same text with and without `tools=`. Then the system turn itself carries what Qwen2.5's
template would add (`tools_system_block`): its content is

  {system_prompt}\\n\\n# Tools\\n\\n...<tools>\\n{schema 1 as JSON}\\n{schema 2}...\\n</tools>\\n\\n...<tool_call>...</tool_call>

(the `# Tools` block alone when no system prompt is given: the template's own default system message, which
it writes only when the conversation has no system turn, is left out). With a system prompt, a Qwen2.5
tokenizer rendered this way gives exactly what its own template renders, so one code path serves both.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

INSTRUCTION = ("Think inside <think> and </think> before every action. Call the search tool to look up the "
               "facts you need. Give the final answer inside <answer> and </answer>.")


def user_message(question: str, instruction: str = INSTRUCTION) -> str:
  """`Question: {question}` followed by the instruction on the next line."""
  if not isinstance(question, str) or not question.strip():
    raise ValueError(f"question must be a non-empty string, got {question!r}")
  return f"Question: {question.strip()}\n{instruction}" if instruction else f"Question: {question.strip()}"


def build_messages(question: str, *, system_prompt: str | None = None,
                   instruction: str = INSTRUCTION) -> list[dict[str, str]]:
  """Chat messages of a prompt: an optional system message (None = the template's default) and the user turn."""
  messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
  messages.append({"role": "user", "content": user_message(question, instruction)})
  return messages


GENERATION_HEADER = "<|im_start|>assistant\n"


def tools_system_block(tool_schemas: Sequence[dict]) -> str:
  """The `# Tools` section Qwen2.5's chat template appends to the system message (after a blank line): the
  call-format preamble, one JSON schema per line inside `<tools></tools>` (`json.dumps`, non-ASCII kept, as
  the template's `tojson`), and the `<tool_call>` format instruction."""
  schemas = "".join("\n" + json.dumps(schema, ensure_ascii=False) for schema in tool_schemas)
  return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
          "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" + schemas
          + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
          "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
          "<args-json-object>}\n</tool_call>")


def _render(tokenizer: Any, messages: list[dict[str, str]], tools: list[dict] | None) -> str:
  return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def render_prompt(tokenizer: Any, question: str, tool_schemas: Sequence[dict] | None, *,
                  system_prompt: str | None = None, instruction: str = INSTRUCTION) -> str:
  """The prompt text: chat template over the messages and tool schemas, with the generation header.

  When the template ignores `tools=` (renders the same text without them), the `tools_system_block` goes
  into the system turn instead (see the module docstring). Raises ValueError when the template does not end
  the prompt with `<|im_start|>assistant\\n` or drops the system turn that carries the tools.
  """
  messages = build_messages(question, system_prompt=system_prompt, instruction=instruction)
  tools = list(tool_schemas) if tool_schemas else None
  text = _render(tokenizer, messages, tools)
  if tools and text == _render(tokenizer, messages, None):  # the template has no tool support
    block = tools_system_block(tools)
    content = block if system_prompt is None else f"{system_prompt}\n\n{block}"
    text = _render(tokenizer, build_messages(question, system_prompt=content, instruction=instruction), None)
    if f"<|im_start|>system\n{content}<|im_end|>\n" not in text:
      raise ValueError("the tokenizer's chat template ignores tools= and did not render the system turn that "
                       "carries the tool schemas as '<|im_start|>system\\n...<|im_end|>\\n'; use a chat template "
                       "with tool support or with the <|im_start|>role\\n...<|im_end|> framing")
  if not text.endswith(GENERATION_HEADER):
    raise ValueError("the tokenizer's chat template did not end the prompt with '<|im_start|>assistant\\n' "
                     f"(it ends with {text[-40:]!r}); use a chat template with the Qwen2.5 / ChatML framing "
                     "(<|im_start|>role\\n...<|im_end|>) and add_generation_prompt support")
  return text


def encode_prompt(tokenizer: Any, prompt_text: str) -> list[int]:
  """Prompt ids exactly as the rollout driver tokenizes a rendered prompt (no added BOS/EOS)."""
  return list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])


def search_tool_schema() -> dict[str, Any]:
  """The schema `WikiSearchTool` exposes (`search(query)`), without building a retriever behind it."""
  # Lazy: tools imports bm25s, which starts a JAX backend at import; trainer.config imports this module.
  from agent_r1_jax.tools import WikiSearchTool  # pylint: disable=import-outside-toplevel
  return {"type": "function", "function": {"name": WikiSearchTool.name, "description": WikiSearchTool.description,
                                           "parameters": WikiSearchTool.parameters}}
