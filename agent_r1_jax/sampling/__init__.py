"""Jitted KV-cache sampling: prefill, decode (`lax.while_loop`), multi-turn continuation."""

from agent_r1_jax.sampling.buckets import rollout_compile_bound
from agent_r1_jax.sampling.params import SamplingParams, StopReason
from agent_r1_jax.sampling.sample import allowed_tokens, sample_tokens
from agent_r1_jax.sampling.programs import compiled_programs
from agent_r1_jax.sampling.sampler import Sampler, SamplerState, Segment, max_logprob_drift

__all__ = ["Sampler", "SamplerState", "SamplingParams", "Segment", "StopReason", "allowed_tokens",
           "compiled_programs", "max_logprob_drift", "rollout_compile_bound", "sample_tokens"]
