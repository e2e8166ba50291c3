"""The supervised warm-up's data: which expert episodes a run trains on before RL (warmup/sft.py trains).

  synthetic task   the scripted expert in the task world (no question naming a held-out entity), its one-hop
                   episodes and their naive-RAG form in fresh worlds, its multi-hop episodes in other fresh
                   worlds with the first turn as context, and the copy drill;
  real data        the supporting-facts expert (`data.supporting_facts_expert`) on the train split, searching
                   through the run's own environment; no copy drill (a pretrained model reads already).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ml_collections import config_dict

from agent_r1_jax.data.sft import tokenize_trajectory
from agent_r1_jax.data.supporting_facts_expert import supporting_facts_trajectories
from agent_r1_jax.data.synthetic import expert_trajectories, held_out_entities, sft_examples
from agent_r1_jax.data.synthetic.copy_drill import copy_drill_examples
from agent_r1_jax.data.synthetic.reading import (blended_relation_mix, multi_hop_reading, naive_rag_examples,
                                                 one_hop_trajectories, relation_fact_counts, task_relation_mix)
from agent_r1_jax.warmup import sft as sft_lib


@dataclasses.dataclass
class WarmupData:
  """Tokenized `SFTExample`s per pool (see `sft.run_sft`) and the prompt width P."""
  examples: list
  rag_examples: list
  reading_examples: list
  drill: list
  prompt_length: int


def warmup_data(c: config_dict.ConfigDict, task: Any, stages: Sequence[sft_lib.Stage], *,
                verbose: bool) -> WarmupData:
  """Every pool the warm-up `stages` draw from, for the run's `task` (see the module docstring)."""
  if task.synthetic_files is None:
    if any(stage.is_copy_drill for stage in stages):
      raise ValueError(f"sft.stages={c.sft.stages!r} has a 'copy' stage, which only the synthetic task's "
                       f"from-scratch model needs; drop it for real data")
    examples, rag_examples, reading_examples = real_examples(task, verbose=verbose), [], []
  else:
    examples, rag_examples, reading_examples = synthetic_examples(c, task)
  drill = copy_drill(c, task, sum(s.steps * s.batch_size for s in stages if s.is_copy_drill))
  # Naive-RAG prompts carry passages and are longer than the tool loop's; like evaluate's naive_rag, they
  # may use the context window beyond rollout.max_prompt_length.
  prompt_length = max([c.rollout.max_prompt_length] + [len(e.prompt_ids) for e in rag_examples])
  if rag_examples and prompt_length + c.rollout.max_new_tokens_per_turn > c.rollout.max_context_length:
    raise ValueError(f"a naive-RAG warm-up prompt has {prompt_length} tokens; with one turn it exceeds "
                     f"rollout.max_context_length={c.rollout.max_context_length}. Lower --config.tool.top_k or "
                     f"--config.env.max_tool_response_length, or set --config.sft.rag_questions=0")
  return WarmupData(examples=examples, rag_examples=rag_examples, reading_examples=reading_examples, drill=drill,
                    prompt_length=prompt_length)


def real_examples(task: Any, *, verbose: bool) -> list:
  """Tokenized supporting-facts expert episodes on the train split (searches through the run's own env)."""
  trajectories = supporting_facts_trajectories(list(task.train), task.env)
  if verbose:
    print(f"supervised warm-up: {len(trajectories)} grounded expert episodes from {len(task.train)} train "
          f"questions", flush=True)
  return [tokenize_trajectory(task.tokenizer, task.render(t.question), t.segments, example_id=str(t.question["id"]))
          for t in trajectories]


def synthetic_examples(c: config_dict.ConfigDict, task: Any) -> tuple[list, list, list]:
  """(tool-loop SFT examples, naive-RAG SFT examples, multi-hop reading examples) of the synthetic task."""
  files, tok = task.synthetic_files, task.tokenizer
  held_out = held_out_entities(files)

  def tokenized(trajectories):  # dropping any whose question names an entity of a held-out question
    unseen = [t for t in trajectories if not held_out & set(t.question["question_entities"])]
    return sft_examples(tok, unseen, task.prompt_tool_schemas, instruction=task.instruction)

  trajs = expert_trajectories(files, "train", guess_rate=c.sft.expert_guess_rate, guess_at=c.sft.expert_guess_at,
                              seed=c.seed, env=task.env)
  env_options = practice_env_options(c)
  mix = reading_relation_mix(c, files)
  if c.sft.reading_worlds and c.sft.reading_questions:
    trajs += one_hop_trajectories(files.config, worlds=c.sft.reading_worlds, seed=c.seed,
                                  per_world=c.sft.reading_questions, env_options=env_options, relation_mix=mix)
  examples = tokenized(trajs)
  rag_examples = []
  if c.sft.reading_worlds and c.sft.rag_questions:
    rag_examples = naive_rag_examples(tok, files.config, worlds=c.sft.reading_worlds, seed=c.seed,
                                      per_world=c.sft.rag_questions, env_options=env_options, relation_mix=mix)
  reading = []
  if c.sft.multi_hop_worlds and c.sft.multi_hop_questions:
    reading = multi_hop_reading(files.config, worlds=c.sft.multi_hop_worlds, per_world=c.sft.multi_hop_questions,
                                seed=c.seed, env_options=env_options)
  return examples, rag_examples, tokenized(reading)


def reading_relation_mix(c: config_dict.ConfigDict, files: Any) -> dict[str, float] | None:
  """The relation weights of the fresh-world reading questions (`sft.reading_relations`,
  `sft.reading_uniform_share`); None for a uniform draw over facts. The fresh worlds have the task world's
  size, so the task world's fact counts stand for theirs."""
  if c.sft.reading_relations == "uniform":
    return None
  task_mix = task_relation_mix(files.questions("train"))
  if not c.sft.reading_uniform_share:
    return task_mix
  return blended_relation_mix(task_mix, relation_fact_counts(files.world()), c.sft.reading_uniform_share)


def practice_env_options(c: config_dict.ConfigDict) -> dict:
  """The search env options of the fresh practice worlds (`data.synthetic.reading`): the run's own retrieval
  depth and observation framing, so practice episodes read like the task's."""
  return dict(top_k=c.tool.top_k, max_tool_response_length=c.env.max_tool_response_length,
              assistant_prefix=c.env.assistant_prefix, parallel_tool_calls=c.env.parallel_tool_calls)


def copy_drill(c: config_dict.ConfigDict, task: Any, count: int) -> list:
  """`count` copy-drill examples (`data.synthetic.copy_drill`)."""
  if not count:
    return []
  return copy_drill_examples(task.tokenizer, count, seed=c.seed, tool_schemas=task.prompt_tool_schemas)
