"""Tool environments: parse the policy's tool calls, run the tools, render observations."""

from agent_r1_jax.envs.base import BaseToolEnv, ParsedCall, StepResult
from agent_r1_jax.envs.nous import NousToolEnv, parse_call

__all__ = ["BaseToolEnv", "NousToolEnv", "ParsedCall", "StepResult", "parse_call"]
