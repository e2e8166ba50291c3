"""Naive RAG prompts (the paper's "Naive RAG" baseline): one retrieval with the question, passages in the user turn.

    <|im_start|>user
    Question: What is the birthplace of Kira Voss?
    Passages:
    Doc 1 (Title: "Kira Voss") Kira Voss was born in Tessstead in 1924, ...
    Doc 2 (Title: "Voss Labs") ...
    Use the passages above to answer the question. Think inside <think> and </think> before answering. Give the
    final answer inside <answer> and </answer>.<|im_end|>
    <|im_start|>assistant

The passages are exactly what the agent reads after calling `search(query=question)`: the same tool's
formatted top-k, cut by the env to `max_tool_response_length` characters. The evaluation's `naive_rag` method
and the tiny preset's warm-up (which teaches the from-scratch model this format) both render through here.
"""

from __future__ import annotations

from typing import Any, Sequence

from agent_r1_jax.data import prompts

ANSWER_INSTRUCTION = ("Think inside <think> and </think> before answering. Give the final answer inside "
                      "<answer> and </answer>.")
RAG_INSTRUCTION = "Use the passages above to answer the question. " + ANSWER_INSTRUCTION
SEARCH_TOOL_NAME = "search"


def retrieve_passages(env: Any, questions: Sequence[str]) -> list[str]:
  """One batched search with each question through `env`'s search tool, each result cut like a tool result."""
  tool = getattr(env, "tool_map", {}).get(SEARCH_TOOL_NAME)
  if tool is None:
    raise ValueError(f"naive RAG retrieves with the {SEARCH_TOOL_NAME!r} tool, but the env has "
                     f"{sorted(getattr(env, 'tool_map', {}))}; add 'wiki_search' to --config.tool.tools")
  results = tool.batch_execute([{"query": q} for q in questions])
  return [env.truncate(r.content) for r in results]


def rag_instruction(passages: str) -> str:
  """The user turn's text after `Question: ...`: the passages, then what to do with them."""
  return f"Passages:\n{passages}\n{RAG_INSTRUCTION}"


def render_rag_prompt(tokenizer: Any, question: str, passages: str) -> str:
  """The chat-template prompt of one naive-RAG question (no tools listed; generation header at the end)."""
  return prompts.render_prompt(tokenizer, question, None, instruction=rag_instruction(passages))


def render_closed_book_prompt(tokenizer: Any, question: str) -> str:
  """The question alone, no tools and no passages (the "No Retrieval" baseline)."""
  return prompts.render_prompt(tokenizer, question, None, instruction=ANSWER_INSTRUCTION)
