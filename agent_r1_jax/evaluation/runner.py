"""Runs methods x datasets for a policy: greedy, through the training rollout engine (`rollout.engine`) and scorer.

`evaluate_methods` is the library entry point (the CLI in `agent_r1_jax.evaluate` builds its arguments);
`build_policies` turns a workdir / HF directory into the evaluated policy and its base.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
from ml_collections import config_dict

from agent_r1_jax import workdir as workdir_lib
from agent_r1_jax.evaluation import methods as methods_lib
from agent_r1_jax.evaluation.policy import Policy, SamplerCache, checkpoint_steps, hf_policy, workdir_policy
from agent_r1_jax.rollout import evaluation
from agent_r1_jax.sampling import SamplingParams
from agent_r1_jax.sizing import rollout_sizing


@dataclasses.dataclass
class EvaluationResult:
  """Summaries and records per method and dataset (insertion order = the order asked for)."""
  summaries: dict[str, dict[str, dict[str, float]]]
  records: dict[str, dict[str, list[evaluation.EpisodeRecord]]]


def evaluate_methods(task: Any, c: config_dict.ConfigDict, policy: Policy, base_policy: Policy | None,
                     method_names: Sequence[str], datasets: Mapping[str, Sequence[Mapping[str, Any]]], *,
                     num_examples: int | None, batch_size: int, seed: int = 0,
                     sampling: SamplingParams | None = None) -> EvaluationResult:
  """Every method on the first `num_examples` examples of every dataset.

  Args:
    task: the `trainer.Task` (tokenizer, env, render).
    c: the run's config (rollout limits and engine, env options, reward style).
    policy: the evaluated policy (agent, naive_rag, no_retrieval).
    base_policy: the untrained model of base_tool_call (required when that method is asked for).
    method_names: names in `methods.METHODS`.
    datasets: dataset name -> examples.
    num_examples: examples per dataset (None = all).
    batch_size: prompts per rollout (the slot engine: sizes its slots, `rollout_sizing.slot_engine_options`).
    seed: the PRNG seed (only used by non-greedy sampling).
    sampling: default greedy.

  Returns:
    The summaries (see `rollout.evaluation.summarize`) and the scored records.
  """
  chosen = methods_lib.get_methods(method_names)
  if any(m.base_model for m in chosen) and base_policy is None:
    raise ValueError("base_tool_call needs a base model: pass --base_hf_checkpoint (or evaluate a workdir, whose "
                     "base is its model.path or its step-0 checkpoint)")
  if batch_size < 1:
    raise ValueError(f"--batch_size must be positive, got {batch_size}")
  sampling = sampling or SamplingParams(greedy=True)
  single_env = methods_lib.single_turn_env(c)
  # `rollout.engine`: the slot engine with slots for `batch_size` prompts, or the lockstep driver (None).
  slot_options = rollout_sizing.evaluation_slot_options(c, jax.device_count(), jax.process_count(), batch_size)
  summaries: dict[str, dict[str, dict[str, float]]] = {}
  records: dict[str, dict[str, list[evaluation.EpisodeRecord]]] = {}
  for mi, method in enumerate(chosen):
    model = base_policy if method.base_model else policy
    env = task.env if method.tools else single_env
    summaries[method.name], records[method.name] = {}, {}
    for di, (name, examples) in enumerate(datasets.items()):
      n = len(examples) if num_examples is None else min(num_examples, len(examples))
      subset = [examples[i] for i in range(n)]
      if not subset:
        raise ValueError(f"dataset {name!r} has no examples")
      render = methods_lib.build_renderer(method, task, subset)
      limits = methods_lib.rollout_limits(method, c, task.tokenizer, [render(ex) for ex in subset])
      recs = evaluation.evaluate_examples(
          model.make_sampler(limits), model.params, env, task.tokenizer, render, subset, limits, sampling,
          jax.random.fold_in(jax.random.key(seed), mi * 1000 + di), batch_size=batch_size,
          reward_style=c.algorithm.reward_style, slot_options=slot_options)
      summaries[method.name][name] = evaluation.summarize(recs)
      records[method.name][name] = recs
  return EvaluationResult(summaries=summaries, records=records)


def build_policies(c: config_dict.ConfigDict, tokenizer: Any, mesh: Any, *, workdir: str | None,
                   hf_checkpoint: str | None, base_hf_checkpoint: str | None, step: int | None,
                   need_base: bool) -> tuple[Policy, Policy | None]:
  """The evaluated policy and (if `need_base`) the base model of base_tool_call.

  Base model: `base_hf_checkpoint` if given; for a workdir, the run's `model.path` (the checkpoint it started
  from) or else its step-0 checkpoint (the tiny preset's warm-up policy before RL); for an HF directory, that
  same directory (the untrained instruct model being evaluated).
  """
  if bool(workdir) == bool(hf_checkpoint):
    raise ValueError("give exactly one of --workdir (a training run) or --hf_checkpoint (a Hugging Face directory)")
  samplers = SamplerCache(c, tokenizer, mesh)
  if workdir:
    policy = workdir_policy(workdir, c, tokenizer, mesh, samplers, step)
  else:
    policy = hf_policy(hf_checkpoint, c, tokenizer, mesh, samplers)
  if not need_base:
    return policy, None
  if base_hf_checkpoint:
    return policy, hf_policy(base_hf_checkpoint, c, tokenizer, mesh, samplers)
  if hf_checkpoint:
    return policy, policy
  if c.model.path:
    return policy, hf_policy(c.model.path, c, tokenizer, mesh, samplers)
  steps = checkpoint_steps(workdir)
  if 0 not in steps:
    raise ValueError(f"{workdir_lib.workdir_path(workdir)} has no step-0 checkpoint (the policy before RL) and its config has no "
                     f"model.path; pass --base_hf_checkpoint for base_tool_call, or leave that method out")
  return policy, workdir_policy(workdir, c, tokenizer, mesh, samplers, 0)
