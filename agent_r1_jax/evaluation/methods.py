"""The four rows of the paper's Table 3: how each method prompts the policy and how many turns it gets.

  agent           the trained policy in the multi-turn tool loop, as in training (same prompt, env, limits).
  base_tool_call  the same loop on the base (untrained instruct) model: the paper's "Base Tool Call".
  naive_rag       one retrieval with the question through the same search tool; the formatted passages go
                  into the user message; no tools in the prompt; one turn ("Naive RAG").
  no_retrieval    the question alone, no tools, one turn ("No Retrieval").

The single-turn prompts are rendered by `data.rag` (shared with the tiny preset's warm-up). Every method runs
through `rollout.evaluation.evaluate_examples` (the training rollout engine and the reward registry's scorer).
The single-turn methods use a `NousToolEnv` with no tools, so a tool call the policy still
writes is counted (as a failed call) but retrieves nothing, and `max_turns=1` ends the episode there.

With the paper's reward style the score includes a tool-use format term, which is 0 for single-turn methods
by construction; compare methods by exact match (EM, the Table 3 metric).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from ml_collections import config_dict

from agent_r1_jax import trainer
from agent_r1_jax.data import rag
from agent_r1_jax.rollout import RolloutConfig

_PROMPT_ROUND = 64  # single-turn prompt widths are rounded up to this, so a dataset compiles one prefill shape


@dataclasses.dataclass(frozen=True)
class Method:
  """One evaluation method.

  Attributes:
    name: the CLI name.
    label: the row label of the Table 3 layout.
    tools: the policy sees the tool schemas and plays the multi-turn tool loop.
    retrieve: the question's top-k passages (one search) are put in the user message.
    base_model: rolled out with the base (untrained) model instead of the evaluated policy.
  """
  name: str
  label: str
  tools: bool
  retrieve: bool
  base_model: bool


METHODS: dict[str, Method] = {
    "agent": Method("agent", "Agent (RL)", tools=True, retrieve=False, base_model=False),
    "base_tool_call": Method("base_tool_call", "Base Tool Call", tools=True, retrieve=False, base_model=True),
    "naive_rag": Method("naive_rag", "Naive RAG", tools=False, retrieve=True, base_model=False),
    "no_retrieval": Method("no_retrieval", "No Retrieval", tools=False, retrieve=False, base_model=False),
}
TABLE_ORDER = ("no_retrieval", "naive_rag", "base_tool_call", "agent")


def get_methods(names: Sequence[str]) -> list[Method]:
  """The methods named (order kept); unknown names raise one ValueError listing the valid ones."""
  unknown = [n for n in names if n not in METHODS]
  if unknown:
    raise ValueError(f"unknown method(s) {unknown}; --methods takes any of {list(METHODS)}")
  if len(set(names)) != len(names):
    raise ValueError(f"--methods lists a method twice: {list(names)}")
  return [METHODS[n] for n in names]


def single_turn_env(c: config_dict.ConfigDict):
  """The training env's format with no tools: a call the policy writes anyway becomes an error observation."""
  # Lazy: envs imports bm25s, which starts a JAX backend at import; importing the evaluation starts none.
  from agent_r1_jax.envs import NousToolEnv  # pylint: disable=import-outside-toplevel
  return NousToolEnv([], max_tool_response_length=c.env.max_tool_response_length,
                     parallel_tool_calls=c.env.parallel_tool_calls, assistant_prefix=c.env.assistant_prefix)


def build_renderer(method: Method, task: Any, examples: Sequence[Mapping[str, Any]]
                   ) -> Callable[[Mapping[str, Any]], str]:
  """`example -> rendered prompt` for `method` over `examples` (naive_rag retrieves for all of them once)."""
  if method.tools:
    return task.render
  tok = task.tokenizer
  if not method.retrieve:
    return lambda ex: rag.render_closed_book_prompt(tok, ex["question"])
  passages = dict(zip((str(ex["id"]) for ex in examples),
                      rag.retrieve_passages(task.env, [ex["question"] for ex in examples])))
  return lambda ex: rag.render_rag_prompt(tok, ex["question"], passages[str(ex["id"])])


def rollout_limits(method: Method, c: config_dict.ConfigDict, tokenizer: Any,
                   prompt_texts: Sequence[str]) -> RolloutConfig:
  """The training limits for tool methods; one turn of `max_new_tokens_per_turn` for the others.

  A single-turn prompt (naive_rag carries passages) may be longer than the training prompt width: its width
  is the longest prompt of the dataset rounded up to 64, at most the context window minus one turn.
  """
  train = trainer.rollout_config(c, tokenizer)
  if method.tools:
    return train
  turn = c.rollout.max_new_tokens_per_turn
  window = c.rollout.max_context_length
  longest = max(len(ids) for ids in tokenizer(list(prompt_texts), add_special_tokens=False)["input_ids"])
  width = max(c.rollout.max_prompt_length, -(-longest // _PROMPT_ROUND) * _PROMPT_ROUND)
  if longest + turn > window:
    raise ValueError(f"a {method.name} prompt has {longest} tokens; with one turn of {turn} tokens it exceeds "
                     f"rollout.max_context_length={window}. Lower --config.tool.top_k or "
                     f"--config.env.max_tool_response_length, or raise --config.rollout.max_context_length")
  width = min(width, window - turn)
  return RolloutConfig(max_prompt_length=width, max_response_length=turn, max_turns=1,
                       max_new_tokens_per_turn=turn, max_context_length=width + turn,
                       end_of_text_ids=train.end_of_text_ids)
