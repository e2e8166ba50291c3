"""The synthetic multi-hop world: the offline default task (generator, expert, tokenizer, cached artefacts)."""

from agent_r1_jax.data.synthetic.builder import (DEFAULT_TOP_K, TFDS_NAME, SyntheticWorldFiles, expert_trajectories,
                                                 guess_pools, held_out_entities, make_search_env,
                                                 prepare_synthetic_world, sft_examples)
from agent_r1_jax.data.synthetic.expert import ScriptedExpert, Trajectory
from agent_r1_jax.data.synthetic.tokenizer import CHAT_TEMPLATE, TAG_TOKENS, SPECIAL_TOKENS, train_tokenizer
from agent_r1_jax.data.synthetic.world import (DATA_SOURCE, SPLITS, World, WorldConfig, generate_world)

__all__ = ["CHAT_TEMPLATE", "DATA_SOURCE", "DEFAULT_TOP_K", "SPECIAL_TOKENS", "SPLITS", "ScriptedExpert",
           "SyntheticWorldFiles", "TAG_TOKENS", "TFDS_NAME", "Trajectory", "World", "WorldConfig",
           "expert_trajectories", "generate_world", "guess_pools", "held_out_entities", "make_search_env",
           "prepare_synthetic_world", "sft_examples", "train_tokenizer"]
