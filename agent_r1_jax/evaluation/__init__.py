"""Evaluation against the paper's baselines: methods, policy loading, the runner and the report writers.

The rollouts and scores themselves come from `agent_r1_jax.rollout.evaluation` (the training rollout
engine and scorer); this package adds what Table 3 needs around them. The CLI is `python -m agent_r1_jax.evaluate`.
"""

from agent_r1_jax.evaluation.datasets import available_datasets, select_datasets
from agent_r1_jax.evaluation.methods import METHODS, Method, get_methods
from agent_r1_jax.evaluation.policy import (Policy, SamplerCache, hf_policy, read_workdir_config, restore_actor,
                                            workdir_policy)
from agent_r1_jax.evaluation.report import table3, write_outputs
from agent_r1_jax.evaluation.runner import EvaluationResult, build_policies, evaluate_methods

__all__ = ["METHODS", "EvaluationResult", "Method", "Policy", "SamplerCache", "available_datasets",
           "build_policies", "evaluate_methods", "get_methods", "hf_policy", "read_workdir_config",
           "restore_actor", "select_datasets", "table3", "workdir_policy", "write_outputs"]
