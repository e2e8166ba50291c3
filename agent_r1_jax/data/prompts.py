"""The agent's prompt: `Question: {q}` plus the answer-format instruction, rendered with the chat template.

As in the paper (Qwen2.5-Instruct), the tool schemas go through the tokenizer's chat template (`tools=`), which
lists them inside `<tools></tools>` in the system turn; the rendered prompt ends with the generation header
`<|im_start|>assistant\\n`. The same function serves the real Qwen2.5 tokenizer and the synthetic one.
"""

from __future__ import annotations

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


def render_prompt(tokenizer: Any, question: str, tool_schemas: Sequence[dict] | None, *,
                  system_prompt: str | None = None, instruction: str = INSTRUCTION) -> str:
  """The prompt text: chat template over the messages and tool schemas, with the generation header."""
  text = tokenizer.apply_chat_template(build_messages(question, system_prompt=system_prompt,
                                                      instruction=instruction),
                                       tools=list(tool_schemas) if tool_schemas else None, tokenize=False,
                                       add_generation_prompt=True)
  if not text.endswith("<|im_start|>assistant\n"):
    raise ValueError("the tokenizer's chat template did not end the prompt with '<|im_start|>assistant\\n'; "
                     "use a Qwen2.5-style tokenizer (chat template with tool support)")
  return text


def encode_prompt(tokenizer: Any, prompt_text: str) -> list[int]:
  """Prompt ids exactly as the rollout driver tokenizes a rendered prompt (no added BOS/EOS)."""
  return list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])


def search_tool_schema() -> dict[str, Any]:
  """The schema `WikiSearchTool` exposes (`search(query)`), without building a retriever behind it."""
  from agent_r1_jax.tools import WikiSearchTool  # pylint: disable=import-outside-toplevel
  return {"type": "function", "function": {"name": WikiSearchTool.name, "description": WikiSearchTool.description,
                                           "parameters": WikiSearchTool.parameters}}
