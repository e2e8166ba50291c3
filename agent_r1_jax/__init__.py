"""agent_r1_jax: end-to-end RL for tool-using LLM agents in JAX (after Agent-R1, arXiv:2511.14460)."""

__version__ = "0.1.0"
